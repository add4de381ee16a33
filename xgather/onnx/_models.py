"""ONNX models in: ``NodeProto`` adapters, ``onnx.reference`` ops and jaxonnxruntime handlers.

* [`from_node`][xgather.onnx.from_node] turns a ``Gather``, ``GatherND`` or ``GatherElements``
  node into a callable of its inputs, attributes bound.
* [`reference_ops`][xgather.onnx.reference_ops] gives ``OpRun`` classes that make
  ``onnx.reference.ReferenceEvaluator`` run those nodes through xgather.
* [`register_jaxonnxruntime`][xgather.onnx.register_jaxonnxruntime] makes jaxonnxruntime run them
through xgather.

The op versions in force come from ``xgather.onnx._ops`` ([`op_version`][xgather.onnx.op_version]).
The ``onnx`` package (and jaxonnxruntime for the last) is needed only when they run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from xgather._errors import XGatherError, choice, fail, for_node
from xgather._modes import MODES
from xgather.onnx import _ops
from xgather.onnx._ops import ATTRIBUTES, VERSIONS, op_version, resolve

#: The keyword options of the xgather ops that [`from_node`][xgather.onnx.from_node]
#: passes through.
OPTIONS = ("mode", "fill_value", "indices_are_sorted", "unique_indices", "negative_indices")

_DOMAINS = ("", "ai.onnx")
_FUNCTIONS = {"Gather": "gather", "GatherND": "gather_nd", "GatherElements": "gather_elements"}


def check_attributes(op_type: str, opset: int, names) -> None:
    """Every attribute name known to ``op_type`` at model ``opset``, else an error naming it."""
    known = ATTRIBUTES[op_type]
    op, _ = resolve(op_type, opset)
    names = list(names)
    for name in names:
        if names.count(name) > 1:  # a NodeProto can repeat one (onnx.checker rejects it)
            fail(op, "each attribute may appear once", f"{name} {names.count(name)} times")
        if name not in known:
            fail(op, f"unknown attribute; {op_type} takes only {', '.join(known)}", repr(name))
        if opset < known[name][1]:
            fail(op, f"attribute {name} exists from opset {known[name][1]} on",
                 f"{name} at model opset {opset}")


def _check_options(op: str, options) -> dict:
    """The pass-through options, names checked and ``mode`` checked now (not at the first call)."""
    for name in options:
        if name not in OPTIONS:
            fail(op, f"options must be among {', '.join(OPTIONS)}", repr(name))
    if options.get("mode") is not None:
        choice(op, "mode", options["mode"], MODES)
    return dict(options)


def _attribute_value(op: str, attr):
    from onnx import AttributeProto, helper  # noqa: PLC0415  (an optional dependency)

    if attr.ref_attr_name:
        fail(op, f"attribute {attr.name} refers to the function attribute "
             f"{attr.ref_attr_name!r}; from_node needs its value", None)
    if attr.type != AttributeProto.INT:
        fail(op, f"attribute {attr.name} must be an int",
             AttributeProto.AttributeType.Name(attr.type))
    return helper.get_attribute_value(attr)


def _op(op_type: str) -> Callable:
    """The ``xgather.onnx`` op of ``op_type``, looked up in ``xgather.onnx._ops`` at call
    time (so that a test may count its calls there)."""
    return getattr(_ops, _FUNCTIONS[op_type])


def from_node(node, opset: int = 13, **options) -> Callable:
    """An ONNX ``NodeProto`` as a JAX callable ``f(data, indices)``.

    Args:
      node: an ``onnx.NodeProto`` of op type ``Gather``, ``GatherND`` or
        ``GatherElements`` in the default domain (``""`` or ``"ai.onnx"``), with
        two inputs.
      opset: the model's opset_import for the default domain (e.g. 17 or 21);
        the op version in force there is used (see [`op_version`][xgather.onnx.op_version]).
      **options: ``mode``, ``fill_value``, ``indices_are_sorted``,
        ``unique_indices``, ``negative_indices``, passed to the op.

    Returns:
      A function of ``(data, indices)`` that runs [`xgather.onnx.gather`][xgather.onnx.gather],
        [`gather_nd`][xgather.onnx.gather_nd] or
        [`gather_elements`][xgather.onnx.gather_elements] with the node's ``axis`` or
        ``batch_dims`` (ONNX default 0). It works under ``jax.jit``, ``jax.grad`` and
        ``jax.vmap`` as the op does, and ``xgather.explain(f, data, indices)`` shows its
        plan.

    Examples:
        >>> import numpy as np, onnx, xgather
        >>> node = onnx.helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
        >>> f = xgather.onnx.from_node(node, opset=21)
        >>> f(np.array([[1, 2, 3]]), np.array([2, -3])).tolist()
        [[3, 1]]
    """
    op_type = getattr(node, "op_type", None)
    if op_type is None:
        fail("xgather.onnx.from_node", "node must be an onnx.NodeProto", type(node).__name__)
    if node.domain not in _DOMAINS:
        fail(f"onnx.{op_type}", "from_node serves the default ONNX domain ('' or 'ai.onnx')",
             repr(node.domain))
    if op_type not in VERSIONS:
        fail("xgather.onnx.from_node",
             f"op_type must be one of {', '.join(VERSIONS)}",
             repr(op_type) + (f" (node {node.name!r})" if node.name else ""))
    label, _ = resolve(op_type, opset)
    if len(node.input) != 2 or len(node.output) != 1:
        fail(label, f"{op_type} takes 2 inputs and gives 1 output",
             f"{len(node.input)} inputs and {len(node.output)} outputs")
    check_attributes(op_type, opset, [a.name for a in node.attribute])
    attrs = {name: default for name, (default, _) in ATTRIBUTES[op_type].items()}
    attrs.update({a.name: _attribute_value(label, a) for a in node.attribute})
    options = _check_options(label, options)
    (attr, value), = attrs.items()

    def run(data, indices):
        with for_node(node.name):
            return _op(op_type)(data, indices, value, opset=opset, **options)

    def plan(data, indices):
        return _op(op_type).__xgather_plan__(data, indices, value, opset=opset,
                                             negative_indices=options.get("negative_indices",
                                                                          True))

    run.__xgather_plan__ = plan  # type: ignore[attr-defined]
    run.__name__ = f"{op_type}_{attr}{value}_opset{opset}"
    run.__qualname__ = run.__name__
    run.__doc__ = f"ONNX node {node.name!r}: {label} with {attr}={value} (model opset {opset})."
    return run


@functools.cache
def _base():
    """The ``OpRun`` base of the xgather ops (built once, when ``onnx`` is there)."""
    from onnx.reference.op_run import OpRun  # noqa: PLC0415  (an optional dependency)

    class XGatherOpRun(OpRun):
        """Runs one gather node of a ReferenceEvaluator through xgather."""

        op_domain = ""
        xgather_options: Mapping = {}

        def __init__(self, onnx_node, run_params, schema=None):
            super().__init__(onnx_node, run_params, schema)
            self.opset = int(run_params["opsets"][onnx_node.domain])
            self.version = op_version(onnx_node.op_type, self.opset)
            check_attributes(onnx_node.op_type, self.opset,
                             [a.name for a in onnx_node.attribute])

        def run(self, *args, **kwargs):
            # OpRun.run turns any TypeError of _run (XGatherTypeError is one) into its own
            # "Issues with types" TypeError: raise xgather's error, with its message, instead.
            try:
                return super().run(*args, **kwargs)
            except TypeError as e:
                if isinstance(e.__cause__, XGatherError):
                    raise e.__cause__ from None
                raise

        def _run(self, data, indices, **attrs):
            # The evaluator passes every attribute (the node's, its schema's
            # defaults, function-linked ones resolved): one int here.
            op_type = self.onnx_node.op_type
            value = attrs.get(next(iter(ATTRIBUTES[op_type])))
            with for_node(self.onnx_node.name):
                out = _op(op_type)(data, indices, 0 if value is None else value,
                                   opset=self.opset, **self.xgather_options)
            # A NumPy array (a copy: the evaluator's other ops may write into it), of
            # data's dtype (the host path keeps 64-bit data exact with x64 off).
            return (np.array(out),)

    return XGatherOpRun


def reference_ops(**options) -> list[type]:
    """``OpRun`` classes that run Gather, GatherND, GatherElements through xgather.

    Pass them to ``onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())``:
    every gather node of the model (subgraphs included) then runs through
    [`xgather.onnx`][xgather.onnx] at the op version the model's opset_import puts in force,
    and returns a NumPy array of ``data``'s dtype. With ``jax_enable_x64`` off,
    64-bit data takes xgather's host path and stays exact. An out-of-range index
    raises [`xgather.OutOfBoundsError`][xgather.OutOfBoundsError] (the ONNX rule) unless ``options``
    say otherwise.

    Args:
      **options: ``mode``, ``fill_value``, ``indices_are_sorted``,
        ``unique_indices``, ``negative_indices``, for every node.

    Returns:
      Three ``OpRun`` subclasses named ``Gather``, ``GatherND``, ``GatherElements``.
    """
    options = _check_options("xgather.onnx.reference_ops", options)
    base = _base()
    return [type(op_type, (base,), {"xgather_options": options, "__module__": __name__,
                                    "__doc__": f"ONNX {op_type} run by xgather."})
            for op_type in VERSIONS]


# jaxonnxruntime 0.3 picks, for each op type, the last direct subclass of its ``Handler``
# that declares it (``Handler.__subclasses__()``, in creation order) and calls its
# ``version_<since>`` method, ``<since>`` being the op version in force at the model's
# opset. ``__subclasses__()`` holds weak references, so the classes made here are kept in
# ``HANDLERS``.

# ONNX op type -> (xgather.onnx op, its attribute)
_JOR_OPS = {"Gather": ("gather", "axis"), "GatherND": ("gather_nd", "batch_dims"),
            "GatherElements": ("gather_elements", "axis")}

#: The handler classes, once
#: [`register_jaxonnxruntime`][xgather.onnx.register_jaxonnxruntime] has run (strong
#: references).
HANDLERS: dict[str, type] = {}


def _handler(handler_base, register_op, op_type: str) -> type:
    name, attr = _JOR_OPS[op_type]
    fn, versions = getattr(_ops, name), VERSIONS[op_type]

    def version(opset, cls, node, inputs):
        node.attrs_dict[attr] = node.attrs.get(attr, 0)
        name = getattr(node, "name", None)

        def run(*args, **kwargs):
            with for_node(name):
                return fn(*args, opset=opset, **kwargs)
        return run

    namespace: dict[str, object] = {f"version_{v}": classmethod(functools.partial(version, v))
                                    for v in versions}
    namespace["__doc__"] = f"ONNX {op_type} through xgather.onnx.{fn.__name__}."
    return register_op(op_type)(type(f"XGather{op_type}", (handler_base,), namespace))


def register_jaxonnxruntime() -> dict[str, type]:
    """Make jaxonnxruntime run every Gather, GatherND and GatherElements node through xgather.

    Covers Gather 1/11/13, GatherND 11/12/13 and GatherElements 11/13 (the version
    in force at the model's opset). Out-of-range indices follow xgather's mode:
    eagerly an [`OutOfBoundsError`][xgather.OutOfBoundsError]; under ``jax.jit`` wrap the
    model function with [`xgather.checked`][xgather.checked], or set a mode with
    [`xgather.default_mode`][xgather.default_mode]. Idempotent.

    Returns:
      The handler classes by ONNX op type.

    Raises:
      ImportError: jaxonnxruntime is not installed (in xgather's clone:
        ``pip install -e '.[jaxonnxruntime]'``).
    """
    if not HANDLERS:
        try:
            from jaxonnxruntime.core import handler
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "register_jaxonnxruntime needs jaxonnxruntime: "
                "pip install -e '.[jaxonnxruntime]' (in xgather's clone)") from err
        # jaxonnxruntime's own handlers must exist first, so that ours come later.
        import jaxonnxruntime.onnx_ops  # noqa: F401

        for op_type in _JOR_OPS:
            HANDLERS[op_type] = _handler(handler.Handler, handler.register_op, op_type)
    return dict(HANDLERS)
