"""A Pallas row-gather kernel (Triton backend): an opt-in alternative to ``lax.gather``
for gathers of whole rows on a GPU.

``lax.gather`` is the reference path and the default on every backend. This kernel
is there for the shape class where XLA's gather might fall short of a GPU's
memory bandwidth (issue 13 asks for 80% of a device-to-device copy on large row
gathers): gathers whose every index selects a contiguous row of at least
:data:`MIN_ROW_BYTES`. Each program loads a block of ``bm`` indices at once and
then ``bm`` row segments of ``bd`` elements, so many row loads are in flight per
thread, where XLA's loop emitter (as we read its source) has one short vector per
thread, issued after its index load. Whether that pays is for a GPU measurement to
say (the bench's ``xgather[promise,pallas]`` beside ``xgather[promise]``); until one
does, :func:`gather_kernel` defaults to ``"xla"``.

Which plans take it: ONNX and OpenVINO ``Gather`` (any axis, batch dims too),
``GatherND`` (any index depth and batch dims), the BNNS and LabVIEW gathers,
whenever the addressed axes are consecutive and the rest of each row is
contiguous; not ``GatherElements``. The kernel sees the prepared indices (wrapped
as the spec says, narrowed) and keeps every read in bounds as XLA's gather does:
outside ``"fill"``, it clamps each index component into its axis; in ``"fill"``,
a row with a component out of range is the fill value. The derivative stays
JAX's transpose of ``lax.gather`` (``pallas_call`` has no transpose): the
primal runs the kernel and the tangent ``lax.gather``, through the custom JVP of
:mod:`xgather._grad`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from xgather import _modes

#: The gather kernels (see :func:`gather_kernel`).
KERNELS = ("xla", "pallas", "pallas_interpret")

#: Bytes a row must hold for the kernel to take it: below, a gather reads scattered
#: elements, not rows, and XLA's loop is the better tool.
MIN_ROW_BYTES = 128

# Elements of one program's block (bm rows of bd elements), and the widest row segment
# one program copies. 4096 four-byte elements: 16 KiB a program, 32 elements of each
# of 128 threads (4 warps) in flight.
_BLOCK_ELEMENTS = 4096
_MAX_SEGMENT = 1024
_NUM_WARPS = 4

#: Data types the kernel copies (Triton's loads and stores): bool, complex and the
#: sub-byte and 8-bit float types stay with ``lax.gather``.
_DTYPES = frozenset(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, jnp.bfloat16))

_KERNEL = _modes.TraceState(
    "xgather_gather_kernel", KERNELS, "xla",
    "The kernel of xgather's row gathers: xla (lax.gather), pallas (a Pallas Triton "
    "kernel on GPUs) or pallas_interpret (the same kernel in Pallas's interpreter).")


def gather_kernel(kind: str):
    """Trace xgather's row gathers with the kernel ``kind``:

    * ``"xla"`` (the default): ``lax.gather``, on every backend.
    * ``"pallas"``: on a GPU backend, a Pallas kernel (Triton) for gathers of
      contiguous rows of at least 128 bytes (ONNX/OpenVINO ``Gather`` and
      ``GatherND``, BNNS and LabVIEW gathers; not ``GatherElements``); other
      gathers, other backends and calls given ``out_sharding`` or traced under a
      mesh keep ``lax.gather`` (``xgather.explain`` says which runs, and why).
    * ``"pallas_interpret"``: the same kernel run by Pallas's interpreter on any
      backend: slow, for tests on a machine without a GPU.

    The values are the same as ``lax.gather``'s in every mode, and gradients are
    JAX's transpose of ``lax.gather`` either way. Read when a gather is traced,
    like :func:`xgather.grad_scatter`; for a whole process,
    ``jax.config.update("xgather_gather_kernel", "pallas")`` or the environment
    variable ``XGATHER_GATHER_KERNEL=pallas``.
    """
    return _KERNEL.traced_as(kind, "xgather.gather_kernel")


def current_kernel() -> str:
    """The kernel asked for here (``"xla"`` where JAX has no such state)."""
    return _KERNEL.value


class Rows:
    """``plan`` seen as a row gather: data ``(outer, rows, inner)`` and index
    components ``(groups, count, depth)``, where each of the ``outer`` slices reads
    the indices of group ``o // (outer // groups)``."""

    def __init__(self, plan, first: int):
        b, k = plan.batch_dims, len(plan.index_axes)
        self.bounds = plan.bounds
        self.outer = math.prod(plan.data_shape[:first])
        self.rows = math.prod(self.bounds)
        self.inner = math.prod(plan.data_shape[first + k:])
        self.groups = math.prod(plan.data_shape[:b])
        lead = plan.indices_shape[b:-1] if plan.index_vector else plan.indices_shape[b:]
        self.count = math.prod(lead)
        self.depth = k


def rows_view(plan) -> Rows | str:
    """``plan`` as a :class:`Rows`, or why the kernel does not take it."""
    if "GatherElements" in plan.op or plan.data_crop is not None:
        return "it gathers elements, not rows"
    axes = plan.index_axes
    first = axes[0]
    if axes != tuple(range(first, first + len(axes))) or first < plan.batch_dims:
        return "its index axes are not consecutive after the batch dims"
    view = Rows(plan, first)
    lead = plan.indices_shape[plan.batch_dims:]
    lead = lead[:-1] if plan.index_vector else lead
    expected = plan.data_shape[:first] + lead + plan.data_shape[first + len(axes):]
    if expected != plan.gather_shape or plan.indices_shape[:plan.batch_dims] != \
            plan.data_shape[:plan.batch_dims]:
        return "its result is not one row per index"
    if 0 in (view.outer, view.rows, view.inner, view.count):
        return "it has no row to copy"
    return view


def _refusal(plan, kind: str) -> Rows | str:
    """``plan`` as :class:`Rows`, or why the kernel ``kind`` does not take it (any data)."""
    if kind == "xla":
        return "gather_kernel is 'xla'"
    if kind == "pallas" and plan.backend != "gpu":
        return f"Triton kernels run on GPUs, and this plan is for the {plan.backend} backend"
    return rows_view(plan)


def takes(plan, dtype) -> str | None:
    """Why the kernel cannot gather ``plan`` on ``dtype`` data, on any backend (None: it
    can)."""
    view = rows_view(plan)
    return view if isinstance(view, str) else _row_refusal(view, dtype)


def _row_refusal(view: Rows, dtype) -> str | None:
    """Why the kernel does not copy ``view``'s rows of ``dtype`` data (None: it does)."""
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        return f"the kernel does not copy {dtype} data"
    if view.inner * dtype.itemsize < MIN_ROW_BYTES:
        return (f"its rows hold {view.inner * dtype.itemsize} bytes, fewer than "
                f"{MIN_ROW_BYTES}")
    return None


def runs(plan, dtype, hints) -> Rows | None:
    """``plan`` as the :class:`Rows` the kernel of ``hints`` (:class:`xgather._apply.Hints`)
    gathers on ``dtype`` data here; None where ``lax.gather`` does (a placement on a mesh
    included: a Pallas call is not partitioned)."""
    view = _refusal(plan, hints.kernel)
    if isinstance(view, str) or _row_refusal(view, dtype) is not None:
        return None
    if hints.out_sharding is not None or jax.sharding.get_abstract_mesh().axis_names:
        return None
    return view


def text(plan) -> str:
    """What ``explain`` says of the kernel (a plan holds no data type: the row size
    decides at trace time)."""
    kind = current_kernel()
    if kind == "xla":
        return "kernel: lax.gather (gather_kernel 'xla')"
    view = _refusal(plan, kind)
    if isinstance(view, str):
        return f"kernel: lax.gather, as gather_kernel '{kind}' does not apply: {view}"
    how = "Triton" if kind == "pallas" else "interpreted"
    return (f"kernel: Pallas row gather ({how}) of {view.count} row(s) of {view.inner} "
            f"element(s) in each of {view.outer} slice(s), where a row holds "
            f"{MIN_ROW_BYTES} bytes or more (else lax.gather)")


def blocks(inner: int, block_elements: int = _BLOCK_ELEMENTS,
           max_segment: int = _MAX_SEGMENT) -> tuple[int, int]:
    """``(bm, bd)``: rows and row elements per program, powers of two (Triton's rule),
    one rule for every data width. The defaults are a first guess;
    ``.ci/gpu-kernel-sweep.py`` measures others on a GPU."""
    bd = min(_next_pow2(inner), max_segment)
    bm = max(1, min(block_elements // bd, 128))
    return bm, bd


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_gather(plan, view: Rows, mode: str, fill, data, idx, interpret: bool,
               tuning: tuple[int, int, int] | None = None):
    """``plan``'s gather of prepared indices ``idx`` by the Pallas kernel, in
    ``plan.out_shape``. ``tuning``: ``(block elements, widest segment, warps)`` in
    place of the defaults (for a sweep on a GPU)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plt

    block_elements, max_segment, num_warps = tuning or (_BLOCK_ELEMENTS, _MAX_SEGMENT,
                                                        _NUM_WARPS)
    bm, bd = blocks(view.inner, block_elements, max_segment)
    data3 = data.reshape(view.outer, view.rows, view.inner)
    idx3 = idx.reshape(view.groups, view.count, view.depth)
    grid = (view.outer, pl.cdiv(view.count, bm), pl.cdiv(view.inner, bd))
    kernel = functools.partial(
        _kernel, bm=bm, bd=bd, bounds=view.bounds, count=view.count, inner=view.inner,
        per_group=view.outer // view.groups, fill=fill if mode == "fill" else None,
        signed=jnp.issubdtype(idx.dtype, jnp.signedinteger))
    anywhere = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        kernel, grid=grid, in_specs=[anywhere, anywhere], out_specs=anywhere,
        out_shape=jax.ShapeDtypeStruct((view.outer, view.count, view.inner), data.dtype),
        interpret=interpret, name="xgather_row_gather",
        compiler_params=None if interpret else plt.CompilerParams(num_warps=num_warps,
                                                                   num_stages=1),
    )(idx3, data3)
    return out.reshape(plan.out_shape)


def _kernel(idx_ref, data_ref, out_ref, *, bm, bd, bounds, count, inner, per_group, fill,
            signed):
    """One program: ``bm`` indices of slice ``o``, columns ``[j*bd, (j+1)*bd)``."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plt

    o, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    r = i * bm + jnp.arange(bm, dtype=jnp.int32)
    c = j * bd + jnp.arange(bd, dtype=jnp.int32)
    r_in = r < count
    group = o // per_group
    row, inside = None, None
    for depth, size in enumerate(bounds):  # the row of each index tuple, row-major
        comp = plt.load(idx_ref.at[group, r, depth], mask=r_in, other=0)
        ok = comp < size
        if signed:
            ok &= comp >= 0
            comp = jnp.maximum(comp, 0)
        comp = jnp.minimum(comp, size - 1).astype(jnp.int32 if _fits32(bounds) else jnp.int64)
        row = comp if row is None else row * size + comp
        inside = ok if inside is None else inside & ok
    both = r_in[:, None] & (c < inner)[None, :] if inner % bd else \
        jnp.broadcast_to(r_in[:, None], (bm, bd))
    # Positions past the end are masked: Triton does not touch them (so the pointers
    # stay plain ramps, which it vectorises), the interpreter reads them clamped and its
    # scatter drops them.
    vals = plt.load(data_ref.at[o, row[:, None], c[None, :]], mask=both, other=0)
    if fill is not None:
        vals = jnp.where(inside[:, None], vals, jnp.asarray(fill, vals.dtype))
    plt.store(out_ref.at[o, r[:, None], c[None, :]], vals, mask=both)


def _fits32(bounds) -> bool:
    return math.prod(bounds) < 2 ** 31
