"""Gather from a table sharded along its rows, without assembling the table anywhere.

[`gather`][xgather.sharded.gather] is ONNX ``Gather-13`` along axis 0 (an embedding lookup) for a
``data`` whose rows are spread over a mesh axis. Every device gathers the
rows it owns (a masked local gather) and a collective combines the partial
results: ``psum`` when the indices are replicated or sharded over another mesh
axis, ``psum_scatter`` when they are sharded over the same axis as the rows
(the indices, which are small, are all-gathered first). No device ever holds
the whole table, and the gradient's scatter-add stays sharded like ``data``.

The bound check, the negative-index wrap and the out-of-range modes run on the
global indices before the collective step, so an error reports the global
index and its global position, exactly as the unsharded op does.

The plain ops (``xgather.onnx.gather`` and the rest) also accept sharded
inputs under ``jax.jit``: XLA's SPMD partitioner then decides the
communication, which for a row-sharded table may mean gathering it whole.
"""

from __future__ import annotations

from collections.abc import Hashable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xgather import _apply, _check, _dtypes, _frontend, _grad, _indices, _plan
from xgather._dtypes import ArrayLike
from xgather._errors import XGatherTypeError, fail
from xgather._frontend import resolve_call, shapes
from xgather._gather import Call
from xgather._modes import Mode


def _gather_plan(data, indices, mesh: Mesh, rows: str, batch: str | None = None, **_):
    op = "sharded.Gather"
    sh = shapes(data, indices, op)
    _dtypes.check_index_dtype(op, indices, _dtypes.INT32_INDICES, sh)
    if not isinstance(mesh, Mesh):
        fail(op, "mesh must be a jax.sharding.Mesh", type(mesh).__qualname__, sh)
    if not isinstance(rows, Hashable) or rows not in mesh.shape:
        fail(op, f"rows must name an axis of the mesh {dict(mesh.shape)}", repr(rows), sh)
    if batch is not None and (not isinstance(batch, Hashable) or batch not in mesh.shape):
        fail(op, f"batch must name an axis of the mesh {dict(mesh.shape)} or be None",
             repr(batch), sh)
    n = mesh.shape[rows]
    if not sh["data"] or sh["data"][0] % n:
        fail(op, f"data.shape[0] must be a multiple of the {n} devices on mesh axis {rows!r}",
             str(sh["data"][:1]), sh)
    if batch is not None and (not sh["indices"] or sh["indices"][0] % mesh.shape[batch]):
        fail(op, f"indices.shape[0] must be a multiple of the {mesh.shape[batch]} devices on "
             f"mesh axis {batch!r}", str(sh["indices"][:1]), sh)
    return _plan.take_plan(op, sh["data"], sh["indices"], 0, 0, True)


def _run(plan, data, indices, mesh, rows, batch, mode, fill_value):
    _check_device_data(plan, data)
    call, idx, _ = resolve_call(plan, data, indices, _dtypes.INT32_INDICES, mode, fill_value)

    def run(data, indices):
        run_mode = _apply.check_now_or_later(plan, call.mode, indices)
        return _sharded(plan, mesh, rows, batch, run_mode, call.fill_value)(data, indices)
    if _dtypes.is_traced(data, idx):
        return run(data, idx)
    # An eager call: the caller's NumPy buffers are copied (or waited for) first, so that
    # the check and the program read what was passed (``xgather._apply.held``).
    return _apply.held(run, data, idx)(data, idx)


@_frontend.op(_gather_plan, _dtypes.INT32_INDICES, run=_run)
def gather(data: ArrayLike, indices: ArrayLike, mesh: Mesh, rows: str, batch: str | None = None,
           *, mode: Mode | None = None, fill_value=None) -> jax.Array:
    """ONNX Gather-13 along axis 0 of a row-sharded table, with no device holding it all.

    Args:
      data: array of shape ``(n, d...)``, sharded (or to be sharded) as
        ``P(rows)`` over ``mesh``; ``n`` a multiple of ``mesh.shape[rows]``. Its
        dtype must live on the devices: no strings, and 64-bit NumPy data only
        with ``jax_enable_x64`` (an error otherwise, not a cut to 32 bits).
      indices: int32/int64 array of shape ``(q...)``, entries in ``[-n, n-1]``.
      mesh: the device mesh (a ``jax.sharding.Mesh``, Auto or Explicit axes).
      rows: the mesh axis the rows of ``data`` are spread over.
      batch: the mesh axis ``indices`` are split over along their first
        dimension, or None (replicated). It may equal ``rows``.
      mode: as for [`xgather.onnx.gather`][xgather.onnx.gather] (default ``"error"``).
      fill_value: as for [`xgather.onnx.gather`][xgather.onnx.gather].

    Returns:
      Array of shape ``(q..., d...)``, sharded as ``P(batch)``.
    """


def _check_device_data(plan, data) -> None:
    """Data this path can keep on the devices: the plain ops' host path (strings; 64-bit
    NumPy data while x64 is off) would assemble the whole table on the host."""
    if not _dtypes.needs_host(data):
        return
    sh = plan.shapes
    name = _dtypes.data_type(data)
    if name == "string":
        rule = "string data cannot be sharded over devices (JAX holds no strings)"
    elif name in _dtypes._WIDE:
        rule = ("64-bit data needs jax_enable_x64 on this path (it keeps data on the devices); "
                "with x64 off JAX would cut it to 32 bits: enable x64 or convert the data")
    else:
        rule = "data must have a dtype JAX can hold on the devices"
    fail(plan.op, rule, name, sh, kind=XGatherTypeError)


def _combine(part, reduce):
    """``reduce`` (a sum over devices) of the parts, where one device holds each value and
    the others zeros: summed as bits, so that every value comes back as it was (bools stay
    bools; -0.0, subnormals and NaN payloads survive, which a float sum does not keep). The
    tangent is the plain sum, linear for reverse mode."""
    @jax.custom_jvp
    def exact(p):
        return _bit_sum(p, reduce)

    @exact.defjvp
    def _(primals, tangents):
        return exact(primals[0]), reduce(tangents[0])

    return exact(part)


def _bit_sum(x, reduce):
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        return reduce(x.astype(np.uint8)).astype(np.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return lax.complex(_bit_sum(jnp.real(x), reduce), _bit_sum(jnp.imag(x), reduce))
    if jnp.issubdtype(dtype, jnp.floating):
        bits = np.dtype(f"uint{8 * dtype.itemsize}")
        return lax.bitcast_convert_type(reduce(lax.bitcast_convert_type(x, bits)), dtype)
    return reduce(x)


@_apply.jit_cache
def _sharded(plan, mesh, rows, batch, mode, fill_value):
    """The jitted gather, one per settled call: an eager call of the same shapes and options
    compiles once."""
    n_rows = plan.data_shape[0]
    local_rows = n_rows // mesh.shape[rows]
    q = len(plan.indices_shape)
    spec_i = P(batch) if q else P()
    tail = (None,) * (len(plan.data_shape) - 1)

    def local(d, i):
        if batch == rows:  # the rows' owners need every index: all-gather the (small) indices
            i = lax.all_gather(i, rows, axis=0, tiled=True)
        start = lax.axis_index(rows) * local_rows
        j = i - start
        # Rows owned elsewhere become out of range here: "fill" reads 0 for them and
        # drops their gradient, so the sum over devices is the gather.
        j = jnp.where((j >= 0) & (j < local_rows), j, local_rows)
        local_plan = _plan.take_plan(plan.op, d.shape, j.shape, 0, 0, False)
        part = _grad.gather(Call(local_plan, "fill", 0), d, j)
        if batch == rows:
            return _combine(part, lambda x: lax.psum_scatter(x, rows, scatter_dimension=0,
                                                             tiled=True))
        return _combine(part, lambda x: lax.psum(x, rows))

    body = jax.shard_map(local, mesh=mesh, in_specs=(P(rows, *tail), spec_i),
                         out_specs=spec_i)

    data_sharding = NamedSharding(mesh, P(rows, *tail))
    idx_sharding = NamedSharding(mesh, spec_i)
    explicit = any(t == AxisType.Explicit for t in mesh.axis_types)

    def place(x, sharding):
        if explicit:
            return jax.sharding.reshard(x, sharding)
        return lax.with_sharding_constraint(x, sharding)

    def run(data, indices):
        with jax.named_scope(plan.op):
            data, indices = place(data, data_sharding), place(indices, idx_sharding)
            # Wrap negatives. The check ("error") is emitted after the collective step:
            # checkify threads the error state of every check before a shard_map through
            # it and out again with one entry per device, which the report then cannot
            # read from explicitly sharded arrays (and a later check cannot update).
            idx = _indices.ready(plan, indices)
            if mode == "clip":
                idx = jnp.clip(idx, 0, n_rows - 1)
            out = body(data, idx)
            if mode == "fill":
                ok = (idx >= 0) & (idx < n_rows)
                fill = jnp.asarray(0 if fill_value is None else fill_value, out.dtype)
                out = jnp.where(ok.reshape(ok.shape + (1,) * (out.ndim - q)), out, fill)
            if mode == "error":  # (its report reads a replicated copy of sharded indices)
                _check.emit(plan, _indices.fit_dtype(plan, indices))
            return out

    return jax.jit(run)


__all__ = ["gather"]
