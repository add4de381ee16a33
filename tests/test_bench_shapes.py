"""Every workload traced at every size the bench defines, shapes only: nothing is allocated.

The GPU sizes cannot run on a CPU (tables of 1 GiB and more), but each system's program
can be traced there: the JAX systems with ``jax.eval_shape`` on ``jax.ShapeDtypeStruct``
stand-ins, torch's forms on its ``meta`` device (tensors with a shape and no storage). A
mistake that only one size shows (M3's weights took the data's width at GPU sizes, not
the gather's) fails here, on a CPU, before a GPU run meets it. The expected shapes are the
specs' rules, written out below, not taken from bench/.
"""

from __future__ import annotations

import numpy as np
import pytest

from xgather_bench import steps, systems
from xgather_bench.workloads import SIZES, WORKLOADS

CASES = [(key, size) for key in WORKLOADS for size in SIZES]


def _gather_shape(w, dshape, ishape):
    """The gather's output shape by its spec (for ``grad``, of the forward Gather)."""
    a = w.axis % len(dshape)
    if w.op in ("onnx.gather", "grad"):  # ONNX Gather
        return dshape[:a] + ishape + dshape[a + 1:]
    if w.op == "openvino.gather7":  # OpenVINO Gather-7
        return dshape[:a] + ishape[w.batch_dims:] + dshape[a + 1:]
    if w.op == "onnx.gather_nd":  # ONNX GatherND
        return ishape[:-1] + dshape[w.batch_dims + ishape[-1]:]
    assert w.op == "onnx.gather_elements"
    return ishape


def _expected(w, dshape, ishape):
    """The shapes a system returns: the gather's, the gradient's, or the model step's."""
    g = _gather_shape(w, dshape, ishape)
    if w.op == "grad":
        return [dshape]
    if w.step is None:
        return [g]
    if w.step == "dense":  # sum(relu(g @ W)): a scalar
        return [()]
    if w.step == "dense_grad":  # the gradients in the table and in W, W square in g's width
        return [dshape, (g[-1], g[-1])]
    return [g[:-1] + (steps.PROJECTION,)]  # softmax or standardize, then @ W


def test_every_workload_has_every_size():
    assert {key: set(w.sizes) for key, w in WORKLOADS.items()} == {
        key: set(SIZES) for key in WORKLOADS}
    assert {"quick", "default", "large", "gpu"} <= set(SIZES)  # CPU and GPU sizes


def _jax_programs(w):
    """``{system: f}``: the programs ``systems.build`` runs for xgather, lax and jnp.take, as
    functions of ``(data, indices, *weights)``. The default runs under ``xgather.checked``,
    which cannot be traced inside ``jax.eval_shape``: its checkify (user checks) stands in."""
    from jax.experimental import checkify
    default = systems._xgather_fn(w, None)
    if systems.checks(w, None):
        checked = checkify.checkify(default, errors=checkify.user_checks)

        def default(*args, checked=checked):
            return checked(*args)[1]
    promise = systems._xgather_fn(w, "promise_in_bounds", negative_indices=False)
    return {"xgather": default, "xgather[promise]": promise, "lax": systems.lax_fn(w),
            systems.JNP: systems.jnp_fn(w)}


def _shapes(out):
    return [tuple(x.shape) for x in (out if isinstance(out, tuple | list) else (out,))]


@pytest.mark.parametrize(("key", "size"), CASES)
def test_the_jax_systems_trace_at_every_size(key, size):
    import jax
    w = WORKLOADS[key]
    dshape, ishape = w.shapes(size)
    # JAX reads the int64 indices as int32 where x64 is off (systems.jax_inputs)
    index_dtype = jax.dtypes.canonicalize_dtype(np.int64)
    args = [jax.ShapeDtypeStruct(dshape, w.np_dtype()),
            jax.ShapeDtypeStruct(ishape, index_dtype)]
    if w.step is not None:
        args.append(jax.ShapeDtypeStruct(steps.weight_shape(w, dshape, ishape), np.float32))
    want = _expected(w, dshape, ishape)
    for name, f in _jax_programs(w).items():
        assert _shapes(jax.eval_shape(f, *args)) == want, name


@pytest.mark.parametrize(("key", "size"), CASES)
def test_the_torch_forms_run_on_the_meta_device_at_every_size(key, size):
    """torch's host and CUDA forms (the same code on another device), on tensors without
    storage: the shapes of a GPU run, checked without a GPU."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    w = WORKLOADS[key]
    dshape, ishape = w.shapes(size)
    dtype = torch.bfloat16 if w.dtype == "bfloat16" else torch.float32
    d = torch.empty(dshape, dtype=dtype, device="meta")
    i = torch.empty(ishape, dtype=torch.int64, device="meta")
    want = _expected(w, dshape, ishape)
    if w.step is not None:
        wt = torch.empty(steps.weight_shape(w, dshape, ishape), device="meta")
        assert _shapes(systems.torch_step_fn(w, d, i, wt)()) == want
        return
    forms = {"plain": systems.torch_gather_fn(w, d, i),
             "embedding": systems.torch_gather_fn(w, d, i, embedding=True)}
    assert forms["plain"] is not None
    for name, fn in forms.items():
        if fn is not None:
            assert _shapes(fn()) == want, name
