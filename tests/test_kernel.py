"""The Pallas row-gather kernel (``xgather.gather_kernel``): run by Pallas's interpreter
against the NumPy references, in every mode, with gradients and vmap; lowered to
Triton for CUDA on this CPU (the GPU compiles that module; the bench times it)."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import xgather
from tests import reference as ref
from tests.helpers import assert_same, rerun_with_x64
from xgather import _kernel

RNG = np.random.default_rng(7)
#: On a GPU the tests run the Triton kernel itself; elsewhere Pallas's interpreter.
KERNEL = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"


def _data(shape, dtype=np.float32):
    return (RNG.standard_normal(shape) * 50).astype(dtype)


def _idx(shape, s, lo=None, hi=None):
    return RNG.integers(-s if lo is None else lo, s if hi is None else hi, shape)


def _pallas_calls(f, *args) -> int:
    """How many Pallas calls ``f`` traces to (its checks functionalised)."""
    checked = checkify.checkify(f, errors=checkify.user_checks)
    return str(jax.make_jaxpr(checked)(*args)).count("pallas_call[")


# (id, op(d, i, **mode kwargs), reference(d, i, **ref kwargs), data shape, indices,
#  index components: tuples in the last axis of the indices)
CASES = [
    ("onnx-gather-axis0", lambda d, i, **kw: xgather.onnx.gather(d, i, 0, **kw),
     functools.partial(ref.gather, axis=0), (30, 40), (5, 3), False),
    ("onnx-gather-axis1", lambda d, i, **kw: xgather.onnx.gather(d, i, 1, **kw),
     functools.partial(ref.gather, axis=1), (3, 20, 2, 33), (7,), False),
    ("onnx-gather-nd-k1", lambda d, i, **kw: xgather.onnx.gather_nd(d, i, **kw),
     ref.gather_nd, (12, 64), (9, 1), True),
    ("onnx-gather-nd-k2", lambda d, i, **kw: xgather.onnx.gather_nd(d, i, **kw),
     ref.gather_nd, (6, 5, 48), (4, 3, 2), True),
    ("onnx-gather-nd-b1", lambda d, i, **kw: xgather.onnx.gather_nd(d, i, 1, **kw),
     functools.partial(ref.gather_nd, batch_dims=1), (3, 7, 40), (3, 6, 1), True),
    ("openvino-gather7-b1-axis1",
     lambda d, i, **kw: xgather.openvino.gather(d, i, 1, 1, version=7, **kw),
     functools.partial(ref.gather, axis=1, batch_dims=1), (3, 11, 36), (3, 5), False),
    ("openvino-gather8-b1-axis2",
     lambda d, i, **kw: xgather.openvino.gather(d, i, 2, 1, **kw),
     functools.partial(ref.gather, axis=2, batch_dims=1), (2, 3, 9, 40), (2, 4), False),
    ("openvino-gather-nd5-b2",
     lambda d, i, **kw: xgather.openvino.gather_nd(d, i, 2, version=5, **kw),
     functools.partial(ref.gather_nd, batch_dims=2), (2, 3, 4, 40), (2, 3, 5, 1), True),
]


def _fold(case_id, want):
    """OpenVINO GatherND-5 folds its batch dims into one."""
    return want.reshape((-1,) + want.shape[2:]) if case_id == "openvino-gather-nd5-b2" else want


def _indices(case, lo_pad=0, hi_pad=0):
    cid, _, _, shape, ishape, tuples = case
    axes = _axes(case)
    if tuples:
        cols = [_idx(ishape[:-1], shape[a], -shape[a] - lo_pad, shape[a] + hi_pad) for a in axes]
        return np.stack(cols, -1)
    a = axes[0]
    return _idx(ishape, shape[a], -shape[a] - lo_pad, shape[a] + hi_pad)


def _axes(case):
    cid, *_ , shape, ishape, tuples = case
    if tuples:
        b = 2 if "-b2" in cid else 1 if "-b1" in cid else 0
        return list(range(b, b + ishape[-1]))
    return [{"onnx-gather-axis0": 0, "onnx-gather-axis1": 1, "openvino-gather7-b1-axis1": 1,
             "openvino-gather8-b1-axis2": 2}[cid]]


# Promise mode reads what the default does once checked: two cases suffice.
MODE_CASES = [(m, c) for m in ("default", "clip", "fill") for c in CASES] + \
    [("promise_in_bounds", c) for c in (CASES[1], CASES[3])]


@pytest.mark.parametrize("mode, case", MODE_CASES, ids=[f"{m}-{c[0]}" for m, c in MODE_CASES])
def test_kernel_matches_reference(case, mode):
    cid, op, reference, shape, ishape, tuples = case
    data = _data(shape)
    if mode == "default":
        idx, kw, rkw = _indices(case), {}, {}
    elif mode == "promise_in_bounds":
        idx = _indices(case)
        idx = np.where(idx < 0, idx + np.asarray([shape[a] for a in _axes(case)])
                       if tuples else idx + shape[_axes(case)[0]], idx)
        kw, rkw = {"mode": mode}, {}
    else:
        idx = _indices(case, lo_pad=3, hi_pad=3)
        kw = {"mode": mode} | ({"fill_value": -7.5} if mode == "fill" else {})
        rkw = {"oob": mode} | ({"fill": -7.5} if mode == "fill" else {})
    want = _fold(cid, reference(data, idx, **rkw))
    f = functools.partial(op, **kw)
    with xgather.gather_kernel(KERNEL):
        assert _pallas_calls(f, data, idx) == 1, "the kernel did not run"
        assert_same(f(data, idx), want)  # eager (under "error": host check, then gather)
        if mode == "default":  # traced indices: the flagged program
            assert_same(xgather.checked(jax.jit(f))(data, idx), want)


@pytest.mark.parametrize("case", CASES[1:4:2], ids=[c[0] for c in CASES[1:4:2]])
def test_kernel_out_of_range_is_the_same_error(case):
    cid, op, _, shape, ishape, tuples = case
    data, idx = _data(shape), _indices(case)
    a = _axes(case)[0]
    if tuples:
        idx[(0,) * (idx.ndim - 1) + (0,)] = shape[a] + 2
    else:
        idx.reshape(-1)[1] = shape[a] + 2
    where = "0, 0, 0" if tuples else "1"  # the one bad index: the spec's message names it
    name = "onnx.GatherND-13" if tuples else "onnx.Gather-13"
    want = (f"{name}: index {shape[a] + 2} at indices[{where}] is out of range "
            f"[-{shape[a]}, {shape[a] - 1}] for data axis {a} of size {shape[a]} "
            "(1 out-of-range value(s) in indices)")
    for kind in ("xla", KERNEL):  # traced indices: the device flags, the report names
        with xgather.gather_kernel(kind), pytest.raises(xgather.OutOfBoundsError) as error:
            xgather.checked(jax.jit(op))(data, idx)
        assert str(error.value) == want, kind


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_gradient_is_the_scatter_add(case):
    cid, op, reference, shape, ishape, tuples = case
    data, idx = _data(shape), _indices(case)
    out = _fold(cid, reference(data, idx))
    cot = _data(out.shape)
    want = ref.vjp_data(lambda d, *a, **k: _fold(cid, reference(d, *a, **k)), shape, cot, idx)
    with xgather.gather_kernel(KERNEL):
        _, vjp = jax.vjp(lambda d: op(d, jnp.asarray(idx)), data)
        got = vjp(jnp.asarray(cot))[0]
        grad_jaxpr = str(jax.make_jaxpr(vjp)(jnp.asarray(cot)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert "scatter-add" in grad_jaxpr and "pallas_call" not in grad_jaxpr


def test_kernel_forward_mode_vmap_and_sorted_scatter():
    data, idx = _data((20, 40)), _idx((6,), 20)
    t = _data((20, 40))
    with xgather.gather_kernel(KERNEL):
        f = lambda d: xgather.onnx.gather(d, jnp.asarray(idx), 0)  # noqa: E731
        out, tangent = jax.jvp(f, (data,), (t,))
        assert_same(out, ref.gather(data, idx))
        np.testing.assert_allclose(tangent, ref.gather(t, idx), rtol=1e-6)
        stacked = np.stack([data, -data])
        istack = np.stack([idx, idx[::-1]])
        got = xgather.checked(jax.vmap(lambda d, i: xgather.onnx.gather(d, i, 0)))(stacked, istack)
        assert_same(got[1], ref.gather(-data, idx[::-1]))
        with xgather.grad_scatter("sorted"):
            g = jax.grad(lambda d: (f(d) ** 2).sum())(data)
    want = ref.scatter_add_take(data.shape, idx, 2 * ref.gather(data, idx))
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-4)


def test_kernel_labview_coefficient_and_training_flag():
    data, idx = _data((10, 64)), np.array([0, 0, 3, 9])
    with xgather.gather_kernel(KERNEL):
        g = jax.grad(lambda d: xgather.labview.gather(d, idx, lda_coeff=0.25).sum())(data)
        g0 = jax.grad(lambda d: xgather.labview.gather(d, idx, training=False).sum())(data)
        assert_same(xgather.labview.gather(data, idx), ref.gather(data, idx))
    want = np.zeros_like(data)
    np.add.at(want, idx, 0.25)
    np.testing.assert_allclose(g, want)
    assert not np.any(np.asarray(g0))


@pytest.mark.parametrize("dtype", ["bfloat16", np.float16, np.int8, np.uint16, np.int32])
def test_kernel_dtypes(dtype):
    dtype = np.dtype(jnp.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    data = (RNG.standard_normal((16, 200)) * 40).astype(dtype)
    idx = _idx((9,), 16)
    with xgather.gather_kernel(KERNEL):
        assert _pallas_calls(lambda d, i: xgather.onnx.gather(d, i, 0), data, idx) == 1
        assert_same(xgather.onnx.gather(data, idx, 0), ref.gather(data, idx))
        got = xgather.onnx.gather(data, idx + 50, 0, mode="fill", fill_value=3)
        assert_same(got, np.full((9, 200), 3, dtype))


def test_kernel_wide_values_and_indices_are_exact():
    """64-bit data and indices (run with x64 by the test below)."""
    if not jax.config.jax_enable_x64:
        pytest.skip("runs in the x64 rerun")
    data = np.arange(2 ** 62, 2 ** 62 + 40 * 17, dtype=np.int64).reshape(40, 17)
    idx = np.array([39, -40, 5, 0], np.int64)
    with xgather.gather_kernel(KERNEL):
        f = lambda d, i: xgather.onnx.gather(d, i, 0)  # noqa: E731
        assert _pallas_calls(f, data, idx) == 1
        assert_same(f(data, idx), ref.gather(data, idx))
        assert_same(xgather.checked(jax.jit(f))(data, idx), ref.gather(data, idx))
        u = np.array([2 ** 63 + 5, 3, 39], np.uint64)  # OpenVINO: unsigned indices
        got = xgather.openvino.gather(data.astype(np.float64), u, 0, mode="fill", fill_value=-1)
        want = ref.gather(data.astype(np.float64), u.astype(object), oob="fill", fill=-1)
        assert_same(got, want)


def test_kernel_x64_on():
    rerun_with_x64(__file__, "wide_values")


@pytest.mark.parametrize("what, args, why", [
    ("elements", lambda: xgather.onnx.gather_elements(*_args((6, 64), (6, 64)), axis=1),
     "gathers elements"),
    ("short rows", lambda: xgather.onnx.gather(*_args((30, 31), (5,))),
     "fewer than 128"),
    ("last axis", lambda: xgather.onnx.gather(*_args((30, 64), (5,)), axis=1),
     "fewer than 128"),
    ("bool data", lambda: xgather.onnx.gather(np.ones((30, 256), bool), np.arange(3)),
     "bool"),
])
def test_kernel_leaves_other_gathers_to_lax(what, args, why):
    with xgather.gather_kernel(KERNEL):
        jaxpr = str(jax.make_jaxpr(args)())
    assert "pallas_call" not in jaxpr and "gather[" in jaxpr, what


def _args(dshape, ishape):
    return _data(dshape), _idx(ishape, dshape[0] if len(ishape) == 1 else dshape[1], lo=0)


def test_kernel_pallas_on_cpu_keeps_lax_and_explain_says_why():
    data, idx = _data((30, 64)), _idx((5,), 30)
    with xgather.gather_kernel("pallas"):
        jaxpr = str(jax.make_jaxpr(lambda d, i: xgather.onnx.gather(d, i, 0, mode="clip"))(
            data, idx))
        text = str(xgather.explain(xgather.onnx.gather, data, idx))
    if jax.default_backend() == "cpu":
        assert "pallas_call" not in jaxpr
        assert "kernel: lax.gather, as gather_kernel 'pallas' does not apply: Triton kernels " \
               "run on GPUs, and this plan is for the cpu backend" in text
    with xgather.gather_kernel(KERNEL):
        text = str(xgather.explain(xgather.onnx.gather, data, idx))
        elements = str(xgather.explain(xgather.onnx.gather_elements, data, idx[:, None]))
    how = "Triton" if KERNEL == "pallas" else "interpreted"
    assert f"kernel: Pallas row gather ({how}) of 5 row(s) of 64 element(s)" in text
    assert "does not apply: it gathers elements, not rows" in elements
    assert "kernel: lax.gather (gather_kernel 'xla')" in str(
        xgather.explain(xgather.onnx.gather, data, idx))


def test_kernel_choice_is_part_of_the_trace_context():
    data, idx = _data((30, 64)), _idx((5,), 30)
    f = jax.jit(lambda d, i: xgather.onnx.gather(d, i, 0, mode="clip"))
    assert "pallas_call" not in f.trace(data, idx).jaxpr.pretty_print()
    with xgather.gather_kernel(KERNEL):
        assert "pallas_call" in f.trace(data, idx).jaxpr.pretty_print()
    before = jax.config.xgather_gather_kernel
    try:
        jax.config.update("xgather_gather_kernel", KERNEL)
        assert "pallas_call" in f.trace(data, idx).jaxpr.pretty_print()
    finally:
        jax.config.update("xgather_gather_kernel", before)
    traced = []  # a call from Python: the kernel is part of the jit dispatch key too
    g = jax.jit(lambda d, i: traced.append(_kernel.current_kernel()) or
                xgather.onnx.gather(d, i, 0, mode="clip"))
    for kind in ("xla", KERNEL, "xla"):
        with xgather.gather_kernel(kind):
            assert_same(g(data, idx), ref.gather(data, idx))
    assert traced == ["xla", KERNEL]
    with pytest.raises(ValueError, match="xgather.gather_kernel.*kind"):
        with xgather.gather_kernel("triton"):
            pass


def test_kernel_on_a_mesh_keeps_lax():
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    data, idx = _data((30, 64)), _idx((5,), 30)
    with xgather.gather_kernel(KERNEL), jax.set_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(lambda d, i: xgather.onnx.gather(d, i, 0, mode="clip"))(
            data, idx))
    assert "pallas_call" not in jaxpr


# -- Triton: the kernel lowers for CUDA on any machine ----------------------------------------

def _lower_for_cuda(plan, mode, dtype, fill=None, idx_dtype=np.int32):
    view = _kernel.rows_view(plan)
    assert isinstance(view, _kernel.Rows), view

    def f(d, i):
        return _kernel.row_gather(plan, view, mode, fill, d, i, interpret=False)
    args = (jax.ShapeDtypeStruct(plan.data_shape, dtype),
            jax.ShapeDtypeStruct(plan.indices_shape, idx_dtype))
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype", sorted(_kernel._DTYPES, key=str))
def test_kernel_lowers_to_triton_for_cuda(dtype):
    if os.environ.get("JAX_PLATFORMS", "") not in ("", "cpu"):
        pytest.skip("cross-lowering is checked on CPU; a GPU runs the kernel itself")
    plan = xgather.explain(xgather.openvino.gather_nd,
                           jax.ShapeDtypeStruct((2, 50, 7, 300), dtype),
                           jax.ShapeDtypeStruct((2, 33, 2), np.int32), 1)
    for mode in ("promise_in_bounds", "fill"):
        text = _lower_for_cuda(plan, mode, dtype, fill=0 if mode == "fill" else None)
        assert "__gpu$xla.gpu.triton" in text and "xgather_row_gather" in text, text[:2000]


def test_eager_calls_of_a_cached_signature_follow_the_kernel_choice(monkeypatch):
    """The eager runner cached per signature is a jitted program, whose cache holds the
    trace context: a later call under another kernel traces anew, and runs it."""
    traced = []
    real = _kernel.row_gather
    monkeypatch.setattr(_kernel, "row_gather", lambda *a, **k: traced.append(1) or real(*a, **k))
    data, idx = jnp.asarray(_data((31, 64))), jnp.asarray(_idx((6,), 31))
    numpy_idx = np.asarray(idx)
    want = ref.gather(np.asarray(data), numpy_idx)
    for i in (idx, numpy_idx):  # device indices (flagged program), NumPy (host check)
        assert_same(xgather.onnx.gather(data, i), want)
        assert not traced
        with xgather.gather_kernel(KERNEL):
            assert_same(xgather.onnx.gather(data, i), want)
        assert traced
        traced.clear()


def test_kernel_lowers_to_triton_for_unsigned_indices():
    if os.environ.get("JAX_PLATFORMS", "") not in ("", "cpu"):
        pytest.skip("cross-lowering is checked on CPU; a GPU runs the kernel itself")
    idx_dtype = np.uint32  # OpenVINO's (uint64 with x64: the interpreter tests it)
    plan = xgather.explain(xgather.openvino.gather, jax.ShapeDtypeStruct((100, 64), np.float32),
                           jax.ShapeDtypeStruct((7,), idx_dtype), 0)
    text = _lower_for_cuda(plan, "fill", np.float32, fill=0, idx_dtype=idx_dtype)
    assert "__gpu$xla.gpu.triton" in text


def test_kernel_unsigned_indices_clamp_and_fill():
    data = _data((16, 64))
    u = np.array([3, 2 ** 31 + 5, 15, 16], np.uint32)  # OpenVINO: unsigned indices
    with xgather.gather_kernel(KERNEL):
        f = lambda d, i, mode: xgather.openvino.gather(d, i, 0, mode=mode)  # noqa: E731
        assert _pallas_calls(functools.partial(f, mode="fill"), data, u) == 1
        assert_same(f(data, u, "fill"), ref.gather(data, u.astype(np.int64), oob="fill"))
        assert_same(f(data, u, "clip"), ref.gather(data, u.astype(np.int64), oob="clip"))
