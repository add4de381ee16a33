"""Export JAX functions built on xgather to ONNX with jax2onnx (extra ``xgather[export]``).

:func:`register_jax2onnx` adds a plugin to jax2onnx; from then on
``jax2onnx.to_onnx`` exports every xgather op, and :func:`to_onnx` does both.
While jax2onnx traces, the plugin gives every op of every spec (they all reach
``lax.gather`` through ``xgather._apply.run``) its export form:

* The ONNX ops become the very ONNX node (``Gather`` with ``axis``,
  ``GatherND`` with ``batch_dims``, ``GatherElements`` with ``axis``) where
  its semantics are xgather's: in the spec's default ``mode="error"`` with
  negative indices wrapping (the node itself rejects an out-of-range index),
  and in ``mode="promise_in_bounds"`` (in-range results agree; the rest is
  undefined in both).
* Everything else becomes plain ops: negative indices wrapped with a compare
  and a select, then ``"clip"`` clamps the indices and ``"fill"`` sends an
  out-of-range index to one slice of ``fill_value`` appended to ``data``
  along the indexed axis (a copy of ``data`` in the exported graph); the
  gather itself runs on indices known to be in range. (jax2onnx 0.17.1 drops
  ``lax.gather``'s clip and fill modes on its ``GatherND`` lowering, so they
  are never left to it.) No ``BitCast``, an ONNX op from opset 26 only.
* ``mode="error"`` that no ONNX node expresses (the OpenVINO, BNNS and LabVIEW
  ops, and ``negative_indices=False``) is an error at export when the indices
  are traced: ONNX has no run-time assert to raise it. Indices known at export
  (constants) are checked then, and the gather runs unchecked.

xgather caches one jitted function per plan; a trace made while jax2onnx's
patches are active would be reused by later eager calls, so the plugin clears
those caches when an export starts and when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from xgather import _apply, _dtypes, _modes
from xgather._errors import fail

#: The opsets the tests export at.
TESTED_OPSETS = (17, 18, 19, 20, 21)

# plan.op without its version -> the ONNX node it can export as
_NODES = {"onnx.Gather": "Gather", "onnx.GatherND": "GatherND",
          "onnx.GatherElements": "GatherElements"}


def clear_caches() -> None:
    """Drop xgather's cached jitted functions (and so the traces they hold)."""
    _apply.clear_caches()


# --- the ONNX-node path: one primitive per ONNX op -------------------------------------------

def _node_primitive(op_type: str) -> Primitive:
    prim = Primitive(f"xgather.onnx.{op_type}")

    def impl(data, indices, *, attr, call):
        return call(data, indices)

    def abstract_eval(data, indices, *, attr, call):
        return data.update(shape=call.plan.out_shape, weak_type=False)

    # Under vmap or a derivative the node gives way to the plain export form (same mode).
    def batch(args, dims, *, attr, call):
        return jax.vmap(call.plain, in_axes=dims)(*args), 0

    def jvp(primals, tangents, *, attr, call):
        data, indices = primals
        return jax.jvp(lambda d: call.plain(d, indices), (data,),
                       (ad.instantiate_zeros(tangents[0]),))

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[prim] = batch
    ad.primitive_jvps[prim] = jvp
    return prim


_PRIMS = {op_type: _node_primitive(op_type) for op_type in _NODES.values()}


class _Call:
    """``xgather._apply.run`` with its plan and options bound: hashable, a primitive parameter."""

    def __init__(self, run: Callable, plan, mode: str, fill_value, options: dict[str, Any]):
        self.run, self.plan, self.mode, self.fill_value = run, plan, mode, fill_value
        self.options = tuple(sorted(options.items()))

    def _key(self):
        return self.run, self.plan, self.mode, self.fill_value, self.options

    def __call__(self, data, indices):
        return self.run(self.plan, data, indices, self.mode, self.fill_value,
                        **dict(self.options))

    def plain(self, data, indices):
        return _export(self.run, self.plan, data, indices, self.mode, self.fill_value,
                       node=False, **dict(self.options))

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, _Call) and self._key() == other._key()


# --- the plain path: indices made in range with compares and selects ---------------------------

def _in_range(plan, idx):
    """Negative indices wrapped (where the spec says so), the validity mask, and ``s``.

    The same pieces as the traced gather (:mod:`xgather._modes`): plain compares,
    adds and selects, which every opset exports.
    """
    idx = _modes.widen(idx)  # room for index + s
    s = jnp.broadcast_to(_modes.bounds_array(plan, idx), idx.shape)
    valid = _modes.valid(plan, idx, jnp)
    idx = _modes.wrap(plan, idx)
    if plan.index_vector:
        valid = jnp.all(valid, axis=-1, keepdims=True)
    return idx, valid, s


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
        pad = jnp.full(data.shape[:ax] + (1,) + data.shape[ax + 1:],
                       0 if fill_value is None else fill_value, data.dtype)
        data = jnp.concatenate([data, pad], axis=ax)
        first = np.zeros(idx.shape[-1:] if plan.index_vector else (), np.int64)
        first[(0,) if plan.index_vector else ()] = plan.bounds[0]
        sentinel = jnp.broadcast_to(jnp.asarray(first, idx.dtype), idx.shape)
        idx = lax.select(jnp.broadcast_to(valid, idx.shape), idx, sentinel)
        crop = plan.data_crop
        if crop is not None:
            crop = crop[:ax] + (crop[ax] + 1,) + crop[ax + 1:]
        plan = dataclasses.replace(plan, data_shape=data.shape, data_crop=crop)
    return dataclasses.replace(plan, negative=False), data, idx


def _export(run: Callable, plan, data, indices, mode: str, fill_value=None, *,
            node: bool = True, **options):
    """``xgather._apply.run`` as it exports: the ONNX node, or plain ops on in-range indices."""
    op_type = _NODES.get(plan.op.rsplit("-", 1)[0])
    if node and op_type and (mode == "promise_in_bounds" or (mode == "error" and plan.negative)):
        attr = plan.batch_dims if op_type == "GatherND" else plan.index_axes[0]
        return _PRIMS[op_type].bind(jnp.asarray(data), jnp.asarray(indices), attr=attr,
                                    call=_Call(run, plan, mode, fill_value, options))
    if mode == "error":
        if _dtypes.is_traced(indices):
            hint = ("; negative_indices=True exports as the ONNX node" if op_type
                    else "; the xgather.onnx ops export as the ONNX node")
            fail(plan.op, 'mode="error" cannot be exported, ONNX has no run-time check: '
                 'pass mode="clip", "fill" or "promise_in_bounds"' + hint)
        _modes.host_check(plan, indices)  # indices known at export: the check, now
        mode = "promise_in_bounds"
    if 0 in plan.bounds and not (mode == "clip" and np.size(indices)):
        # Nothing to index: every index is out of range, and the op fills (clip raises).
        fill = 0 if fill_value is None else fill_value
        return jnp.full(plan.out_shape, fill, jnp.asarray(data).dtype)
    if mode != "promise_in_bounds":  # clamped or sent to the fill slot: no longer promises
        options.update(indices_are_sorted=False, unique_indices=False)
    plan, data, indices = _plain(plan, mode, fill_value, data, indices)
    return run(plan, data, indices, "promise_in_bounds", None, **options)


# --- the jax2onnx plugin ------------------------------------------------------------------------

_registered: dict[str, type] = {}


def register_jax2onnx() -> None:
    """Teach jax2onnx (0.17) to export every xgather op; idempotent.

    After this call, ``jax2onnx.to_onnx(fn, inputs, opset=...)`` exports ``fn``
    built on any xgather op (see the module docstring for what each becomes).

    Raises:
      ImportError: jax2onnx is not installed (``pip install 'xgather[export]'``).
    """
    if _registered:
        return
    try:
        import onnx_ir as ir
        from jax2onnx.plugins._patching import MonkeyPatchSpec
        from jax2onnx.plugins.plugin_system import PrimitiveLeafPlugin, register_primitive
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("xgather.export needs jax2onnx: pip install 'xgather[export]'") from err

    class _NodePlugin(PrimitiveLeafPlugin):
        """Lowers one xgather.onnx primitive to its ONNX node."""

        op_type: str
        attr_name: str

        def lower(self, ctx, eqn):
            data_var, idx_var = eqn.invars
            out_var = eqn.outvars[0]
            data = ctx.get_value_for_var(data_var, name_hint=ctx.fresh_name("xgather_data"))
            idx = ctx.get_value_for_var(idx_var, name_hint=ctx.fresh_name("xgather_indices"))
            if self.op_type == "GatherND" and idx_var.aval.dtype != np.int64:
                idx = ctx.builder.Cast(idx, _outputs=[ctx.fresh_name("xgather_indices64")],
                                       to=int(ir.DataType.INT64.value))
                idx.type = ir.TensorType(ir.DataType.INT64)
                idx.shape = ir.Shape(idx_var.aval.shape)
            out = getattr(ctx.builder, self.op_type)(
                data, idx, _outputs=[ctx.fresh_name(self.op_type)],
                **{self.attr_name: int(eqn.params["attr"])})
            out.type = ir.TensorType(ir.DataType(data.type.dtype))
            out.shape = ir.Shape(out_var.aval.shape)
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
            # the exporter's patches outlives it, nor is one traced before it used.
            clear_caches()
            try:
                with super().plugin_binding():
                    yield
            finally:
                clear_caches()

    for op_type in _NODES.values():
        attrs = {"op_type": op_type, "attr_name": "batch_dims" if op_type == "GatherND" else "axis",
                 "_PRIM": _PRIMS[op_type], "_ABSTRACT_EVAL_BOUND": True}
        cls = type(f"XGather{op_type}Plugin",
                   (_RunPlugin if op_type == "Gather" else _NodePlugin,), attrs)
        doc = f"https://onnx.ai/onnx/operators/onnx__{op_type}.html"
        _registered[op_type] = register_primitive(
            jaxpr_primitive=_PRIMS[op_type].name, context="primitives.xgather",
            component=f"xgather.onnx.{op_type}", onnx=[{"component": op_type, "doc": doc}],
            since="xgather 0.1.0", testcases=[])(cls)


def to_onnx(fn: Callable, inputs: Sequence[Any], *, opset: int = 21, **kwargs):
    """``jax2onnx.to_onnx(fn, inputs, opset=opset, **kwargs)`` with xgather's plugin registered.

    Args:
      fn: a JAX function of arrays built on xgather ops (and anything jax2onnx exports).
      inputs: one ``jax.ShapeDtypeStruct`` (or array, or shape tuple) per argument of
        ``fn``. With ``jax_enable_x64`` off, 64-bit inputs export as 32-bit ones.
      opset: the model's ONNX opset; 17 to 21 are tested.
      **kwargs: passed to ``jax2onnx.to_onnx`` (``model_name``, ``return_mode``, ...).

    Returns:
      What ``jax2onnx.to_onnx`` returns: an ``onnx.ModelProto`` by default.

    >>> import numpy as np, xgather, xgather.export                   # doctest: +SKIP
    >>> f = lambda d, i: xgather.onnx.gather(d, i, axis=1)            # doctest: +SKIP
    >>> model = xgather.export.to_onnx(f, [np.zeros((2, 3), np.float32),
    ...                                    np.zeros(4, np.int32)])    # doctest: +SKIP
    >>> [n.op_type for n in model.graph.node]                         # doctest: +SKIP
    ['Gather']
    """
    register_jax2onnx()
    import jax2onnx

    return jax2onnx.to_onnx(fn, inputs, opset=opset, **kwargs)
