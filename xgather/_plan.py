"""Shapes and attributes in, a frozen lowering plan out.

A [`Plan`][xgather.Plan] holds only ints, strings and tuples: the normalised attributes,
the ``lax.GatherDimensionNumbers`` and slice sizes of the per-batch gather, and
the output shape. Every static rule of every spec is checked here, at trace
time, before an array is touched. Plans are hashable, so they key the jit cache
and the builders are memoised.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from jax import lax

from xgather import _lower
from xgather._dtypes import as_int
from xgather._errors import fail

Shape = tuple[int, ...]


_WRAP_TEXT = {"separate": "in a pass before the gather, when some index is negative",
              "gather": "in a branch with its own gather, when some index is negative",
              "fused": "inside the gather"}
_WRAP_CHOICE = {"fused": "fused at every size, no branch",
                "by_size": "fused for small gathers and wide slices, else a branch"}

@dataclasses.dataclass(frozen=True)
class Plan:
    """How one gather call is lowered to ``lax.gather``.

    Attributes:
      op: the operator and version, e.g. ``"onnx.Gather-13"``.
      data_shape: the shape of ``data`` the plan was made for.
      indices_shape: the shape of ``indices`` the plan was made for.
      out_shape: the shape of the result.
      batch_dims: leading dimensions of ``data`` and ``indices`` that pair up
        one to one (``jax.vmap`` over them, or XLA batching dimensions).
      index_axes: the axes of ``data`` that the index components address.
      index_vector: True when the last dimension of ``indices`` holds index
        tuples (GatherND); False when each element is one index.
      negative: whether negative indices count from the end.
      dimension_numbers: the ``lax.GatherDimensionNumbers`` of the per-batch
        ``lax.gather`` (the batch dimensions removed where ``lowering`` is
        ``"vmap"``).
      slice_sizes: the slice sizes of that ``lax.gather``.
      gather_shape: the shape ``lax.gather`` yields; it differs from
        ``out_shape`` only where a spec reshapes the result (OpenVINO
        GatherND-5 folds the batch dimensions into one).
      data_crop: for element gathers whose indices are smaller than ``data``
        off the axis, the leading box of ``data`` that is read.
      lowering: ``"vmap"`` (the reference path: ``jax.vmap`` over the batch
        dims), ``"batching_dims"`` (XLA batching dimensions, for element
        gathers), ``"vmap+row_batching"`` (gathers along an inner axis: the
        dims before the axis become batching dims too, see ``index_broadcast``),
        or ``"linear"`` (element gathers: one linear index into the flattened
        data, ``jax.vmap`` over any batch dims). Chosen per platform by
        ``xgather._lower``.
      index_broadcast: leading dims the per-batch indices are broadcast over
        (``"vmap+row_batching"``); each row then gathers its own elements, so
        XLA writes the output in order instead of gathering columns and
        transposing them.
      platform: the platform the lowering was chosen for (``"cpu"``,
        ``"gpu"``, ``"tpu"``; JAX's default backend when the plan was made, or
        the one [`xgather.lowering`][xgather.lowering] set). Every lowering is exact on every
        platform.
      wrap: the platform's choice of where negative indices are wrapped
        (``xgather._lower.Choices.wrap``): ``"fused"`` (always inside the gather:
        GPU, TPU) or ``"by_size"`` (XLA:CPU: ``wrap_pass`` by the sizes).
      wrap_pass: where negative indices are wrapped: ``"fused"`` (inside the
        gather's loop: small gathers, where a branch would cost more than the
        wrap, and gathers of slices of ``ROW_SLICE`` elements or more, where
        the wrap is computed once per slice), or, for larger gathers of smaller
        slices, in a branch taken only when some index is outside ``[0, s-1]``
        (one pass over the indices asks), once per index rather than once per
        element copied: ``"separate"`` (indices reused for ``ROWS`` or more
        elements each, e.g. along the last axis: the branch returns the wrapped
        indices) or ``"gather"`` (element gathers: each branch holds the gather
        too). Unused where negative indices do not wrap.
      model_opset: for ONNX ops, the model's opset_import that ``op``'s version
        was resolved from (``"onnx.Gather-13"`` at model opset 21); ``None`` elsewhere.
    """

    op: str
    data_shape: Shape
    indices_shape: Shape
    out_shape: Shape
    batch_dims: int
    index_axes: tuple[int, ...]
    index_vector: bool
    negative: bool
    dimension_numbers: lax.GatherDimensionNumbers
    slice_sizes: Shape
    gather_shape: Shape
    data_crop: Shape | None = None
    lowering: str = "vmap"
    index_broadcast: Shape = ()
    platform: str = "cpu"
    wrap: str = "by_size"
    model_opset: int | None = None
    #: Lines that [`xgather.explain`][xgather.explain] adds: what the call makes of the
    #: plan as traced then (the form of the bound check's flag). Not part of the plan's
    #: identity.
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def index_count(self) -> int:
        """How many indices (index tuples for GatherND) ``indices`` holds."""
        return math.prod(self.indices_shape[:-1] if self.index_vector else self.indices_shape)

    @property
    def wrap_pass(self) -> str:
        return _lower.wrap_pass(self)

    @property
    def flag_form(self) -> str:
        """How a reduction "is any index bad (or negative)" runs on the plan's platform
        (``xgather._lower.Choices.flag``)."""
        return _lower.choices(self.platform).flag

    @property
    def small(self) -> bool:
        """Whether the gather writes few values (``xgather._lower.small``)."""
        return _lower.small(self)

    @property
    def shapes(self) -> dict[str, Shape]:
        """The shapes of ``data`` and ``indices``, as an error message shows them."""
        return {"data": self.data_shape, "indices": self.indices_shape}

    @property
    def bounds(self) -> Shape:
        """The size ``s`` of each addressed axis; valid indices lie in ``[-s, s-1]``."""
        return tuple(self.data_shape[a] for a in self.index_axes)

    def __str__(self) -> str:
        dn = self.dimension_numbers
        at = "" if self.model_opset is None else f" (model opset {self.model_opset})"
        lines = [
            f"{self.op}{at}: data{self.data_shape} indices{self.indices_shape}"
            f" -> out{self.out_shape}",
            f"  lowering: {self.lowering}"
            + (f" over {self.batch_dims} batch dim(s)" if self.batch_dims else "")
            + f" (chosen for the {self.platform} platform)",
            f"  index axes of data: {self.index_axes} (bounds {self.bounds}),"
            + (f" negative indices wrap ({_WRAP_TEXT[self.wrap_pass]};"
               f" the {self.platform} platform's wrap: {_WRAP_CHOICE[self.wrap]})"
               if self.negative
               else " negative indices are out of range"),
            f"  lax.gather: offset_dims={dn.offset_dims}"
            f" collapsed_slice_dims={dn.collapsed_slice_dims}"
            f" start_index_map={dn.start_index_map}"
            f" operand_batching_dims={dn.operand_batching_dims}"
            f" start_indices_batching_dims={dn.start_indices_batching_dims}",
            f"  slice_sizes={self.slice_sizes} gather_shape={self.gather_shape}",
        ]
        if self.index_broadcast:
            lines.append(f"  indices broadcast over leading dims {self.index_broadcast}")
        if self.data_crop is not None:
            lines.append(f"  data cropped to {self.data_crop} before the gather")
        lines.extend("  " + note for note in self.notes)
        return "\n".join(lines)


def normalize_axis(op: str, axis: int, rank: int, shapes, name: str = "axis") -> int:
    """``axis`` in ``[-rank, rank-1]`` made non-negative, else a spec error."""
    if rank < 1:
        fail(op, "data must have rank >= 1", f"rank {rank}", shapes)
    number = as_int(axis)  # Python and NumPy integers (0-d arrays too), not bools or floats
    if number is None:
        fail(op, f"{name} must be an int (a Python or NumPy integer)", repr(axis), shapes)
    axis = number
    if not -rank <= axis < rank:
        fail(op, f"{name} must be in [{-rank}, {rank - 1}] for data of rank {rank}",
             f"{name}={axis}", shapes)
    return axis + rank if axis < 0 else axis


#: The batch-dimension attribute's name where a spec does not call it ``batch_dims``.
_BATCH_NAMES = {"bnns.Gather": "batch_dimension_count", "bnns.GatherND": "batch_dimension_count"}


def _batch(op: str) -> str:
    """What ``op``'s spec calls its batch-dimension count, for error messages."""
    return _BATCH_NAMES.get(op, "batch_dims")


def _known_sizes(op: str, shape: Shape, axes, what: str, shapes) -> None:
    """The axes of ``shape`` that the indices address (or whose count is an attribute)
    must have known sizes: the bounds an index is checked against are numbers."""
    for a in axes:
        if not _lower.known(shape[a]):
            fail(op, f"{what}.shape[{a}] must be a known size, not a symbolic dimension "
                 f"({_WHY_KNOWN[what]})", f"{what}.shape[{a}]={shape[a]}", shapes)


_WHY_KNOWN = {"data": "the indices address this axis, and are checked, wrapped or clamped "
                      "against its size",
              "indices": "it holds the length of the index tuples"}


def _check_batch_shapes(op: str, data_shape: Shape, indices_shape: Shape, b: int, shapes) -> None:
    # Exact equality, dimension by dimension: equal products are not enough.
    if data_shape[:b] != indices_shape[:b]:
        fail(op, f"the first {_batch(op)}={b} dimensions of data and indices must be equal",
             f"{data_shape[:b]} and {indices_shape[:b]}", shapes)


def take_plan(op: str, data_shape: Shape, indices_shape: Shape, axis: int,
              batch_dims: int = 0, negative: bool = True, platform: str | None = None) -> Plan:
    """Gather along one axis: ``out = data[:axis] + indices[b:] + data[axis+1:]``.

    ``axis`` and ``batch_dims`` must already be non-negative (the frontends
    normalise them with their own spec's rule).
    """
    return _take_plan(op, tuple(data_shape), tuple(indices_shape), axis, batch_dims, negative,
                      _lower.choices(platform))


@functools.lru_cache(maxsize=4096)
def _take_plan(op: str, data_shape: Shape, indices_shape: Shape, axis: int, batch_dims: int,
               negative: bool, chosen: _lower.Choices) -> Plan:
    shapes = {"data": data_shape, "indices": indices_shape}
    r = len(data_shape)
    if r < 1:
        fail(op, "data must have rank >= 1", f"rank {r}", shapes)
    b = batch_dims
    if not 0 <= axis < r:
        fail(op, f"axis must be in [0, {r - 1}]", f"axis={axis}", shapes)
    if b < 0 or b > len(indices_shape):
        fail(op, f"{_batch(op)} must be in [0, indices.ndim={len(indices_shape)}]",
             f"{_batch(op)}={b}", shapes)
    if b > axis:
        fail(op, f"{_batch(op)} ({b}) must be <= axis ({axis}) after normalisation", None,
             shapes)
    _check_batch_shapes(op, data_shape, indices_shape, b, shapes)
    _known_sizes(op, data_shape, (axis,), "data", shapes)
    d, q, a = data_shape[b:], indices_shape[b:], axis - b
    out = data_shape[:axis] + indices_shape[b:] + data_shape[axis + 1:]
    if a > 0 and chosen.row_batching:
        # A gather inside the array: an offset-dims gather would collect the
        # slices index-major and transpose them (slow on XLA:CPU, above all once the
        # program has a second output such as a checkify flag). Make the dims
        # before the axis batching dims instead, so the output is written in order.
        rows = tuple(range(a))
        tail = len(d) - a - 1
        dn = lax.GatherDimensionNumbers(
            offset_dims=tuple(range(a + len(q), a + len(q) + tail)), collapsed_slice_dims=(a,),
            start_index_map=(a,), operand_batching_dims=rows, start_indices_batching_dims=rows)
        return Plan(op, data_shape, indices_shape, out, b, (axis,), False, negative, dn,
                    (1,) * (a + 1) + d[a + 1:], out, lowering="vmap+row_batching",
                    index_broadcast=d[:a], platform=chosen.platform, wrap=chosen.wrap)
    per_out = d[:a] + q + d[a + 1:]
    offset = tuple(range(a)) + tuple(range(a + len(q), len(per_out)))
    dn = lax.GatherDimensionNumbers(
        offset_dims=offset, collapsed_slice_dims=(a,), start_index_map=(a,))
    return Plan(op, data_shape, indices_shape, out, b, (axis,), False, negative, dn,
                d[:a] + (1,) + d[a + 1:], out, platform=chosen.platform, wrap=chosen.wrap)


def nd_plan(op: str, data_shape: Shape, indices_shape: Shape, batch_dims: int = 0,
            negative: bool = True, fold_batch: bool = False,
            platform: str | None = None) -> Plan:
    """Gather index tuples: ``out = indices[:-1] + data[b + k:]`` with ``k = indices.shape[-1]``.

    ``fold_batch`` folds the ``b`` batch dimensions of the result into one
    (OpenVINO GatherND-5).
    """
    return _nd_plan(op, tuple(data_shape), tuple(indices_shape), batch_dims, negative,
                    fold_batch, _lower.choices(platform))


@functools.lru_cache(maxsize=4096)
def _nd_plan(op: str, data_shape: Shape, indices_shape: Shape, batch_dims: int, negative: bool,
             fold_batch: bool, chosen: _lower.Choices) -> Plan:
    shapes = {"data": data_shape, "indices": indices_shape}
    r, q, b = len(data_shape), len(indices_shape), batch_dims
    if r < 1:
        fail(op, "data must have rank >= 1", f"rank {r}", shapes)
    if q < 1:
        fail(op, "indices must have rank >= 1 (the last dimension holds the index tuples)",
             f"rank {q}", shapes)
    if isinstance(b, bool) or not isinstance(b, int) or b < 0:
        fail(op, f"{_batch(op)} must be a non-negative int", f"{_batch(op)}={b!r}", shapes)
    if b >= min(q, r):
        fail(op, f"{_batch(op)} must be < min(data.ndim, indices.ndim) = {min(q, r)}",
             f"{_batch(op)}={b}", shapes)
    _check_batch_shapes(op, data_shape, indices_shape, b, shapes)
    _known_sizes(op, indices_shape, (q - 1,), "indices", shapes)
    k = indices_shape[-1]
    if not 1 <= k <= r - b:
        fail(op, f"indices.shape[-1] must be in [1, data.ndim - {_batch(op)} = {r - b}]",
             f"indices.shape[-1]={k}", shapes)
    _known_sizes(op, data_shape, range(b, b + k), "data", shapes)
    d, qq = data_shape[b:], indices_shape[b:-1]
    dn = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(len(qq), len(qq) + len(d) - k)),
        collapsed_slice_dims=tuple(range(k)), start_index_map=tuple(range(k)))
    gathered = indices_shape[:-1] + data_shape[b + k:]
    out = gathered
    if fold_batch and b:
        out = (math.prod(indices_shape[:b]),) + indices_shape[b:-1] + data_shape[b + k:]
    if k == len(d) and _linear(chosen, d):  # single elements: one linear index each
        return Plan(op, data_shape, indices_shape, out, b, tuple(range(b, b + k)), True,
                    negative, _LINEAR, (1,), gathered, lowering="linear",
                    platform=chosen.platform, wrap=chosen.wrap)
    return Plan(op, data_shape, indices_shape, out, b, tuple(range(b, b + k)), True, negative,
                dn, (1,) * k + d[k:], gathered, platform=chosen.platform, wrap=chosen.wrap)


def elements_plan(op: str, data_shape: Shape, indices_shape: Shape, axis: int,
                  negative: bool = True, smaller_ok: bool = True,
                  platform: str | None = None) -> Plan:
    """Gather one element per index: ``out[i] = data[i with i[axis] = indices[i]]``.

    Off the axis, ``indices`` may be smaller than ``data`` when ``smaller_ok``
    (onnxruntime's rule; OpenVINO asks for equality). The other axes become
    XLA batching dimensions, so no index tuples are materialised.
    """
    return _elements_plan(op, tuple(data_shape), tuple(indices_shape), axis, negative,
                          smaller_ok, _lower.choices(platform))


@functools.lru_cache(maxsize=4096)
def _elements_plan(op: str, data_shape: Shape, indices_shape: Shape, axis: int, negative: bool,
                   smaller_ok: bool, chosen: _lower.Choices) -> Plan:
    shapes = {"data": data_shape, "indices": indices_shape}
    r = len(data_shape)
    if r < 1:
        fail(op, "data must have rank >= 1", f"rank {r}", shapes)
    if len(indices_shape) != r:
        fail(op, f"indices must have the same rank as data ({r})",
             f"rank {len(indices_shape)}", shapes)
    if not 0 <= axis < r:
        fail(op, f"axis must be in [0, {r - 1}]", f"axis={axis}", shapes)
    _known_sizes(op, data_shape, (axis,), "data", shapes)
    for i, (n, m) in enumerate(zip(indices_shape, data_shape, strict=True)):
        if i == axis or n == m:
            continue
        if not (_lower.known(n) and _lower.known(m)):
            fail(op, f"indices.shape[{i}] and data.shape[{i}] off the gather axis must be the "
                 "same dimension where either is symbolic", f"{n} vs {m}", shapes)
        if n > m or not smaller_ok:
            rel = "<=" if smaller_ok else "=="
            fail(op, f"indices.shape[{i}] must be {rel} data.shape[{i}] off the gather axis",
                 f"{n} vs {m}", shapes)
    crop = tuple(m if i == axis else n
                 for i, (n, m) in enumerate(zip(indices_shape, data_shape, strict=True)))
    others = tuple(i for i in range(r) if i != axis)
    dn = lax.GatherDimensionNumbers(
        offset_dims=(), collapsed_slice_dims=(axis,), start_index_map=(axis,),
        operand_batching_dims=others, start_indices_batching_dims=others)
    if _linear(chosen, data_shape):
        return Plan(op, data_shape, indices_shape, indices_shape, 0, (axis,), False, negative,
                    _LINEAR, (1,), indices_shape, lowering="linear",
                    platform=chosen.platform, wrap=chosen.wrap)
    return Plan(op, data_shape, indices_shape, indices_shape, 0, (axis,), False, negative, dn,
                (1,) * r, indices_shape, crop if crop != data_shape else None, "batching_dims",
                platform=chosen.platform, wrap=chosen.wrap)


#: The gather of the ``"linear"`` lowering: one element of the flattened data per index.
_LINEAR = lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,),
                                     start_index_map=(0,))


def _linear(chosen: _lower.Choices, shape: Shape) -> bool:
    """Whether an element gather from ``shape`` takes the ``"linear"`` lowering: the
    platform's choice, where every position of the flattened data fits an int32 (the
    narrowest index a linear position may need)."""
    return (chosen.element_gather == "linear" and all(map(_lower.known, shape))
            and 0 < math.prod(shape) < 2**31)


__all__ = ["Plan", "elements_plan", "nd_plan", "normalize_axis", "take_plan"]
