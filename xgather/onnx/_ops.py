"""ONNX ``Gather`` (opsets 1, 11, 13), ``GatherND`` (11, 12, 13), ``GatherElements`` (11, 13).

Choices where the spec text is silent, following onnxruntime:

* Negative indices count from the end in every opset, opset 1 included (its
  text says only "within bounds"; onnxruntime treats all Gather versions alike).
* ``GatherND`` accepts int32 indices as well as the spec's int64.
* ``GatherElements`` accepts ``indices`` smaller than ``data`` off the gather
  axis (the output has ``indices``' shape); larger is an error.
* The first ``batch_dims`` dimensions of ``GatherND``'s inputs must be equal
  one by one (onnxruntime only compares their products; xgather does not).

Out-of-range indices are an error in every ONNX op, so ``mode=None`` is
``"error"`` (or the process default, see ``xgather._modes``).

``opset=`` is the model's opset_import, as in an ONNX file (17, 21, ...): the op
version in force there is used, as onnxruntime does ([`op_version`][xgather.onnx.op_version]), and
``xgather.explain`` shows both (``onnx.Gather-13 (model opset 21)``).
The model adapters (``xgather.onnx._models``) bring whole nodes and models in.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np

from xgather import _dtypes, _frontend, _plan
from xgather._dtypes import ArrayLike, Result, Sharding
from xgather._errors import fail
from xgather._frontend import bool_option, int_attr, shapes
from xgather._modes import Mode

VERSIONS: Mapping[str, tuple[int, ...]] = {
    "Gather": (1, 11, 13),
    "GatherND": (11, 12, 13),
    "GatherElements": (11, 13),
}
"""The versions of each served op: the opsets in which its definition changed."""

#: Each op's attributes, their ONNX defaults, and the op version they appear in.
ATTRIBUTES: Mapping[str, Mapping[str, tuple[int, int]]] = {
    "Gather": {"axis": (0, 1)},
    "GatherND": {"batch_dims": (0, 12)},
    "GatherElements": {"axis": (0, 11)},
}


def op_version(op_type: str, opset: int) -> int:
    """The version of ``op_type`` in force in a model whose opset_import is ``opset``.

    The newest version not above ``opset``, as onnxruntime resolves it (and as
    ``onnx.defs.get_schema(op_type, opset).since_version`` says): Gather 1, 11,
    13; GatherND 11, 12, 13; GatherElements 11, 13. An opset before the op
    existed is an error. Opsets above the newest version take the newest: no
    opset up to 26 changed these ops.

    Examples:
        >>> op_version("Gather", 21), op_version("GatherND", 12)
        (13, 12)
        >>> op_version("GatherElements", 12)
        11
    """
    if op_type not in VERSIONS:
        fail("xgather.onnx", f"op_type must be one of {', '.join(VERSIONS)}", repr(op_type))
    op = f"onnx.{op_type}"
    if isinstance(opset, bool) or not isinstance(opset, int | np.integer):
        fail(op, "opset must be an int (the model's opset_import version)", repr(opset))
    versions = VERSIONS[op_type]
    if opset < versions[0]:
        fail(op, f"{op_type} exists from opset {versions[0]} on", f"opset={opset}")
    return max(v for v in versions if v <= opset)


def resolve(op_type: str, opset: int) -> tuple[str, int]:
    """``("onnx.Gather-13", 13)`` for a model opset: the op's label and its version."""
    version = op_version(op_type, opset)
    return f"onnx.{op_type}-{version}", version


INDEX_DTYPES = _dtypes.INT32_INDICES
"""The index dtypes the ONNX ops take (``Tind``; GatherND also int32, as onnxruntime)."""


@functools.lru_cache(maxsize=4096)
def _with_model_opset(plan: _plan.Plan, opset: int) -> _plan.Plan:
    """The plan, noting the model opset its op version was resolved from."""
    return dataclasses.replace(plan, model_opset=int(opset))


def _check_types(op: str, version: int, data, indices, sh) -> None:
    """The op version's type constraints: T (bfloat16 from version 13) and Tind."""
    if version >= 13:
        _dtypes.check_data_type(op, data, _dtypes.ONNX_DATA_13, sh)
    else:
        _dtypes.check_data_type(op, data, _dtypes.ONNX_DATA, sh,
                                note="; bfloat16 comes with version 13 (model opset 13 on)")
    _dtypes.check_index_dtype(op, indices, INDEX_DTYPES, sh)


def _gather_plan(data, indices, axis: int = 0, *, opset: int = 13, negative_indices=True,
                 **_) -> _plan.Plan:
    op, version = resolve("Gather", opset)
    sh = shapes(data, indices, op)
    _check_types(op, version, data, indices, sh)
    ax = _plan.normalize_axis(op, axis, len(sh["data"]), sh)
    negative = bool_option(op, "negative_indices", negative_indices, sh)
    plan = _plan.take_plan(op, sh["data"], sh["indices"], ax, 0, negative)
    return _with_model_opset(plan, opset)


def _gather_nd_plan(data, indices, batch_dims: int = 0, *, opset: int = 13,
                    negative_indices=True, **_) -> _plan.Plan:
    op, version = resolve("GatherND", opset)
    sh = shapes(data, indices, op)
    _check_types(op, version, data, indices, sh)
    batch_dims = int_attr(op, "batch_dims", batch_dims, sh)
    if version == 11 and batch_dims != 0:
        fail(op, "batch_dims exists from opset 12 on", f"batch_dims={batch_dims}", sh)
    negative = bool_option(op, "negative_indices", negative_indices, sh)
    plan = _plan.nd_plan(op, sh["data"], sh["indices"], batch_dims, negative)
    return _with_model_opset(plan, opset)


def _gather_elements_plan(data, indices, axis: int = 0, *, opset: int = 13,
                          negative_indices=True, **_) -> _plan.Plan:
    op, version = resolve("GatherElements", opset)
    sh = shapes(data, indices, op)
    _check_types(op, version, data, indices, sh)
    ax = _plan.normalize_axis(op, axis, len(sh["data"]), sh)
    negative = bool_option(op, "negative_indices", negative_indices, sh)
    plan = _plan.elements_plan(op, sh["data"], sh["indices"], ax, negative, True)
    return _with_model_opset(plan, opset)


@_frontend.op(_gather_plan, INDEX_DTYPES)
def gather(data: ArrayLike, indices: ArrayLike, axis: int = 0, *, opset: int = 13,
           mode: Mode | None = None, fill_value=None, indices_are_sorted: bool = False,
           unique_indices: bool = False, negative_indices: bool = True,
           out_sharding: Sharding = None) -> Result:
    """ONNX ``Gather``: slices of ``data`` along ``axis`` picked by ``indices``.

    Args:
      data: array of shape ``(d_0, ..., d_{r-1})``, ``r >= 1``.
      indices: int32/int64 array of any shape ``(q...)``; entries in ``[-s, s-1]``
        with ``s = d_axis``, negative ones counting from the end.
      axis: in ``[-r, r-1]``.
      opset: the model's opset_import (any opset from 1 on, e.g. 21); the op
        version in force there is used (1 up to opset 10, 11 for 11-12, 13 from 13).
      mode: out-of-range handling (see ``xgather._modes``); ``None`` is the
        spec's rule, an error.
      fill_value: the value of out-of-range slots with ``mode="fill"`` (0).
      indices_are_sorted: a promise that the wrapped positions are sorted, passed to
        ``lax.gather`` (and so to the gradient's scatter).
      unique_indices: a promise that the wrapped positions are distinct, passed to
        ``lax.gather`` (and so to the gradient's scatter).
      negative_indices: ``False`` narrows the valid range to ``[0, s-1]``: no
        negative-index wrap (a pass over the indices saved), and a negative index
        is out of range (an error, clamped to 0, or filled, as ``mode`` says).
        Every op of [`xgather.onnx`][xgather.onnx], [`xgather.openvino`][xgather.openvino] and
        [`xgather.labview`][xgather.labview] takes it (BNNS's range is ``[0, s-1]`` already).
      out_sharding: where the result lives, as in ``jnp.ndarray.at[...].get``: a
        ``NamedSharding``, or a ``PartitionSpec`` of the mesh set with
        ``jax.set_mesh``. On a mesh's Explicit axes JAX needs it for a gather along
        a sharded axis; the gather then runs on those axes made Auto (XLA chooses
        the communication). Every op takes it.

    Returns:
      Array of shape ``d[:axis] + (q...) + d[axis+1:]`` with ``data``'s dtype.

    Examples:
        >>> import xgather
        >>> xgather.onnx.gather([[1, 2], [3, 4], [5, 6]], [[0, -1]]).tolist()
        [[[1, 2], [5, 6]]]
    """


@_frontend.op(_gather_nd_plan, INDEX_DTYPES)
def gather_nd(data: ArrayLike, indices: ArrayLike, batch_dims: int = 0, *, opset: int = 13,
              mode: Mode | None = None, fill_value=None, indices_are_sorted: bool = False,
              unique_indices: bool = False, negative_indices: bool = True,
              out_sharding: Sharding = None) -> Result:
    """ONNX ``GatherND``: slices of ``data`` addressed by index tuples.

    The keyword options (``mode``, ``fill_value``, ``indices_are_sorted``,
    ``unique_indices``, ``negative_indices``, ``out_sharding``) are as for
    [`gather`][xgather.onnx.gather].

    Args:
      data: array of shape ``(b..., d...)`` with ``len(b) == batch_dims``, rank ``r >= 1``.
      indices: int64 (or int32) array of shape ``(b..., q..., k)``, ``1 <= k <= r - batch_dims``;
        component ``j`` lies in ``[-s_j, s_j - 1]`` with ``s_j = d[j]``.
      batch_dims: ``0 <= batch_dims < min(r, indices.ndim)``; opset 12 and later.
      opset: the model's opset_import, from 11 on (GatherND-11 at 11, -12 at 12,
        -13 from 13).

    Returns:
      Array of shape ``(b..., q..., d[k:]...)`` with ``data``'s dtype.

    Examples:
        >>> import xgather
        >>> xgather.onnx.gather_nd([[0, 1], [2, 3]], [[0, 0], [1, -1]]).tolist()
        [0, 3]
    """


@_frontend.op(_gather_elements_plan, INDEX_DTYPES)
def gather_elements(data: ArrayLike, indices: ArrayLike, axis: int = 0, *, opset: int = 13,
                    mode: Mode | None = None, fill_value=None, indices_are_sorted: bool = False,
                    unique_indices: bool = False, negative_indices: bool = True,
                    out_sharding: Sharding = None) -> Result:
    """ONNX ``GatherElements``: ``out[i] = data[i_0, ..., indices[i], ..., i_{r-1}]``.

    The keyword options (``mode``, ``fill_value``, ``indices_are_sorted``,
    ``unique_indices``, ``negative_indices``, ``out_sharding``) are as for
    [`gather`][xgather.onnx.gather].

    Args:
      data: array of rank ``r >= 1``.
      indices: int32/int64 array of rank ``r``; off ``axis`` each dimension is at
        most ``data``'s; entries in ``[-s, s-1]`` with ``s = data.shape[axis]``.
      axis: in ``[-r, r-1]``.
      opset: the model's opset_import, from 11 on (GatherElements-11 at 11-12,
        -13 from 13).

    Returns:
      Array of ``indices``' shape with ``data``'s dtype.

    Examples:
        >>> import xgather
        >>> out = xgather.onnx.gather_elements([[1, 2], [3, 4]], [[0, 0], [1, 0]],
        ...                                    axis=1)
        >>> out.tolist()
        [[1, 1], [4, 3]]
    """
