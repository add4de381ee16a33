"""Export JAX functions built on xgather to ONNX with jax2onnx (extra ``xgather[export]``).

:func:`register_jax2onnx` adds a plugin to jax2onnx; from then on
``jax2onnx.to_onnx`` exports every xgather op, and :func:`to_onnx` does both.
While jax2onnx traces, the plugin replaces the ten ops (``xgather.onnx``,
``xgather.openvino``, ``xgather.bnns``, ``xgather.labview``) by their export form:

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
  gather itself runs on indices known to be in range. jax2onnx 0.17.1 drops
  ``lax.gather``'s clip and fill modes on its ``GatherND`` lowering, so they
  are never left to it. No ``BitCast`` (an ONNX op from opset 26 only).
* ``mode="error"`` that no ONNX node expresses (the OpenVINO, BNNS and LabVIEW
  ops, and ``negative_indices=False``) is an error at export when the indices
  are traced: ONNX has no run-time assert. Indices known at export (constants)
  are checked then, and the gather runs unchecked.

xgather caches one jitted function per plan; a trace made while jax2onnx's
patches are active would be reused by later eager calls, so the plugin clears
those caches when an export starts and when it ends.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from xgather import _apply, _dtypes, _modes, bnns, labview, onnx, openvino
from xgather._errors import OutOfBoundsError, fail

#: Opsets the tests export at; ONNX Gather/GatherND/GatherElements exist at every one.
TESTED_OPSETS = (17, 18, 19, 20, 21)

# (module, name, spec default mode) of every op the plugin replaces while exporting.
_OPS = (
    (onnx, "gather", "error"), (onnx, "gather_nd", "error"), (onnx, "gather_elements", "error"),
    (openvino, "gather", "fill"), (openvino, "gather_nd", "error"),
    (openvino, "gather_elements", "error"),
    (bnns, "gather", "error"), (bnns, "gather_nd", "error"), (bnns, "gather_along_axis", "error"),
    (labview, "gather", "error"),
)
# xgather.onnx op -> (ONNX op type, its attribute)
_NODES = {"gather": ("Gather", "axis"), "gather_nd": ("GatherND", "batch_dims"),
          "gather_elements": ("GatherElements", "axis")}


def clear_caches() -> None:
    """Drop xgather's cached jitted functions (and so the traces they hold)."""
    clear = getattr(_apply, "clear_caches", None)
    if clear is not None:
        clear()
    else:  # before xgather._apply.clear_caches existed
        _apply.compiled.cache_clear()


# --- the ONNX-node path: one primitive per ONNX op -------------------------------------------

def _node_primitive(op_type: str) -> Primitive:
    prim = Primitive(f"xgather.onnx.{op_type}")

    def impl(data, indices, *, attr, call):
        return call(data, indices)

    def abstract_eval(data, indices, *, attr, call):
        return data.update(shape=call.plan(data, indices).out_shape, weak_type=False)

    def batch(args, dims, *, attr, call):
        # Outside an ONNX node: the xgather op itself, vmapped (its mode applies).
        return jax.vmap(call, in_axes=dims)(*args), 0

    def jvp(primals, tangents, *, attr, call):
        data, indices = primals
        return jax.jvp(lambda d: call(d, indices), (data,), (ad.instantiate_zeros(tangents[0]),))

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[prim] = batch
    ad.primitive_jvps[prim] = jvp
    return prim


_PRIMS = {name: _node_primitive(op_type) for name, (op_type, _) in _NODES.items()}


class _Call:
    """The original op with its options bound: hashable, so it can be a primitive parameter."""

    def __init__(self, fn: Callable, options: dict[str, Any]):
        self.fn, self.options = fn, tuple(sorted(options.items()))

    def __call__(self, data, indices):
        return self.fn(data, indices, **dict(self.options))

    def plan(self, data, indices):
        return self.fn.__xgather_plan__(data, indices, **dict(self.options))

    def __hash__(self):
        return hash((self.fn, self.options))

    def __eq__(self, other):
        return isinstance(other, _Call) and (self.fn, self.options) == (other.fn, other.options)


# --- the plain path: indices made in range with compares and selects ---------------------------

def _bounds(plan, idx):
    """``s`` per index component, shaped to broadcast against ``idx``."""
    return jnp.asarray(np.asarray(plan.bounds if plan.index_vector else plan.bounds[0]),
                       dtype=idx.dtype)


def _in_range(plan, idx):
    """The indices the plain path gathers with, the validity mask, and the padded axis (fill)."""
    if jnp.dtype(idx.dtype).itemsize < 4:
        idx = idx.astype(jnp.int32)  # room for index + s
    s = _bounds(plan, idx)
    zero = jnp.zeros((), idx.dtype)
    signed = jnp.issubdtype(idx.dtype, jnp.signedinteger)
    if plan.negative and signed:
        valid = (idx >= -s) & (idx < s)
        idx = lax.select(idx < zero, idx + jnp.broadcast_to(s, idx.shape), idx)
    else:
        valid = ((idx >= zero) if signed else jnp.ones(idx.shape, bool)) & (idx < s)
    if plan.index_vector:
        valid = jnp.all(valid, axis=-1, keepdims=True)
    return idx, valid, s


def _plain(plan, mode: str, fill_value, args: inspect.BoundArguments, data_name: str):
    """The op rewritten so that its gather only ever sees in-range, non-negative indices."""
    a = args.arguments
    data, idx = a[data_name], jnp.asarray(a["indices"])
    if 0 in plan.bounds:  # nothing to index: the op fills (or raises) without a gather
        return None
    idx, valid, s = _in_range(plan, idx)
    zero = jnp.zeros((), idx.dtype)
    if mode == "clip":
        idx = jnp.clip(idx, zero, jnp.broadcast_to(s - 1, idx.shape))
    elif mode == "fill":
        # Out of range reads one appended slice of fill_value: position s on the first axis.
        ax = plan.index_axes[0]
        data = jnp.asarray(data)
        pad = jnp.full(data.shape[:ax] + (1,) + data.shape[ax + 1:],
                       0 if fill_value is None else fill_value, data.dtype)
        data = jnp.concatenate([data, pad], axis=ax)
        first = np.zeros(idx.shape[-1:] if plan.index_vector else (), np.int64)
        first[(0,) if plan.index_vector else ()] = plan.bounds[0]
        sentinel = jnp.broadcast_to(jnp.asarray(first, idx.dtype), idx.shape)
        idx = lax.select(jnp.broadcast_to(valid, idx.shape), idx, sentinel)
    a[data_name], a["indices"], a["mode"] = data, idx, "promise_in_bounds"
    if "negative_indices" in a:
        a["negative_indices"] = False
    return a


def _check_constant(plan, idx) -> None:
    """``mode="error"`` with indices known at export: the bound check, now."""
    idx = np.asarray(idx)
    if idx.dtype.itemsize < 4:
        idx = idx.astype(np.int32)
    s = np.asarray(plan.bounds if plan.index_vector else plan.bounds[0], dtype=idx.dtype)
    lo = -s if plan.negative and idx.dtype.kind == "i" else np.zeros_like(s)
    bad = ~((idx >= lo) & (idx < s))
    if bad.any():
        where = tuple(int(p[0]) for p in np.nonzero(bad))
        fail(plan.op, "every index must lie in the spec's range", f"index {idx[where]} at "
             f"indices{list(where)}, bounds {plan.bounds}",
             {"data": plan.data_shape, "indices": plan.indices_shape}, kind=OutOfBoundsError)


def _export_form(module, name: str, spec_default: str, orig: Callable) -> Callable:
    signature = inspect.signature(orig)
    data_name = next(iter(signature.parameters))  # "data", or BNNS's "input"

    @functools.wraps(orig)
    def patched(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        plan = orig.__xgather_plan__(*bound.args, **bound.kwargs)  # every static rule
        mode = _modes.resolve(plan.op, a["mode"], spec_default)
        if module is onnx and (mode == "promise_in_bounds" or (mode == "error" and plan.negative)):
            prim = _PRIMS[name]
            attr = a[_NODES[name][1]]
            call = _Call(orig, {k: v for k, v in a.items() if k not in (data_name, "indices")})
            return prim.bind(jnp.asarray(a[data_name]), jnp.asarray(a["indices"]),
                             attr=attr, call=call)
        if mode == "error":
            if _dtypes.is_traced(a["indices"]):
                hint = ("; negative_indices=True exports as the ONNX node" if module is onnx
                        else "; the xgather.onnx ops export as the ONNX node")
                fail(plan.op, 'mode="error" cannot be exported, ONNX has no run-time check: '
                     'pass mode="clip", "fill" or "promise_in_bounds"' + hint)
            _check_constant(plan, a["indices"])
            mode = "promise_in_bounds"
        new = _plain(plan, mode, a.get("fill_value"), bound, data_name)
        if new is None:
            return orig(*bound.args, **bound.kwargs)
        return orig(**new)

    return patched


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

    class _OpsPlugin(_NodePlugin):
        """The Gather plugin also carries the export form of all ten ops."""

        @classmethod
        def binding_specs(cls):
            return [MonkeyPatchSpec(target=module, attr=name,
                                    make_value=functools.partial(_export_form, module, name,
                                                                 default))
                    for module, name, default in _OPS]

        @classmethod
        @contextlib.contextmanager
        def plugin_binding(cls):
            # Entered once per export around the trace: no jitted function traced
            # under the exporter's patches outlives it, nor one traced before is used.
            clear_caches()
            try:
                with super().plugin_binding():
                    yield
            finally:
                clear_caches()

    for name, (op_type, attr_name) in _NODES.items():
        base = _OpsPlugin if op_type == "Gather" else _NodePlugin
        cls = type(f"XGather{op_type}Plugin", (base,),
                   {"op_type": op_type, "attr_name": attr_name, "_PRIM": _PRIMS[name],
                    "_ABSTRACT_EVAL_BOUND": True})
        doc = f"https://onnx.ai/onnx/operators/onnx__{op_type}.html"
        _registered[op_type] = register_primitive(
            jaxpr_primitive=_PRIMS[name].name, context="primitives.xgather",
            component=f"xgather.onnx.{name}", onnx=[{"component": op_type, "doc": doc}],
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
    """
    register_jax2onnx()
    import jax2onnx

    return jax2onnx.to_onnx(fn, inputs, opset=opset, **kwargs)
