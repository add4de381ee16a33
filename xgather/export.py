"""Export JAX functions built on xgather to ONNX with jax2onnx (the ``export`` extra).

[`register_jax2onnx`][xgather.export.register_jax2onnx] adds a plugin to jax2onnx; from then on
``jax2onnx.to_onnx`` exports every xgather op, and [`to_onnx`][xgather.export.to_onnx] does both.
While jax2onnx traces, the plugin gives every op of every spec (they all reach
``lax.gather`` through ``xgather._apply.run``) its export form:

* ``mode="error"``, the spec default of every op but OpenVINO Gather, exports
  with a run-time check, onnxruntime's: its ``Gather``, ``GatherND`` and
  ``GatherElements`` kernels reject an index outside ``[-s, s-1]`` (ONNX calls
  such an index an error for these nodes, but the check is the runtime's). Where
  a node computes the op's forward, the op exports as that node:

  - ``Gather`` (``axis``): ONNX Gather, LabVIEW Gather, BNNS gather with
    ``batch_dimension_count=0`` and OpenVINO Gather with ``batch_dims=0``;
  - ``GatherND`` (``batch_dims``): ONNX, OpenVINO and BNNS GatherND, with a
    ``Reshape`` after it for OpenVINO GatherND-5 (its batch dims folded);
  - ``GatherElements`` (``axis``): ONNX and OpenVINO GatherElements, BNNS
    gather along an axis.

  Where the spec's range is ``[0, s-1]`` (BNNS, ``negative_indices=False``), a
  negative index ``i`` is sent on as ``i - s`` (a compare, a max, a subtraction
  and a select), which the node rejects where it would wrap ``i``. A gather with
  batch dimensions (BNNS gather with ``batch_dimension_count``, OpenVINO Gather
  when ``mode="error"`` is chosen), and any op under ``jax.vmap`` or a
  derivative, takes a guard instead: ``Gather(Range(0, s, 1), indices)`` (one
  per component of index tuples), whose result, the wrapped indices, the gather
  then reads, so the check stays in the graph. The node that checks is named
  after the op and its range (``xgather_0 bnns.Gather: indices must lie in
  [0, 2] (a negative index i shows here as i - 3)``), which onnxruntime's error
  shows; its Gather and GatherND errors also show the index, its GatherElements
  error does not. Indices known at export (constants) are checked at export.
  The check is there only where the output depends on the gather: JAX drops a
  gather whose result is unused (e.g. the forward pass behind LabVIEW's zero
  gradient with ``training=False``) before export, and its check with it.
* The ONNX ops in ``mode="promise_in_bounds"`` become the very ONNX node too
  (in-range results agree; the rest is undefined in both).
* Everything else becomes plain ops: negative indices wrapped with a compare
  and a select, then ``"clip"`` clamps the indices and ``"fill"`` sends an
  out-of-range index to one slice of ``fill_value`` appended to ``data``
  along the indexed axis (a copy of ``data`` in the exported graph); the
  gather itself runs on indices known to be in range (int32 where every axis
  fits it). (jax2onnx 0.17.1 drops ``lax.gather``'s clip and fill modes on its
  ``GatherND`` lowering, so they are never left to it.)
* No ``BitCast``, an ONNX op from opset 26 only, in any form.
* ``out_sharding`` is left out: an ONNX graph does not place its values.

xgather caches one jitted function per plan; a trace made while jax2onnx's
patches are active would be reused by later eager calls, so the plugin clears
those caches when an export starts and when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from xgather import (
    _apply,
    _check,
    _dtypes,
    _frontend,
    _gather,
    _grad,
    _indices,
    _jaxprivate,
    _lower,
)
from xgather._errors import XGatherError, fail
from xgather._gather import Call

TESTED_OPSETS = (17, 18, 19, 20, 21)
"""The model opsets the tests export at (13 and later are accepted)."""

# The spec's op (plan.op without version or LabVIEW label) -> the ONNX node of its forward
_KINDS = {"onnx.Gather": "Gather", "openvino.Gather": "Gather", "bnns.Gather": "Gather",
          "labview.Gather": "Gather", "onnx.GatherND": "GatherND",
          "openvino.GatherND": "GatherND", "bnns.GatherND": "GatherND",
          "onnx.GatherElements": "GatherElements", "openvino.GatherElements": "GatherElements",
          "bnns.GatherAlongAxis": "GatherElements"}
_NODE_TYPES = ("Gather", "GatherND", "GatherElements")


def _spec_op(plan) -> str:
    """``"labview.Gather"`` for ``"labview.Gather[name]->out"``, ``"onnx.Gather"`` for
    ``"onnx.Gather-13"``."""
    m = re.match(r"[a-z]+\.[A-Za-z]+", plan.op)
    return m.group(0) if m else plan.op


def _node_type(plan) -> str | None:
    """The ONNX node that computes the op's forward on these shapes, or None.

    Gather (``axis``) has no batch dimensions; GatherND (``batch_dims``) is every
    tuple gather, OpenVINO GatherND-5's folded batch dims a Reshape after it;
    GatherElements (``axis``) every element gather.
    """
    kind = _KINDS.get(_spec_op(plan))
    if kind == "Gather" and plan.batch_dims:
        return None
    return kind


def _describe(op: str, bounds, negative: bool, what: str) -> str:
    """What an exported check enforces, for the name of its node (onnxruntime shows it)."""
    ranges = " x ".join(f"[{-s if negative else 0}, {s - 1}]" for s in bounds)
    text = f"{op}: {what} must lie in {ranges}"
    if not negative:
        size = bounds[0] if len(bounds) == 1 else "s"
        text += f" (a negative index i shows here as i - {size})"
    return text


# --- the ONNX-node path: one primitive per ONNX op -------------------------------------------

def _node_primitive(op_type: str) -> Primitive:
    prim = Primitive(f"xgather.onnx.{op_type}")

    def impl(data, indices, *, attr, call):
        return call(data, indices)

    def abstract_eval(data, indices, *, attr, call):
        return data.update(shape=call.call.plan.out_shape, weak_type=False)

    # Under vmap or a derivative the node gives way to the plain export form (same mode).
    def batch(args, dims, *, attr, call):
        return jax.vmap(call.plain, in_axes=dims)(*args), 0

    def jvp(primals, tangents, *, attr, call):
        # The tangent is the plain form's gather of the data's tangent (fill 0), shaped
        # as xgather._grad shapes it (LabVIEW's coeff, float32 sums for 16-bit floats),
        # and spelled out here: differentiating through _grad's custom_jvp would give
        # the indices a float0 tangent, which jax2onnx cannot export. The plain form
        # is linear in the data, so JAX transposes it for reverse mode.
        data, indices = primals
        linear = call._replace(call=call.call._replace(fill_value=0, grad=None))
        tangent = _grad.tangent(lambda t: linear.plain(t, indices),
                                ad.instantiate_zeros(tangents[0]), call.call.grad)
        return call.plain(data, indices), tangent

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[prim] = batch
    ad.primitive_jvps[prim] = jvp
    return prim


_PRIMS = {op_type: _node_primitive(op_type) for op_type in _NODE_TYPES}


class _Bound(NamedTuple):
    """``xgather._apply.run`` and the call it runs: hashable, a primitive parameter."""

    run: Callable
    call: Call

    def __call__(self, data, indices):
        return self.run(self.call, data, indices)

    def plain(self, data, indices):
        # The node's indices: for "error", already in the form of _onnx_range.
        return _export(self.run, self.call, data, indices, node=False, in_onnx_range=True)


def _node(op_type: str, run: Callable, call: Call, data, indices):
    plan = call.plan
    attr = plan.batch_dims if op_type == "GatherND" else plan.index_axes[0]
    return _PRIMS[op_type].bind(jnp.asarray(data), jnp.asarray(indices), attr=attr,
                                call=_Bound(run, call))


# --- mode="error": onnxruntime's own bounds check ----------------------------------------------

def _bound(bounds, dtype, ndim: int, vector: bool):
    """``s`` as a NumPy constant of ``dtype`` that broadcasts against ``ndim``-axis indices
    (one per component where the last axis holds index tuples)."""
    s = np.asarray(bounds, dtype)
    return s.reshape((1,) * (ndim - 1) + (-1,)) if vector else s[0]


def _onnx_range(plan, idx):
    """Indices whose out-of-range ones lie outside ONNX's ``[-s, s-1]`` too.

    Where the spec's range is ``[0, s-1]``, a negative index ``i`` becomes
    ``i - s`` (saturated at the dtype's minimum, on axes of more than 2**30
    elements with int32 indices), which onnxruntime rejects where it would
    have wrapped ``i``; the index as given is unchanged otherwise. uint64
    indices past int64's range saturate at its maximum (the node's indices are
    int64). Plain compares, subtractions and selects.
    """
    idx = _indices.fit_dtype(plan, idx)
    if idx.dtype == jnp.uint64:
        idx = jnp.minimum(idx, jnp.asarray(np.iinfo(np.int64).max, idx.dtype))
    if not plan.negative and jnp.issubdtype(idx.dtype, jnp.signedinteger):
        s = _bound(plan.bounds, idx.dtype, idx.ndim, plan.index_vector)
        low = np.iinfo(idx.dtype).min + s  # i - s saturates here
        idx = jnp.where(idx < 0, jnp.maximum(idx, jnp.asarray(low, idx.dtype)) - s, idx)
    return idx


def _guard_impl(indices, *, op, bounds, negative, vector):
    """The guard outside an export: the wrap alone (onnxruntime's check is the guard's point)."""
    if not jnp.issubdtype(indices.dtype, jnp.signedinteger):
        return indices
    s = _bound(bounds, indices.dtype, indices.ndim, vector)
    return jnp.where(indices < 0, indices + s, indices)


def _guard_batch(args, dims, **params):
    (indices,), (dim,) = args, dims
    return _GUARD.bind(jnp.moveaxis(indices, dim, 0), **params), 0


def _guard_jvp(primals, tangents, **params):
    out = _GUARD.bind(*primals, **params)
    return out, ad.Zero.from_primal_value(out)


#: ``guard(indices)``: the indices wrapped into ``[0, s-1]``, each checked by onnxruntime.
#: Exports as ``Gather(Range(0, s, 1), indices)`` (one per component of index tuples):
#: onnxruntime rejects an index outside ``[-s, s-1]`` and names it, and the gather that
#: follows reads its result, so the check stays in the graph.
_GUARD = Primitive("xgather.export.guard")
_GUARD.def_impl(_guard_impl)
_GUARD.def_abstract_eval(lambda indices, **_: indices.update(weak_type=False))
batching.primitive_batchers[_GUARD] = _guard_batch
ad.primitive_jvps[_GUARD] = _guard_jvp


def _guarded(run: Callable, call: Call, data, indices, in_onnx_range: bool = False):
    """``mode="error"`` with no node for it: the guard, then the gather on in-range indices."""
    plan, idx = call.plan, jnp.asarray(indices)
    idx = _GUARD.bind(idx if in_onnx_range else _onnx_range(plan, idx), op=plan.op,
                      bounds=plan.bounds, negative=plan.negative, vector=plan.index_vector)
    plan = dataclasses.replace(plan, negative=False)
    empty = [a for a in plan.index_axes if plan.data_shape[a] == 0]
    if empty:
        # An empty axis has no index in range: the guard rejects every index. The gather
        # reads one slice of zeros appended there, so that its result depends on the guard.
        data = jnp.asarray(data)
        data = jnp.pad(data, [(0, int(a in empty)) for a in range(data.ndim)])
        crop = plan.data_crop
        if crop is not None:
            crop = tuple(c + int(a in empty) for a, c in enumerate(crop))
        plan = dataclasses.replace(plan, data_shape=data.shape, data_crop=crop)
    return run(call._replace(plan=plan, mode="promise_in_bounds", fill_value=None), data,
               _int32(plan, idx))


# --- the plain path: indices made in range with compares and selects ---------------------------

def _in_range(plan, idx):
    """Negative indices wrapped (where the spec says so), the validity mask, and ``s``.

    The same pieces as the traced gather (``xgather._indices``): plain compares,
    adds and selects, which every opset exports.
    """
    idx = _indices.fit_dtype(plan, idx)  # room for index + s
    s = jnp.broadcast_to(_indices.bounds_array(plan, idx), idx.shape)
    valid = _indices.valid(plan, idx, jnp)
    idx = _indices.wrap(plan, idx)
    if plan.index_vector:
        valid = jnp.all(valid, axis=-1, keepdims=True)
    return idx, valid, s


def _int32(plan, idx):
    """In-range 64-bit indices as int32 where every axis fits it.

    The gather then skips the saturation of 64-bit indices (``xgather._indices.saturate_64``,
    a clamp on every platform), which in-range indices do not need.
    """
    if jnp.dtype(idx.dtype).itemsize == 8 and max(plan.bounds, default=0) < 2**31:
        return idx.astype(jnp.int32)
    return idx


def _plain(plan, mode: str, fill_value, data, idx):
    """Plan, data and indices such that the gather only ever sees in-range indices."""
    idx, valid, s = _in_range(plan, jnp.asarray(idx))
    if mode == "clip":
        idx = jnp.clip(idx, jnp.zeros((), idx.dtype), s - 1)
    elif mode == "fill":
        # An out-of-range index reads one slice of fill_value appended to data along the
        # first indexed axis: position s there (the other components 0).
        ax = plan.index_axes[0]
        data = jnp.asarray(data)
        # shaped after one slice of data, so that a symbolic dim (a batch) stays symbolic
        pad = lax.full_like(lax.slice_in_dim(data, 0, 1, axis=ax),
                            0 if fill_value is None else fill_value)
        data = jnp.concatenate([data, pad], axis=ax)
        if jnp.issubdtype(idx.dtype, jnp.unsignedinteger):
            # onnxruntime's Where takes no uint64, and no uint32 before 1.31: the select
            # runs on signed indices, where the valid ones fit (the rest are replaced).
            wide = np.dtype(idx.dtype).itemsize == 8 or max(plan.bounds) >= 2**31
            idx = idx.astype(np.int64 if wide else np.int32)
        first = np.zeros(idx.shape[-1:] if plan.index_vector else (), np.int64)
        first[(0,) if plan.index_vector else ()] = plan.bounds[0]
        sentinel = jnp.broadcast_to(jnp.asarray(first, idx.dtype), idx.shape)
        idx = lax.select(jnp.broadcast_to(valid, idx.shape), idx, sentinel)
        crop = plan.data_crop
        if crop is not None:
            crop = crop[:ax] + (crop[ax] + 1,) + crop[ax + 1:]
        plan = dataclasses.replace(plan, data_shape=data.shape, data_crop=crop)
    return dataclasses.replace(plan, negative=False), data, idx


def _export(run: Callable, call: Call, data, indices, *, node: bool = True,
            in_onnx_range: bool = False):
    """``xgather._apply.run`` as it exports: the ONNX node, or plain ops on in-range indices.

    ``node=False`` is the plain form (under vmap or a derivative); ``in_onnx_range``
    says the indices went through ``_onnx_range`` already (the node's indices).
    """
    plan, mode = call.plan, call.mode
    op_type = _node_type(plan)
    call = call._replace(out_sharding=None)  # an ONNX graph places nothing: the runtime's
    if mode == "error":
        if not _dtypes.is_traced(indices):
            _check.host_check(plan, indices)  # indices known at export: the check, now
            mode = "promise_in_bounds"
        elif node and op_type:
            return _node(op_type, run, call, data, _onnx_range(plan, jnp.asarray(indices)))
        else:
            return _guarded(run, call, data, indices, in_onnx_range)
    if node and op_type and mode == "promise_in_bounds" and _spec_op(plan).startswith("onnx."):
        return _node(op_type, run, call._replace(mode=mode), data, indices)
    _gather.no_clamp_into_nothing(plan, mode, indices)
    if 0 in plan.bounds or not math.prod(plan.out_shape):
        # Nothing to index (every index is out of range, and the op fills), or nothing to
        # write: the result is known (jax2onnx's GatherND, where the plain form would go,
        # rejects empty batch dims).
        fill = 0 if call.fill_value is None else call.fill_value
        return jnp.full(plan.out_shape, fill, jnp.asarray(data).dtype)
    if mode != "promise_in_bounds":  # clamped or sent to the fill slot: no longer promises
        call = call._replace(indices_are_sorted=False, unique_indices=False)
    plan, data, indices = _plain(plan, mode, call.fill_value, data, indices)
    return run(call._replace(plan=plan, mode="promise_in_bounds", fill_value=None), data,
               _int32(plan, indices))


# --- the jax2onnx plugin ------------------------------------------------------------------------

_registered: dict[str, type] = {}


def _export_lowering():
    """The lowering an export traces with, wherever it runs: one platform's choices (the
    element gathers as XLA batching dimensions), so that the graph does not depend on
    the machine that traces it."""
    return _lower.lowering(_lower.EXPORT_PLATFORM, element_gather="batching_dims")


def register_jax2onnx() -> None:
    """Teach jax2onnx (0.17) to export every xgather op; idempotent.

    After this call, ``jax2onnx.to_onnx(fn, inputs, opset=...)`` exports ``fn``
    built on any xgather op (see the module docstring for what each becomes).

    Raises:
      ImportError: jax2onnx is not installed (``pip install -e '.[export]'`` in
        xgather's clone).
      XGatherError: the installed jax and jax2onnx cannot work together.
    """
    if _registered:
        return
    try:
        import onnx_ir as ir
        from jax2onnx.plugins._patching import MonkeyPatchSpec
        from jax2onnx.plugins.plugin_system import PrimitiveLeafPlugin, register_primitive
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("xgather.export needs jax2onnx: pip install -e '.[export]' "
                          "(in xgather's clone)") from err
    if not _jaxprivate.alias_closed_jaxpr():
        _incompatible("jax has neither jax._src.core.ClosedJaxpr, which jax2onnx reads, nor "
                      "jax.extend.core.ClosedJaxpr to stand in for it")

    def typed(value, dtype, shape):
        value.type = ir.TensorType(dtype)
        # a symbolic dim (jax.export's "B", or "2*B") becomes the graph's dim_param
        value.shape = ir.Shape([n if _lower.known(n) else str(n) for n in shape])
        return value

    def named(value, ctx, plan):
        # onnxruntime names the failing node in its error: say what xgather checks there.
        node = value.producer()
        if node is not None:
            what = "index tuples" if plan.index_vector else "indices"
            node.name = (f"{ctx.fresh_name('xgather')} "
                         f"{_describe(plan.op, plan.bounds, plan.negative, what)}")
        return value

    def const(ctx, value, dtype):
        return ctx.bind_const_for_var(object(), np.asarray(value, dtype))

    def index_input(ctx, idx, aval, accepted):
        """``idx`` as the node takes it: cast to int64 unless its dtype is accepted."""
        if np.dtype(aval.dtype) in accepted:
            return idx
        idx = ctx.builder.Cast(idx, _outputs=[ctx.fresh_name("xgather_indices64")],
                               to=int(ir.DataType.INT64.value))
        return typed(idx, ir.DataType.INT64, aval.shape)

    class _NodePlugin(PrimitiveLeafPlugin):
        """Lowers one xgather node primitive to its ONNX node (GatherND-5's Reshape after it)."""

        op_type: str
        attr_name: str

        def lower(self, ctx, eqn):
            data_var, idx_var = eqn.invars
            out_var = eqn.outvars[0]
            plan = eqn.params["call"].call.plan
            data = ctx.get_value_for_var(data_var, name_hint=ctx.fresh_name("xgather_data"))
            idx = ctx.get_value_for_var(idx_var, name_hint=ctx.fresh_name("xgather_indices"))
            accepted = (np.int64,) if self.op_type == "GatherND" else (np.int32, np.int64)
            idx = index_input(ctx, idx, idx_var.aval, tuple(map(np.dtype, accepted)))
            dtype = ir.DataType(data.type.dtype)
            folded = self.op_type == "GatherND" and plan.gather_shape != tuple(out_var.aval.shape)
            out = getattr(ctx.builder, self.op_type)(
                data, idx, _outputs=[ctx.fresh_name(self.op_type)],
                **{self.attr_name: int(eqn.params["attr"])})
            out = named(typed(out, dtype, plan.gather_shape if folded else out_var.aval.shape),
                        ctx, plan)
            if folded:  # OpenVINO GatherND-5: the batch dimensions folded into one
                target = tuple(out_var.aval.shape)
                if not all(map(_lower.known, target[1:])):
                    fail(plan.op, "exports with a symbolic dimension only among the folded "
                         "batch dimensions (the Reshape after GatherND needs the others as "
                         "numbers)", f"a result of shape {target}")
                # the folded dim as -1: a symbolic batch stays free
                shape = const(ctx, (-1,) + target[1:], np.int64)
                out = typed(ctx.builder.Reshape(out, shape, _outputs=[ctx.fresh_name("Reshape")]),
                            dtype, out_var.aval.shape)
            ctx.bind_value_for_var(out_var, out)

    class _GuardPlugin(PrimitiveLeafPlugin):
        """Lowers the guard: ``Gather(Range(0, s, 1), indices)``, per component of tuples."""

        def lower(self, ctx, eqn):
            (idx_var,), (out_var,) = eqn.invars, eqn.outvars
            bounds, vector = eqn.params["bounds"], eqn.params["vector"]
            aval = idx_var.aval
            idx = ctx.get_value_for_var(idx_var, name_hint=ctx.fresh_name("xgather_indices"))
            work = np.dtype(aval.dtype)
            if work not in (np.dtype(np.int32), np.dtype(np.int64)):
                work = np.dtype(np.int64)
                idx = index_input(ctx, idx, aval, ())
            irtype = ir.DataType.INT32 if work == np.int32 else ir.DataType.INT64
            shape = tuple(aval.shape)

            def check(column, s, what):
                table = ctx.builder.Range(const(ctx, 0, work), const(ctx, s, work),
                                          const(ctx, 1, work),
                                          _outputs=[ctx.fresh_name("xgather_positions")])
                typed(table, irtype, (s,))
                out = ctx.builder.Gather(table, column, axis=0,
                                         _outputs=[ctx.fresh_name("xgather_checked")])
                name = _describe(eqn.params["op"], (s,), eqn.params["negative"], what)
                out = typed(out, irtype, shape[:-1] if vector else shape)
                out.producer().name = f"{ctx.fresh_name('xgather')} {name}"  # shown on failure
                return out

            if not vector:
                out = check(idx, bounds[0], "indices")
            else:
                columns = []
                for j, s in enumerate(bounds):
                    column = typed(ctx.builder.Gather(idx, const(ctx, j, np.int64), axis=-1,
                                                      _outputs=[ctx.fresh_name("xgather_comp")]),
                                   irtype, shape[:-1])
                    checked = check(column, s, f"index component {j}")
                    columns.append(typed(ctx.builder.Unsqueeze(
                        checked, const(ctx, [-1], np.int64),
                        _outputs=[ctx.fresh_name("xgather_comp")]), irtype, shape[:-1] + (1,)))
                out = columns[0] if len(columns) == 1 else typed(ctx.builder.Concat(
                    *columns, axis=-1, _outputs=[ctx.fresh_name("xgather_checked")]),
                    irtype, shape)
            if work != np.dtype(aval.dtype):  # back to the unsigned dtype (values in range)
                back = ir.DataType.from_numpy(np.dtype(aval.dtype))
                out = typed(ctx.builder.Cast(out, _outputs=[ctx.fresh_name("xgather_checked")],
                                             to=int(back.value)), back, shape)
            ctx.bind_value_for_var(out_var, out)

    class _RunPlugin(_NodePlugin):
        """The Gather plugin also gives xgather._apply.run its export form."""

        @classmethod
        def binding_specs(cls):
            # Every op of every spec reaches lax.gather through xgather._apply.run.
            return [MonkeyPatchSpec(target=_apply, attr="run",
                                    make_value=lambda run: functools.partial(_export, run))]

        @classmethod
        @contextlib.contextmanager
        def plugin_binding(cls):
            # Entered once per export around the trace: no jitted function traced under
            # the exporter's patches outlives it, nor is one traced before it used. The
            # trace takes one platform's lowering choices wherever it runs, so that the
            # graph is the same on every machine.
            _frontend.clear_caches()
            try:
                with super().plugin_binding(), _export_lowering():
                    yield
            finally:
                _frontend.clear_caches()

    for op_type in _NODE_TYPES:
        attrs = {"op_type": op_type, "attr_name": "batch_dims" if op_type == "GatherND" else "axis",
                 "_PRIM": _PRIMS[op_type], "_ABSTRACT_EVAL_BOUND": True}
        cls = type(f"XGather{op_type}Plugin",
                   (_RunPlugin if op_type == "Gather" else _NodePlugin,), attrs)
        doc = f"https://onnx.ai/onnx/operators/onnx__{op_type}.html"
        _registered[op_type] = register_primitive(
            jaxpr_primitive=_PRIMS[op_type].name, context="primitives.xgather",
            component=f"xgather.onnx.{op_type}", onnx=[{"component": op_type, "doc": doc}],
            since="xgather 0.1.0", testcases=[])(cls)
    cls = type("XGatherGuardPlugin", (_GuardPlugin,),
               {"_PRIM": _GUARD, "_ABSTRACT_EVAL_BOUND": True})
    _registered["guard"] = register_primitive(
        jaxpr_primitive=_GUARD.name, context="primitives.xgather", component="xgather.guard",
        onnx=[{"component": op, "doc": f"https://onnx.ai/onnx/operators/onnx__{op}.html"}
              for op in ("Range", "Gather")],
        since="xgather 0.1.0", testcases=[])(cls)


TESTED = {"jax2onnx": ("0.17.1",), "jax": ("0.10.2", "0.12.0.1")}
"""The versions the export is tested with (jax on each of the project's Pythons)."""


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        j2o = version("jax2onnx")
    except PackageNotFoundError:  # pragma: no cover - an unpackaged checkout
        j2o = "(unknown)"
    return f"jax {jax.__version__} with jax2onnx {j2o}"


def _incompatible(why: str, cause: BaseException | None = None) -> NoReturn:
    raise XGatherError(
        f"xgather.export: {_versions()} cannot export: {why}. xgather's export is tested with "
        f"jax2onnx {' or '.join(TESTED['jax2onnx'])} on jax {' or '.join(TESTED['jax'])}: "
        f"pip install 'jax2onnx=={TESTED['jax2onnx'][-1]}' 'jax=={TESTED['jax'][-1]}' "
        f"(Python 3.12 or later; 'jax=={TESTED['jax'][0]}' on 3.11)") from cause


def _from_jax2onnx(err: BaseException) -> bool:
    """Whether ``err`` was raised inside jax2onnx (or its onnx_ir), not in the caller's code."""
    tb = err.__traceback__
    last = ""
    while tb is not None:
        last = str(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    return last.split(".")[0] in ("jax2onnx", "onnx_ir")


def to_onnx(fn: Callable, inputs: Sequence[Any], *, opset: int = 21, **kwargs):
    """``jax2onnx.to_onnx(fn, inputs, opset=opset, **kwargs)`` with xgather's plugin registered.

    Args:
      fn: a JAX function of arrays built on xgather ops (and anything jax2onnx exports).
      inputs: one ``jax.ShapeDtypeStruct`` (or array, or shape tuple) per argument of
        ``fn``. 64-bit inputs export as 32-bit ones unless ``jax_enable_x64`` is on
        and ``enable_double_precision=True`` is passed (which makes float32 float64 too).
      opset: the model's ONNX opset, 13 or later; 17 to 21 are tested.
      **kwargs: passed to ``jax2onnx.to_onnx`` (``model_name``, ``return_mode``, ...).

    Returns:
      What ``jax2onnx.to_onnx`` returns: an ``onnx.ModelProto`` by default.

    Examples:
        >>> import numpy as np, xgather, xgather.export  # doctest: +SKIP
        >>> f = lambda d, i: xgather.onnx.gather(d, i, axis=1)  # doctest: +SKIP
        >>> args = [np.zeros((2, 3), np.float32), np.zeros(4, np.int32)]
        >>> model = xgather.export.to_onnx(f, args)  # doctest: +SKIP
        >>> [n.op_type for n in model.graph.node]  # doctest: +SKIP
        ['Gather']
    """
    if isinstance(opset, bool | np.bool_) or not isinstance(opset, int | np.integer) or \
            opset < _MIN_OPSET:
        fail("xgather.export.to_onnx", f"opset must be an int, {_MIN_OPSET} or later (the nodes "
             "xgather writes need GatherElements (11), GatherND's batch_dims (12) and "
             "bfloat16 (13); 17 to 21 are tested)", repr(opset))
    register_jax2onnx()
    import jax2onnx

    try:
        return jax2onnx.to_onnx(fn, inputs, opset=int(opset), **kwargs)
    except (AttributeError, ImportError) as err:
        if not _from_jax2onnx(err):
            raise
        _incompatible(f"jax2onnx failed inside with {type(err).__name__}: {err}", err)


_MIN_OPSET = 13


__all__ = ["TESTED", "TESTED_OPSETS", "register_jax2onnx", "to_onnx"]
