"""The systems a workload runs on: xgather, hand-written lax.gather, and the peers.

Each builder returns a zero-argument callable that runs the workload once and
blocks until the result is ready, or ``None`` where the system has no such
op. Peers that are not installed are reported by :func:`available` and skipped.

On a GPU the peers are those on the same GPU (torch on CUDA, CuPy), reading
device-resident copies of the same data; :func:`gpu_peers` says why one is
skipped. The host peers (numpy, onnxruntime, OpenVINO, torch on the CPU) then
run only where ``--systems`` names them. The model steps (M1-M4) run in JAX and in
torch, on whichever device torch's system uses (the same code on the CPU and on CUDA).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import numpy as np

from . import steps

Runner = Callable[[], object]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def available() -> dict[str, bool]:
    """Which peers are installed (onnxruntime's models are built with onnx)."""
    have = {name: importlib.util.find_spec(name) is not None
            for name in ("onnx", "onnxruntime", "openvino", "torch")}
    have["onnxruntime"] &= have.pop("onnx")
    return have


def import_peers(peers: dict[str, bool], chosen: set[str] | None) -> None:
    """Import the installed peers that will run (``chosen``: None for all)."""
    for name, ok in peers.items():
        if ok and (chosen is None or name in chosen):
            importlib.import_module(name)


# -- JAX: xgather and the hand-written lax.gather ---------------------------------------------

def jax_inputs(data, idx, device):
    """The arrays every JAX system reads: placed once, so all read the same buffers.

    Without x64 the int64 indices become int32 here, as they would for a user.
    """
    import jax
    return jax.device_put(data, device), jax.device_put(idx, device)


def xgather_op(w):
    """``(op, attrs, options)``: the xgather op of the workload, its positional attributes
    and keyword options (for ``grad``: the forward gather)."""
    import xgather
    return {"onnx.gather": (xgather.onnx.gather, (w.axis,), {}),
            "grad": (xgather.onnx.gather, (0,), {}),
            "onnx.gather_nd": (xgather.onnx.gather_nd, (w.batch_dims,), {}),
            "onnx.gather_elements": (xgather.onnx.gather_elements, (w.axis,), {}),
            "openvino.gather7": (xgather.openvino.gather, (w.axis, w.batch_dims),
                                 {"version": 7})}[w.op]


def _xgather_fn(w, mode, **kw):
    """The workload's op; ``kw`` (e.g. ``negative_indices``) passed to it. A model step:
    ``f(d, i, weights)``, the step around the op (:func:`bench.steps.jax_step`)."""
    import jax
    op, attrs, options = xgather_op(w)

    def f(d, i):
        return op(d, i, *attrs, mode=mode, **options, **kw)
    if w.step is not None:
        return steps.jax_step(w, f)
    if w.op != "grad":
        return f
    return lambda d, i: jax.grad(lambda x: (f(x, i) ** 2).sum())(d)


def linear_applies(w, data, idx) -> bool:
    """Whether the workload's gather is one of single elements, which the ``"linear"``
    element lowering (:func:`xgather.lowering`) would take."""
    import xgather
    if w.op == "grad":
        return False
    op, attrs, options = xgather_op(w)
    with xgather.lowering(element_gather="linear"):
        return xgather.explain(op, data, idx, *attrs, **options).lowering == "linear"


def wrap_program(w, d, i, wrap: str, extra=()) -> dict:
    """What the program of ``xgather[branched-wrap]`` / ``xgather[fused-wrap]`` holds: the
    op in ``"promise_in_bounds"`` with negative indices on, traced under
    ``xgather.lowering(wrap=wrap)`` (``"by_size"``: the branch; ``"fused"``).

    Returns ``{"wrap", "wrap_pass", "branch"}``: the plan's choice and where it wraps
    (``xgather.explain`` inside the block), and whether the lowered program holds a
    conditional (``stablehlo.case``). Raises ``RuntimeError`` where the program is not
    what ``wrap`` asks at these shapes: a branch exactly where the plan's ``wrap_pass`` is
    not ``"fused"``, none with ``wrap="fused"``.
    """
    import jax

    import xgather
    op, attrs, options = xgather_op(w)
    with xgather.lowering(wrap=wrap):
        plan = xgather.explain(op, d, i, *attrs, mode="promise_in_bounds", **options)
    text = jax.jit(_lowered_fn(w, "promise_in_bounds", {"wrap": wrap})).lower(
        d, i, *extra).as_text()
    branch = "stablehlo.case" in text
    if (plan.wrap != wrap or not plan.negative or branch != (plan.wrap_pass != "fused")
            or (wrap == "fused" and branch)):
        raise RuntimeError(f"{w.key}: xgather.lowering(wrap={wrap!r}) traced a plan with wrap="
                           f"{plan.wrap!r}, wrap_pass={plan.wrap_pass!r}, negative="
                           f"{plan.negative} and {'a' if branch else 'no'} conditional")
    return {"wrap": wrap, "wrap_pass": plan.wrap_pass, "branch": branch}


def checks(w, mode) -> bool:
    """Whether xgather's op in ``mode`` (None: the spec's rule) checks its indices at run
    time, and so runs under ``xgather.checked``: ``"error"``, ONNX's default; OpenVINO's
    Gather defines an out-of-range index (zeros), so its default has nothing to check."""
    return (mode or "error") == "error" and w.op != "openvino.gather7"


def _lowered_fn(w, mode, lowering=None, **kw):
    """:func:`_xgather_fn`, traced inside ``xgather.lowering(**lowering)`` where given: the
    block is entered by the trace itself, so every trace takes it (also the one after
    ``jax.clear_caches()``, which the first-call timings run), and a call that reuses a
    trace pays nothing for it."""
    fn = _xgather_fn(w, mode, **kw)
    if not lowering:
        return fn
    import xgather

    def traced(*args):
        with xgather.lowering(**lowering):
            return fn(*args)
    return traced


def xgather_runner(w, d, i, mode=None, extra=(), element_gather=None, wrap=None,
                   **kw) -> Runner:
    """The op in ``mode`` (None: the spec's rule, ``"error"``/``"fill"``), jitted.

    ``d``, ``i``: device arrays from :func:`jax_inputs`; ``extra``: a model step's
    weights, on the same device. ``element_gather``, ``wrap``: the element gathers'
    lowering and where negative indices are wrapped (:func:`xgather.lowering`), set in
    every trace of the program (:func:`_lowered_fn`).
    """
    import jax

    import xgather
    lowering = {k: v for k, v in (("element_gather", element_gather), ("wrap", wrap)) if v}
    f = jax.jit(_lowered_fn(w, mode, lowering, **kw))
    if checks(w, mode):
        f = xgather.checked(f)

    def run():
        return jax.block_until_ready(f(d, i, *extra))
    run.pipelined = lambda n: jax.block_until_ready([f(d, i, *extra) for _ in range(n)][-1])
    return run


def lax_fn(w):
    """The same gather written directly with ``lax.gather`` (indices known valid)."""
    from jax import lax
    GDN, PIB = lax.GatherDimensionNumbers, lax.GatherScatterMode.PROMISE_IN_BOUNDS

    def take(d, i, axis):
        axis %= d.ndim
        q = i.ndim
        dn = GDN(offset_dims=tuple(range(axis)) + tuple(range(axis + q, d.ndim - 1 + q)),
                 collapsed_slice_dims=(axis,), start_index_map=(axis,))
        sizes = d.shape[:axis] + (1,) + d.shape[axis + 1:]
        return lax.gather(d, i[..., None], dn, sizes, mode=PIB)

    if w.op in ("onnx.gather", "grad") or (w.op == "openvino.gather7" and not w.batch_dims):
        f = lambda d, i: take(d, i, w.axis)  # noqa: E731
    elif w.op == "openvino.gather7":  # batch_dims=1, axis=1: XLA batching dims
        def f(d, i):
            dn = GDN(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,),
                     operand_batching_dims=(0,), start_indices_batching_dims=(0,))
            return lax.gather(d, i[..., None], dn, (1, 1) + d.shape[2:], mode=PIB)
    elif w.op == "onnx.gather_nd":
        b = w.batch_dims

        def f(d, i):
            k, lead = i.shape[-1], i.ndim - 1
            dn = GDN(offset_dims=tuple(range(lead, lead + d.ndim - b - k)),
                     collapsed_slice_dims=tuple(range(b, b + k)),
                     start_index_map=tuple(range(b, b + k)),
                     operand_batching_dims=tuple(range(b)),
                     start_indices_batching_dims=tuple(range(b)))
            return lax.gather(d, i, dn, (1,) * (b + k) + d.shape[b + k:], mode=PIB)
    else:  # gather_elements
        def f(d, i):
            others = tuple(a for a in range(d.ndim) if a != w.axis)
            dn = GDN(offset_dims=(), collapsed_slice_dims=(w.axis,), start_index_map=(w.axis,),
                     operand_batching_dims=others, start_indices_batching_dims=others)
            return lax.gather(d, i[..., None], dn, (1,) * d.ndim, mode=PIB)
    return _as_workload(w, f)


def _as_workload(w, f):
    """A hand-written gather ``f`` as the workload ``w`` runs it: inside its model step,
    under its gradient, or as it is."""
    import jax
    if w.step is not None:
        return steps.jax_step(w, f)
    if w.op == "grad":
        return jax.grad(lambda d, i: (f(d, i) ** 2).sum())
    return f


def _jitted_runner(fn, d, i, extra) -> Runner:
    """``fn`` jitted, on the same device arrays as xgather."""
    import jax
    f = jax.jit(fn)
    return lambda: jax.block_until_ready(f(d, i, *extra))


def lax_runner(w, d, i, extra=()) -> Runner:
    """The hand-written ``lax.gather`` on the same device arrays as xgather."""
    return _jitted_runner(lax_fn(w), d, i, extra)


#: A hand-written check, the floor of any that returns a flag (:func:`lax_checked_fn`).
LAX_CHECKED = "lax-checked"


class OutOfRangeFlag(RuntimeError):
    """A :data:`LAX_CHECKED` call's flag was set: some index was out of the spec's range."""


def spec_out_of_range(w, d, i):
    """The out-of-range test of the indices ``i`` under the op's spec range, an array of
    bools: ``(i < -s) | (i >= s)``, ``s`` the size of the axis an index addresses (ONNX
    Gather, GatherElements and the gradient's gather: ``data.shape[axis]``; GatherND: each
    component ``j`` against ``data.shape[batch_dims + j]``)."""
    s = _spec_sizes(w, d, i)
    return (i < -s) | (i >= s)


def _spec_sizes(w, d, i):
    """The size each index of ``i`` counts in: a number, or GatherND's sizes per component
    (shaped to broadcast against ``i`` without rank promotion)."""
    import jax.numpy as jnp
    if w.op == "onnx.gather_nd":
        b, k = w.batch_dims, i.shape[-1]
        return jnp.asarray(np.asarray(d.shape[b:b + k]), i.dtype).reshape(
            (1,) * (i.ndim - 1) + (k,))
    return d.shape[w.axis % d.ndim]


def spec_wrap(w, d, i):
    """``i`` with its negative indices wrapped as the op's spec says (``i + s``)."""
    import jax.numpy as jnp
    return jnp.where(i < 0, i + _spec_sizes(w, d, i), i)


def lax_checked_fn(w):
    """What an expert writes by hand for a checked gather, no xgather: ``f(d, i, *extra)``
    returns ``(the result, flag)``, the result :func:`lax_fn`'s on the indices with
    negative ones wrapped as the spec says (:func:`spec_wrap`), the flag
    ``jnp.any(spec_out_of_range(...))`` beside it, one program under ``jax.jit``."""
    import jax.numpy as jnp
    f = lax_fn(w)

    def checked(d, i, *extra):
        return f(d, spec_wrap(w, d, i), *extra), jnp.any(spec_out_of_range(w, d, i))
    return checked


class LaxCheckedRunner:
    """:func:`lax_checked_fn`, jitted, whose flag is read (a Python ``bool``) at the next
    call, raising :class:`OutOfRangeFlag` where it is set.

    ``runner()``: a blocked call, which waits for its result, then reads the previous
    call's flag (by then ready); ``runner.call()``: a pipelined call, which reads the
    previous call's flag, then dispatches, and returns without waiting;
    ``runner.pipelined(n)``: ``n`` such calls, then one wait; ``runner.finish()``: reads
    the last flag left. The flag's read is a wait for the previous program, as any check
    whose flag the host reads at the next call pays.
    """

    def __init__(self, w, d, i, extra=()):
        import jax
        self.name = f"{LAX_CHECKED} {w.key}"
        self.f = jax.jit(lax_checked_fn(w))
        self.args = (d, i, *extra)
        self.flag = None

    def _read(self, flag) -> None:
        if flag is not None and bool(flag):
            raise OutOfRangeFlag(f"{self.name}: some index is out of the spec's range "
                                 "(its flag, read at the next call, is set)")

    def __call__(self):
        import jax
        out, flag = self.f(*self.args)
        jax.block_until_ready(out)
        previous, self.flag = self.flag, flag
        self._read(previous)
        return out

    def call(self):
        previous, self.flag = self.flag, None
        self._read(previous)
        out, self.flag = self.f(*self.args)
        return out

    def pipelined(self, n: int):
        import jax
        out = None
        for _ in range(n):
            out = self.call()
        return jax.block_until_ready(out)

    def finish(self) -> None:
        previous, self.flag = self.flag, None
        self._read(previous)


def lax_checked_runner(w, d, i, extra=()) -> LaxCheckedRunner | None:
    """:class:`LaxCheckedRunner` where xgather's default checks (:func:`checks`), else None."""
    return LaxCheckedRunner(w, d, i, extra) if checks(w, None) else None


def jnp_fn(w):
    """The same gather as a user writes it with ``jax.numpy``, in its default mode:
    ``jnp.take`` (Gather; ``batch_dims`` by ``jax.vmap``), ``jnp.take_along_axis``
    (GatherElements), plain indexing (GatherND: ``d[i[..., 0], i[..., 1]]``, ``batch_dims`` by
    ``jax.vmap``). An out-of-range index gets JAX's default (``jnp.take`` fills, plain
    indexing promises the indices are in bounds), and the program holds what that takes."""
    import jax
    import jax.numpy as jnp

    def batched(f, b):  # f over the leading b axes of the data and the indices
        for _ in range(b):
            f = jax.vmap(f)
        return f

    if w.op in ("onnx.gather", "grad", "openvino.gather7"):
        # under vmap an axis counted from the front loses the batch axes
        axis = w.axis - w.batch_dims if w.axis >= 0 else w.axis
        f = batched(lambda d, i: jnp.take(d, i, axis=axis), w.batch_dims)
    elif w.op == "onnx.gather_nd":
        f = batched(lambda d, i: d[tuple(i[..., j] for j in range(i.shape[-1]))],
                    w.batch_dims)
    else:  # gather_elements
        def f(d, i):
            return jnp.take_along_axis(d, i, axis=w.axis)
    return _as_workload(w, f)


def jnp_runner(w, d, i, extra=()) -> Runner:
    """:func:`jnp_fn`, jitted, on the same device arrays as xgather and ``lax``."""
    return _jitted_runner(jnp_fn(w), d, i, extra)


# -- Peers ------------------------------------------------------------------------------------

def numpy_runner(w, data, idx, device=None) -> Runner | None:
    if w.step is not None:  # the model steps run in JAX and torch only
        return None
    if w.op == "onnx.gather":
        return lambda: np.take(data, idx, axis=w.axis)
    if w.op == "onnx.gather_nd":
        if w.batch_dims:
            b = np.arange(data.shape[0])[:, None]
            return lambda: data[b, idx[..., 0]]
        return lambda: data[tuple(np.moveaxis(idx, -1, 0))]
    if w.op == "onnx.gather_elements":
        return lambda: np.take_along_axis(data, idx, axis=w.axis)
    if w.op == "openvino.gather7":
        b = np.arange(data.shape[0])[:, None]
        return lambda: data[b, idx]

    def grad():
        g = np.zeros_like(data)
        np.add.at(g, idx, 2 * data[idx])
        return g
    return grad


def ort_runner(w, data, idx, threads: int) -> Runner | None:
    import onnxruntime as ort
    from onnx import TensorProto, helper
    ops = {"onnx.gather": ("Gather", {"axis": w.axis}),
           "onnx.gather_nd": ("GatherND", {"batch_dims": w.batch_dims}),
           "onnx.gather_elements": ("GatherElements", {"axis": w.axis})}
    if w.op not in ops or w.step is not None:
        return None
    op, attrs = ops[w.op]
    node = helper.make_node(op, ["d", "i"], ["o"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("d", TensorProto.FLOAT, data.shape),
                      helper.make_tensor_value_info("i", TensorProto.INT64, idx.shape)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    # Idle threads sleep instead of spinning (spinning would slow the next system timed).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {"d": data, "i": idx}
    return lambda: sess.run(None, feeds)


def openvino_runner(w, data, idx, threads: int) -> Runner | None:
    import openvino as ov
    import openvino.opset1 as o1
    import openvino.opset6 as o6
    import openvino.opset7 as o7
    import openvino.opset8 as o8
    if w.op == "grad" or w.step is not None:
        return None
    pd = o1.parameter(list(data.shape), ov.Type.f32)
    pi = o1.parameter(list(idx.shape), ov.Type.i64)
    if w.op == "onnx.gather":
        node = o8.gather(pd, pi, o1.constant(np.int64(w.axis)))
    elif w.op == "openvino.gather7":
        node = o7.gather(pd, pi, o1.constant(np.int64(w.axis)), w.batch_dims)
    elif w.op == "onnx.gather_nd":
        node = o8.gather_nd(pd, pi, w.batch_dims)
    else:
        node = o6.gather_elements(pd, pi, w.axis)
    compiled = ov.Core().compile_model(ov.Model([node], [pd, pi]), "CPU",
                                       {"INFERENCE_NUM_THREADS": threads})
    req = compiled.create_infer_request()
    return lambda: req.infer([data, idx])


def torch_runner(w, data, idx, threads: int) -> Runner:
    """The workload in torch on the CPU with ``threads`` threads (a model step too)."""
    import torch
    fn = _torch_fn(w, data, idx, torch.device("cpu"))

    def run():
        torch.set_num_threads(threads)
        return fn()
    return run


def _embedding_form(w, data_ndim: int, idx_ndim: int) -> bool:
    """Whether the workload is an embedding lookup (or its gradient): ``F.embedding``'s."""
    return w.step is None and (w.op == "grad" or (w.op == "onnx.gather" and w.axis == 0
                                                   and data_ndim == 2 and idx_ndim == 1))


def _torch_fn(w, data, idx, dev, embedding: bool = False):
    """The workload's ``f()`` in torch on device ``dev``, the arrays copied there once: the
    gather (:func:`torch_gather_fn`) or the model step (:func:`torch_step_fn`)."""
    d, i = _torch_tensor(data, dev), _torch_tensor(idx, dev)
    if w.step is None:
        return torch_gather_fn(w, d, i, embedding)
    return torch_step_fn(w, d, i, _torch_tensor(steps.weights(w, data, idx), dev))


def torch_gather_fn(w, d, i, embedding: bool = False):
    """``f()``: the workload's gather in torch on the tensors ``d`` and ``i``, on their device
    (any one: cpu, cuda, meta), without waiting for it; for ``grad``, the gradient of
    ``sum(gather ** 2)`` in ``d``. ``embedding``: ``F.embedding`` and its backward, None where
    the workload is not an embedding lookup."""
    import torch
    import torch.nn.functional as F
    if embedding and not _embedding_form(w, d.ndim, i.ndim):
        return None

    def no_grad(fn):
        def run():
            with torch.no_grad():
                return fn()
        return run

    if w.op == "grad":
        leaf = d.clone().requires_grad_(True)
        take = (lambda x: F.embedding(i, x)) if embedding else (
            lambda x: torch.index_select(x, 0, i))

        def grad():
            leaf.grad = None
            (take(leaf) ** 2).sum().backward()
            return leaf.grad
        return grad
    if embedding:
        return no_grad(lambda: F.embedding(i, d))
    if w.op == "onnx.gather":
        return no_grad(lambda: torch.index_select(d, w.axis % d.ndim, i))
    if w.op == "onnx.gather_elements":
        return no_grad(lambda: torch.gather(d, w.axis, i))
    if w.op == "onnx.gather_nd" and not w.batch_dims:
        cols = tuple(i[..., j] for j in range(i.shape[-1]))
        return no_grad(lambda: d[cols])
    b = torch.arange(d.shape[0], device=d.device)[:, None]
    if w.op == "onnx.gather_nd":  # batch_dims=1, one index per row
        return no_grad(lambda: d[b, i[..., 0]])
    return no_grad(lambda: d[b, i])  # openvino.gather7, batch_dims=1, axis=1


def torch_step_fn(w, d, i, wt):
    """``f()``: the model step (:func:`bench.steps.torch_step`) around torch's gather, on the
    device of the tensors ``d``, ``i`` and the weights ``wt`` (any one), without waiting
    for it. ``dense_grad`` returns the gradients in the table and in the weights."""
    import torch

    if w.op == "onnx.gather":
        def gather(x, j):
            return torch.index_select(x, w.axis % x.ndim, j)
    elif w.op == "onnx.gather_elements":
        def gather(x, j):
            return torch.gather(x, w.axis, j)
    else:  # GatherND with batch_dims=1 and one index component
        rows = torch.arange(d.shape[0], device=d.device)[:, None]

        def gather(x, j):
            return x[rows, j[..., 0]]
    step = steps.torch_step(w, gather)
    if w.step == "dense_grad":
        # leaves of their own that share the tensors' memory (no copy of a GPU's table)
        d, wt = d.detach().requires_grad_(True), wt.detach().requires_grad_(True)
        return lambda: step(d, i, wt)

    def run():
        with torch.no_grad():
            return step(d, i, wt)
    return run


# -- Peers on the same GPU --------------------------------------------------------------------

GPU_PEERS = ("torch-cuda", "cupy")
#: What ``--systems`` takes: ``xgather`` brings both of its modes, a peer each of its
#: thread counts (and torch-cuda its embedding form).
#: promise alone (``negative_indices=False``: no wrap in the program), where named.
PROMISE = "xgather[promise]"
#: promise with the element gathers' linear lowering, beside promise: on a GPU, or where named.
LINEAR = "xgather[linear]"
#: promise with negative indices on, where named: the wrap in a branch taken only when some
#: index is negative (``xgather.lowering(wrap="by_size")``, XLA:CPU's choice) or inside the
#: gather (``wrap="fused"``, the accelerators'). Each runs twice: on the workload's own
#: indices (all in [0, s-1]: the branch is skipped) and, as ``NAME neg``, on the same indices
#: with half of them written as ``i - s`` (:meth:`Workload.with_negatives`: the branch
#: taken, the same values gathered).
BRANCHED_WRAP = "xgather[branched-wrap]"
FUSED_WRAP = "xgather[fused-wrap]"
WRAP_SYSTEMS = {BRANCHED_WRAP: "by_size", FUSED_WRAP: "fused"}
NEG = " neg"
#: JAX's own gather as a user writes it, in its default mode (:func:`jnp_fn`).
JNP = "jnp.take"
#: The systems that run in JAX, on the device its arrays are on (name prefixes).
JAX_SYSTEMS = ("xgather", "lax", JNP)
NAMES = ("xgather", PROMISE, LINEAR, BRANCHED_WRAP, FUSED_WRAP, "lax", LAX_CHECKED, JNP,
         "numpy", "onnxruntime", "openvino", "torch", *GPU_PEERS)


def library(name: str) -> str:
    """The library that runs a system: ``"jax"`` for xgather's modes, ``lax`` and
    ``jnp.take`` (one runtime, one thread pool), else the peer's name without its thread
    count."""
    return "jax" if name.startswith(JAX_SYSTEMS) else name.split()[0]


def gpu_peers() -> dict[str, str | None]:
    """``{GPU peer: None}`` where it can run here, else ``{GPU peer: why not}``."""
    out: dict[str, str | None] = {}
    if importlib.util.find_spec("torch") is None:
        out["torch-cuda"] = "torch is not installed"
    else:
        import torch
        out["torch-cuda"] = None if torch.cuda.is_available() else (
            "torch.cuda.is_available() is False (no CUDA device, or a CPU-only torch)")
    if importlib.util.find_spec("cupy") is None:
        out["cupy"] = "cupy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    else:
        try:
            import cupy
            n = cupy.cuda.runtime.getDeviceCount()
            out["cupy"] = None if n else "cupy sees no CUDA device"
        except Exception as e:  # CUDA driver or runtime missing: CuPy raises its own kinds
            out["cupy"] = f"cupy cannot reach a CUDA device: {type(e).__name__}: {e}"
    return out


def _torch_tensor(a, device):
    import torch
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: same bits, no torch.from_numpy
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def torch_cuda_runner(w, data, idx, embedding: bool = False, device: str = "cuda"
                      ) -> Runner | None:
    """The workload (a model step too) on the GPU in torch; ``embedding``: ``F.embedding``
    and its backward (None where the workload is not an embedding lookup).

    The data and indices (and a step's weights) are copied to the device once; each call
    waits for its result. ``device="cpu"`` runs the same code on the CPU (for tests
    without a GPU).
    """
    import torch
    dev = torch.device(device)
    if embedding and not _embedding_form(w, data.ndim, idx.ndim):
        return None  # known before anything is copied to the device
    fn = _torch_fn(w, data, idx, dev, embedding)
    sync = _torch_sync(dev)

    def run():
        out = fn()
        sync()
        return out
    return run


def _torch_sync(dev):
    """A wait for the work queued on torch's device ``dev``; none on the CPU."""
    if dev.type in ("cpu", "meta"):
        return lambda: None
    import torch
    backend = getattr(torch, dev.type)  # torch.cuda, and likewise torch.xpu, torch.mps
    return lambda: backend.synchronize(dev)


def cupy_runner(w, data, idx) -> Runner | None:
    """The workload on the GPU in CuPy (``take``, ``take_along_axis``, indexing, ``add.at``)."""
    if w.step is not None:  # the model steps run in JAX and torch only
        return None
    import cupy
    if data.dtype.name == "bfloat16":
        return None  # CuPy has no bfloat16
    d, i = cupy.asarray(data), cupy.asarray(idx)
    sync = cupy.cuda.Device().synchronize

    def synced(fn):
        def run():
            out = fn()
            sync()
            return out
        return run

    if w.op == "onnx.gather":
        return synced(lambda: cupy.take(d, i, axis=w.axis))
    if w.op == "onnx.gather_elements":
        return synced(lambda: cupy.take_along_axis(d, i, axis=w.axis))
    if w.op == "onnx.gather_nd" and not w.batch_dims:
        cols = tuple(i[..., j] for j in range(i.shape[-1]))
        return synced(lambda: d[cols])
    if w.op == "grad":
        def grad():
            g = cupy.zeros_like(d)
            # ufunc.at (CuPy 12 and later); cupyx.scatter_add calls ndarray.scatter_add,
            # which CuPy 14 deprecates in its favour
            cupy.add.at(g, i, 2 * cupy.take(d, i, axis=0))
            return g
        return synced(grad)
    b = cupy.arange(d.shape[0])[:, None]
    if w.op == "onnx.gather_nd":
        return synced(lambda: d[b, i[..., 0]])
    return synced(lambda: d[b, i])


def build(w, data, idx, device, peers: dict[str, bool], systems: set[str] | None):
    """``{system name: runner}`` for every system that has this workload.

    ``peers``: which peers can run (:func:`available`, and on a GPU
    :data:`GPU_PEERS` from :func:`gpu_peers`); ``systems``: the names chosen (None:
    all that can run; on a GPU, the host peers only where named).
    """
    n = cores()
    threads = sorted({1, n})
    out: dict[str, Runner] = {}
    on_gpu = getattr(device, "platform", "cpu") == "gpu"

    def want(name):
        return systems is None or name.split(" ")[0] in systems or name in systems

    def want_host(name):  # a peer on the host: on a GPU only where named
        return want(name) and not (on_gpu and (systems is None or name not in systems))

    named_linear = systems is not None and LINEAR in systems
    named_promise = systems is not None and PROMISE in systems
    named_lax_checked = systems is not None and LAX_CHECKED in systems
    wraps = [n for n in WRAP_SYSTEMS if systems is not None and n in systems]
    if (want("xgather") or want("lax") or want(JNP) or named_linear or named_promise or wraps
            or named_lax_checked):
        import jax
        d, i = jax_inputs(data, idx, device)
        # a model step's weights, beside the data on the device
        extra = () if w.step is None else (
            jax.device_put(steps.weights(w, data, idx), device),)
    if want("xgather") or named_linear:
        out["xgather"] = xgather_runner(w, d, i, extra=extra)
    if want("xgather") or named_linear or named_promise:
        # indices known valid: in [0, s-1], as the hand-written lax.gather assumes
        out[PROMISE] = xgather_runner(w, d, i, "promise_in_bounds", extra=extra,
                                      negative_indices=False)
    if (want("xgather") or named_linear) and (on_gpu or named_linear) and \
            linear_applies(w, data, idx):
        # The element gathers' second lowering, one linear index into the flattened
        # data (off by default until a GPU measurement shows it paying).
        out[LINEAR] = xgather_runner(w, d, i, "promise_in_bounds", extra=extra,
                                     element_gather="linear", negative_indices=False)
    if wraps:
        negative = jax.device_put(w.with_negatives(data.shape, idx), device)
    for name in wraps:
        wrap = WRAP_SYSTEMS[name]
        for suffix, ii in (("", i), (NEG, negative)):
            r = xgather_runner(w, d, ii, "promise_in_bounds", extra=extra, wrap=wrap)
            r.lowering = {**wrap_program(w, d, ii, wrap, extra),
                          "indices": "half negative" if suffix else "the workload's"}
            out[name + suffix] = r
    if want("lax"):
        out["lax"] = lax_runner(w, d, i, extra)
    if named_lax_checked and (r := lax_checked_runner(w, d, i, extra)) is not None:
        out[LAX_CHECKED] = r
    if want(JNP):
        out[JNP] = jnp_runner(w, d, i, extra)
    if want_host("numpy") and (r := numpy_runner(w, data, idx)) is not None:
        out["numpy"] = r
    for name, make in (("onnxruntime", ort_runner), ("openvino", openvino_runner),
                       ("torch", torch_runner)):
        if peers.get(name) and want_host(name):
            for t in threads:
                r = make(w, data, idx, t)
                if r is not None:
                    out[f"{name} {t}t"] = r
    if on_gpu:
        made = {}
        if peers.get("torch-cuda") and want("torch-cuda"):
            made["torch-cuda"] = torch_cuda_runner(w, data, idx)
            made["torch-cuda embedding"] = torch_cuda_runner(w, data, idx, embedding=True)
        if peers.get("cupy") and want("cupy"):
            made["cupy"] = cupy_runner(w, data, idx)
        out.update({k: r for k, r in made.items() if r is not None})
    return out
