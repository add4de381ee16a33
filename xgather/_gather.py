"""The one call site of ``lax.gather``: a plan and prepared (wrapped, checked) indices in,
the result out, vmapped over batch dims where the plan says so and placed as asked."""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xgather import _jaxprivate, _modes
from xgather._errors import XGatherTypeError, fail
from xgather._plan import Plan


class Call(NamedTuple):
    """A gather as its call settled it, everything but the arrays: the plan, the mode,
    ``fill_value`` (a Python scalar or None), the promises passed to ``lax.gather``
    about the wrapped positions, where the result lives (``out_sharding``: a
    ``NamedSharding``, or a ``PartitionSpec`` of the mesh in context) and LabVIEW's
    gradient (``(training, coeff)``, see ``xgather._grad``); and, for a traced
    ``"error"`` check, ``where``: the user's file and line that called the op, which its
    report names (part of the key: two call sites of one signature are two programs,
    each reporting its own line). Hashable: the key of the call's jitted program."""

    plan: Plan
    mode: str
    fill_value: Any = None
    indices_are_sorted: bool = False
    unique_indices: bool = False
    out_sharding: Any = None
    grad: tuple[bool, float] | None = None
    where: str | None = None


def gather(call: Call, data, idx):
    """``lax.gather`` on wrapped indices: the one call site, vmapped over batch dims, and
    placed as ``call.out_sharding`` says."""
    if call.out_sharding is None:
        return _gather(call, data, idx)
    return placed(functools.partial(_gather, call), call.out_sharding)(data, idx)


def placed(fn, out_sharding):
    """``fn`` with its result placed as ``out_sharding``.

    On a mesh with Explicit axes, ``fn`` runs with those axes made Auto
    (``jax.sharding.auto_axes``), so that XLA's partitioner chooses how the gather
    reads its inputs, and the result is resharded as asked; this is what
    ``jnp.ndarray.at[...].get(out_sharding=)`` does. On Auto axes the result is
    constrained to it.
    """
    mesh = mesh_of(out_sharding)
    if mesh.explicit_axes:
        return jax.sharding.auto_axes(fn, out_sharding=out_sharding, axes=mesh.explicit_axes)
    return lambda *args: lax.with_sharding_constraint(fn(*args), out_sharding)


def mesh_of(out_sharding):
    """The (abstract) mesh of ``out_sharding``: a ``NamedSharding``'s own, else the one in
    context (``jax.set_mesh``; empty where none is)."""
    if isinstance(out_sharding, jax.sharding.NamedSharding):
        return out_sharding.mesh.abstract_mesh
    return jax.sharding.get_abstract_mesh()


def _gather(call: Call, data, idx):
    plan, mode = call.plan, call.mode
    indices_are_sorted, unique_indices = call.indices_are_sorted, call.unique_indices
    fill = 0 if call.fill_value is None else call.fill_value
    if plan.data_crop is not None:
        data = lax.slice(data, (0,) * data.ndim, plan.data_crop)
    if 0 in plan.bounds:
        # No position exists on an empty axis: every index is out of range.
        no_clamp_into_nothing(plan, mode, idx)
        # full_like keeps data's weak type, as the gather does
        return lax.full_like(data, fill, shape=plan.gather_shape).reshape(plan.out_shape)
    start = idx if plan.index_vector else idx[..., None]
    if mode == "clip":
        unique_indices = False  # clamping can map distinct indices to one position

    def core(d, i):
        if plan.lowering == "linear":
            return _linear(plan, mode, fill, unique_indices, d, i)
        if plan.index_broadcast:
            lead = plan.index_broadcast
            i = jnp.broadcast_to(i[(None,) * len(lead)], lead + i.shape)
        return lax.gather(d, i, plan.dimension_numbers, plan.slice_sizes,
                          mode=_modes.lax_mode(mode),
                          fill_value=fill if mode == "fill" else None,
                          indices_are_sorted=indices_are_sorted, unique_indices=unique_indices)

    if plan.lowering != "batching_dims":  # vmap, vmap+row_batching, linear
        for _ in range(plan.batch_dims):
            core = jax.vmap(core)
    try:
        return core(data, start).reshape(plan.out_shape)
    except ValueError as e:  # vmap over batch dims that an Explicit mesh shards apart
        if "should be sharded the same" not in str(e):
            raise
        fail(plan.op, "on a mesh's Explicit axes, the batch dims of data and indices must be "
             "sharded alike (or give out_sharding=, or make the mesh with AxisType.Auto axes)",
             f"data {_spec(data)}, indices {_spec(idx)} with batch_dims={plan.batch_dims}",
             plan.shapes, kind=XGatherTypeError)
    except _jaxprivate.SHARDING_TYPE_ERROR:  # a result sharding JAX cannot infer
        fail(plan.op, "inputs sharded over a mesh's Explicit axes (jax.make_mesh's default): "
             "there JAX asks a gather from sharded indices, or along a sharded data axis, for "
             "the sharding of its result. Give it as out_sharding= (a NamedSharding, or a "
             "PartitionSpec under jax.set_mesh), make the mesh with axis_types=(AxisType.Auto, "
             "...), reshard the inputs (jax.sharding.reshard), or use xgather.sharded.gather "
             "for a table sharded by rows",
             f"data {_spec(data)}, indices {_spec(idx)}",
             plan.shapes, kind=XGatherTypeError)


def _linear(plan: Plan, mode: str, fill, unique_indices: bool, data, idx):
    """The ``"linear"`` lowering of one batch's element gather: each index (tuple) becomes
    one position of the flattened data, as torch's kernels address elements.

    ``idx`` holds index tuples (GatherND: the last axis) or, for GatherElements, one
    index per output element along ``plan.index_axes[0]``, whose other coordinates are
    the element's own. A component outside its axis would land on another element, so
    ``"clip"`` clamps each component first and ``"fill"`` masks the result where one is
    out of range, as ``lax.gather`` does per component.
    """
    shape = data.shape
    strides = [math.prod(shape[j + 1:]) for j in range(len(shape))]
    dtype = idx.dtype
    if plan.index_vector:
        parts = [(idx[..., j], j) for j in range(idx.shape[-1])]
        out_shape = idx.shape[:-1]
    else:
        axis = plan.index_axes[0]
        out_shape = idx.shape
        parts = [(idx, axis)] + [(lax.broadcasted_iota(dtype, out_shape, j), j)
                                 for j in range(len(shape)) if j != axis]
    valid = None
    if mode in ("clip", "fill"):  # the index components (GatherElements: the first part)
        given, own = parts[:len(plan.index_axes)], parts[len(plan.index_axes):]
        top = [jnp.asarray(shape[j] - 1, dtype) for _, j in given]
        if mode == "fill":
            signed = jnp.issubdtype(dtype, jnp.signedinteger)
            valid = functools.reduce(jnp.logical_and, [
                (c >= 0) & (c <= t) if signed else c <= t
                for (c, _), t in zip(given, top, strict=True)])
        zero = jnp.zeros((), dtype)
        parts = [(lax.clamp(zero, c, t), j)
                 for (c, j), t in zip(given, top, strict=True)] + own
    position = functools.reduce(lax.add, [c * jnp.asarray(strides[j], dtype) if strides[j] != 1
                                          else c for c, j in parts])
    flat = lax.gather(data.reshape(-1), position[..., None], plan.dimension_numbers,
                      plan.slice_sizes, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
                      unique_indices=unique_indices)
    if valid is not None:
        flat = jnp.where(valid, flat, jnp.asarray(fill, data.dtype))
    return flat.reshape(out_shape)


def no_clamp_into_nothing(plan: Plan, mode: str, indices) -> None:
    """``"clip"`` has no position to clamp to where an indexed axis has size 0."""
    if mode == "clip" and 0 in plan.bounds and np.size(indices):
        fail(plan.op, 'mode="clip" cannot clamp into an axis of size 0',
             f"index axes {plan.index_axes}", plan.shapes)


def _spec(x) -> str:
    try:
        return str(jax.typeof(x).sharding.spec)
    except AttributeError:  # pragma: no cover - other JAX versions
        return "sharded"
