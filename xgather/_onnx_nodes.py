"""ONNX models in: model opsets, ``NodeProto`` adapters and ``onnx.reference`` ops.

* :func:`op_version` maps a model's opset_import to the version of an op in
  force there, the way onnxruntime and onnx's schema table resolve it.
* :func:`from_node` turns a ``Gather``, ``GatherND`` or ``GatherElements``
  node into a callable of its inputs, attributes bound.
* :func:`reference_ops` gives ``OpRun`` classes that make
  ``onnx.reference.ReferenceEvaluator`` run those nodes through xgather.

The ``onnx`` package is needed only by the last two, and imported when they run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from xgather._errors import XGatherError, choice, fail
from xgather._modes import MODES

#: The versions of each served op: the opsets in which its definition changed.
VERSIONS: Mapping[str, tuple[int, ...]] = {
    "Gather": (1, 11, 13),
    "GatherND": (11, 12, 13),
    "GatherElements": (11, 13),
}

#: Each op's attributes, their ONNX defaults, and the op version they appear in.
ATTRIBUTES: Mapping[str, Mapping[str, tuple[int, int]]] = {
    "Gather": {"axis": (0, 1)},
    "GatherND": {"batch_dims": (0, 12)},
    "GatherElements": {"axis": (0, 11)},
}

#: The keyword options of the xgather ops that :func:`from_node` passes through.
OPTIONS = ("mode", "fill_value", "indices_are_sorted", "unique_indices", "negative_indices")

_DOMAINS = ("", "ai.onnx")
_FUNCTIONS = {"Gather": "gather", "GatherND": "gather_nd", "GatherElements": "gather_elements"}


def op_version(op_type: str, opset: int) -> int:
    """The version of ``op_type`` in force in a model whose opset_import is ``opset``.

    The newest version not above ``opset``, as onnxruntime resolves it (and as
    ``onnx.defs.get_schema(op_type, opset).since_version`` says): Gather 1, 11,
    13; GatherND 11, 12, 13; GatherElements 11, 13. An opset before the op
    existed is an error. Opsets above the newest version take the newest: no
    opset up to 26 changed these ops.

    >>> op_version("Gather", 21), op_version("GatherND", 12), op_version("GatherElements", 12)
    (13, 12, 11)
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
    """The xgather op, looked up at call time (so a patched ``xgather.onnx`` is seen)."""
    from xgather import onnx  # noqa: PLC0415  (xgather.onnx imports this module)

    return getattr(onnx, _FUNCTIONS[op_type])


def from_node(node, opset: int = 13, **options) -> Callable:
    """An ONNX ``NodeProto`` as a JAX callable ``f(data, indices)``.

    Args:
      node: an ``onnx.NodeProto`` of op type ``Gather``, ``GatherND`` or
        ``GatherElements`` in the default domain (``""`` or ``"ai.onnx"``), with
        two inputs.
      opset: the model's opset_import for the default domain (e.g. 17 or 21);
        the op version in force there is used (see :func:`op_version`).
      **options: ``mode``, ``fill_value``, ``indices_are_sorted``,
        ``unique_indices``, ``negative_indices``, passed to the op.

    Returns:
      A function of ``(data, indices)`` that runs :func:`xgather.onnx.gather`,
      :func:`~xgather.onnx.gather_nd` or :func:`~xgather.onnx.gather_elements`
      with the node's ``axis`` or ``batch_dims`` (ONNX default 0). It works
      under ``jax.jit``, ``jax.grad`` and ``jax.vmap`` as the op does, and
      ``xgather.explain(f, data, indices)`` shows its plan.

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
            out = _op(op_type)(data, indices, 0 if value is None else value, opset=self.opset,
                               **self.xgather_options)
            # A NumPy array (a copy: the evaluator's other ops may write into it), of
            # data's dtype (the host path keeps 64-bit data exact with x64 off).
            return (np.array(out),)

    return XGatherOpRun


def reference_ops(**options) -> list[type]:
    """``OpRun`` classes that run Gather, GatherND, GatherElements through xgather.

    Pass them to ``onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())``:
    every gather node of the model (subgraphs included) then runs through
    :mod:`xgather.onnx` at the op version the model's opset_import puts in force,
    and returns a NumPy array of ``data``'s dtype. With ``jax_enable_x64`` off,
    64-bit data takes xgather's host path and stays exact. An out-of-range index
    raises :class:`xgather.OutOfBoundsError` (the ONNX rule) unless ``options``
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


__all__ = ["XGatherError", "check_attributes", "from_node", "op_version", "reference_ops",
           "resolve"]
