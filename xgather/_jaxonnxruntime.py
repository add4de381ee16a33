"""xgather's gathers as jaxonnxruntime handlers (extra ``xgather[jaxonnxruntime]``).

jaxonnxruntime 0.3 picks, for each op type, the last direct subclass of its
``Handler`` that declares it (``Handler.__subclasses__()``, in creation order)
and calls its ``version_<since>`` method, ``<since>`` being the op version in
force at the model's opset. ``__subclasses__()`` holds weak references, so the
classes made here are kept in :data:`HANDLERS`.
"""

from __future__ import annotations

import functools

# ONNX op type -> (xgather.onnx op, its attribute, the op versions' name in xgather.onnx)
_OPS = {
    "Gather": ("gather", "axis", "GATHER_OPSETS"),
    "GatherND": ("gather_nd", "batch_dims", "GATHER_ND_OPSETS"),
    "GatherElements": ("gather_elements", "axis", "GATHER_ELEMENTS_OPSETS"),
}

#: The handler classes, once :func:`register_jaxonnxruntime` has run (strong references).
HANDLERS: dict[str, type] = {}


def _handler(handler_base, register_op, op_type: str) -> type:
    from xgather import onnx

    name, attr, versions = _OPS[op_type]
    fn, versions = getattr(onnx, name), getattr(onnx, versions)

    def version(opset, cls, node, inputs):
        node.attrs_dict[attr] = node.attrs.get(attr, 0)
        return functools.partial(fn, opset=opset)

    namespace: dict[str, object] = {f"version_{v}": classmethod(functools.partial(version, v))
                                    for v in versions}
    namespace["__doc__"] = f"ONNX {op_type} through xgather.onnx.{fn.__name__}."
    return register_op(op_type)(type(f"XGather{op_type}", (handler_base,), namespace))


def register_jaxonnxruntime() -> dict[str, type]:
    """Make jaxonnxruntime run every Gather, GatherND and GatherElements node through xgather.

    Covers Gather 1/11/13, GatherND 11/12/13 and GatherElements 11/13 (the version
    in force at the model's opset). Out-of-range indices follow xgather's mode:
    eagerly an :class:`~xgather.OutOfBoundsError`; under ``jax.jit`` wrap the
    model function with :func:`xgather.checked`, or set a mode with
    :func:`xgather.default_mode`. Idempotent.

    Returns:
      The handler classes by ONNX op type.

    Raises:
      ImportError: jaxonnxruntime is not installed (``pip install 'xgather[jaxonnxruntime]'``).
    """
    if not HANDLERS:
        try:
            from jaxonnxruntime.core import handler
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("register_jaxonnxruntime needs jaxonnxruntime: "
                              "pip install 'xgather[jaxonnxruntime]'") from err
        # jaxonnxruntime's own handlers must exist first, so that ours come later.
        import jaxonnxruntime.onnx_ops  # noqa: F401

        for op_type in _OPS:
            HANDLERS[op_type] = _handler(handler.Handler, handler.register_op, op_type)
    return dict(HANDLERS)
