"""Apple BNNS gathers: ``BNNSGatherND``, gather with a batch-dimension count, gather along an axis.

BNNS documents int32 indices and says nothing of negative or out-of-range
ones. xgather accepts int32 and int64, treats the valid range as ``[0, s-1]``
(a negative index is out of range, not counted from the end), and defaults
to ``mode="error"``; ``"clip"``, ``"fill"`` and ``"promise_in_bounds"`` are
there to choose.
"""

from __future__ import annotations

from xgather import _dtypes, _frontend, _plan
from xgather._dtypes import ArrayLike, Result, Sharding
from xgather._frontend import int_attr, shapes
from xgather._modes import Mode

INDEX_DTYPES = _dtypes.INT32_INDICES
"""The index dtypes the BNNS gathers take."""


def _check(op, data, indices):
    sh = shapes(data, indices, op)
    _dtypes.check_index_dtype(op, indices, INDEX_DTYPES, sh)
    return sh


def _gather_nd_plan(input, indices, batch_dimension_count: int = 0, **_):  # noqa: A002
    sh = _check("bnns.GatherND", input, indices)
    b = int_attr("bnns.GatherND", "batch_dimension_count", batch_dimension_count, sh)
    return _plan.nd_plan("bnns.GatherND", sh["data"], sh["indices"], b, negative=False)


def _gather_plan(input, indices, axis: int, batch_dimension_count: int = 0, **_):  # noqa: A002
    op = "bnns.Gather"
    sh = _check(op, input, indices)
    ax = _plan.normalize_axis(op, axis, len(sh["data"]), sh)
    b = int_attr(op, "batch_dimension_count", batch_dimension_count, sh)
    return _plan.take_plan(op, sh["data"], sh["indices"], ax, b, negative=False)


def _gather_along_axis_plan(input, indices, axis: int, **_):  # noqa: A002
    op = "bnns.GatherAlongAxis"
    sh = _check(op, input, indices)
    ax = _plan.normalize_axis(op, axis, len(sh["data"]), sh)
    return _plan.elements_plan(op, sh["data"], sh["indices"], ax, negative=False,
                               smaller_ok=False)


@_frontend.op(_gather_nd_plan, INDEX_DTYPES)
def gather_nd(input: ArrayLike, indices: ArrayLike, batch_dimension_count: int = 0, *,  # noqa: A002
              mode: Mode | None = None, fill_value=None, out_sharding: Sharding = None) -> Result:
    """``BNNSGatherND``: ``indices`` is a set of lookup vectors along its last axis.

    A lookup vector of length ``k`` shorter than the rank gathers the slice
    ``input[b..., v_0, ..., v_{k-1}, :, ...]``.

    Args:
      input: array of shape ``(b..., d...)``.
      indices: int32/int64 array of shape ``(b..., q..., k)``, each entry in ``[0, d_j - 1]``.
      batch_dimension_count: leading dimensions of ``input`` and ``indices`` that pair up.
      mode: as for [`xgather.onnx.gather`][xgather.onnx.gather].
      fill_value: as for [`xgather.onnx.gather`][xgather.onnx.gather].
      out_sharding: as for [`xgather.onnx.gather`][xgather.onnx.gather].

    Returns:
      Array of shape ``(b..., q..., d[k:]...)``.

    Examples:
        >>> import numpy as np, xgather
        >>> x = np.array([10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33.])
        >>> x = x.reshape(3, 2, 2)
        >>> xgather.bnns.gather_nd(x, np.array([1, 0], np.int32)[None]).tolist()
        [[20.0, 21.0]]
    """


@_frontend.op(_gather_plan, INDEX_DTYPES)
def gather(input: ArrayLike, indices: ArrayLike, axis: int, batch_dimension_count: int = 0, *,  # noqa: A002
           mode: Mode | None = None, fill_value=None, out_sharding: Sharding = None) -> Result:
    """BNNS gather along ``axis`` with ``batch_dimension_count`` leading batch dimensions.

    Returns:
      Array of shape ``input.shape[:axis] + indices.shape[b:] + input.shape[axis+1:]``.

    Examples:
        >>> import xgather
        >>> xgather.bnns.gather([[1, 2, 3], [4, 5, 6]], [[2], [0]], axis=1,
        ...                     batch_dimension_count=1).tolist()
        [[3], [4]]
    """


@_frontend.op(_gather_along_axis_plan, INDEX_DTYPES)
def gather_along_axis(input: ArrayLike, indices: ArrayLike, axis: int, *,  # noqa: A002
                      mode: Mode | None = None, fill_value=None,
                      out_sharding: Sharding = None) -> Result:
    """BNNS gather along an axis, element by element (``numpy.take_along_axis``).

    ``indices`` has ``input``'s shape except on ``axis``; the output has ``indices``' shape.

    Examples:
        >>> import xgather
        >>> out = xgather.bnns.gather_along_axis([[1, 2], [3, 4]], [[1], [0]], axis=1)
        >>> out.tolist()
        [[2], [3]]
    """


__all__ = ["INDEX_DTYPES", "gather", "gather_along_axis", "gather_nd"]
