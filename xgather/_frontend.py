"""Small helpers shared by the spec frontends, and the per-signature cache of eager calls.

An eager call (concrete arrays in, no transformation) is settled once per
signature: the op's name, the shapes, dtypes and kinds (JAX or NumPy) of
``data`` and ``indices``, every other argument, the process-wide default
mode and the x64 flag. The first call runs the frontend as usual and leaves
behind a runner (:func:`xgather._apply.concrete_runner`); later calls with
the same signature go straight to it: one dict lookup, then the jitted
program, with the same checks and errors.
"""

from __future__ import annotations

import functools
import operator
import threading

import numpy as np

from xgather import _apply, _dtypes, _modes
from xgather._errors import fail

#: Signature -> runner, filled by :func:`call`; :func:`xgather._apply.clear_caches` empties it.
RUNNERS: dict = {}
_pending = threading.local()  # the signature of the eager call being settled


def _specs() -> dict:
    """What a key holds of a concrete array, by its exact type: a JAX array's aval
    (shape, dtype, weak type; one attribute read, hashed once), a NumPy array's shape
    and dtype. Tracers, lists and subclasses have no entry: such calls are not cached."""
    from jax._src.array import ArrayImpl
    return {ArrayImpl: operator.attrgetter("aval"),
            np.ndarray: operator.attrgetter("shape", "dtype")}


_SPECS = _specs()


def signature(op, args: tuple, kwargs: dict):
    """The cache key of an eager call, or None where its arrays are not concrete (tracers,
    lists). A key holding an unhashable attribute (an array as ``axis``) is no key either:
    :func:`cached` finds that out when it looks the key up."""
    if len(args) < 2:
        return None
    spec_data, spec_indices = _SPECS.get(type(args[0])), _SPECS.get(type(args[1]))
    if spec_data is None or spec_indices is None:
        return None
    attrs = args[2:]
    values = attrs
    if kwargs:
        attrs += tuple(kwargs.items())
        values += tuple(kwargs.values())
    # The attributes' types too: 1, 1.0 and True are equal keys but not equal arguments.
    return (op, spec_data(args[0]), spec_indices(args[1]), attrs, tuple(map(type, values)),
            _modes.current_default(), _dtypes.x64())


def cached(op):
    """``op`` with its eager calls cached per signature (see the module docstring)."""
    @functools.wraps(op)
    def wrapper(*args, **kwargs):
        key = signature(wrapper, args, kwargs)
        if key is None:
            return op(*args, **kwargs)
        try:
            runner = RUNNERS.get(key)
        except TypeError:  # an unhashable attribute: no signature
            return op(*args, **kwargs)
        if runner is not None:
            return runner(args[0], args[1])
        outer = getattr(_pending, "key", None)
        _pending.key = key
        try:
            return op(*args, **kwargs)
        finally:
            _pending.key = outer
    return wrapper


def versioned(spec: str, name: str, version, supported: tuple[int, ...], what: str) -> str:
    """``"onnx.Gather-13"``, or an error that lists the supported versions."""
    if isinstance(version, bool) or version not in supported:
        fail(f"{spec}.{name}", f"{what} must be one of {', '.join(map(str, supported))}",
             f"{what}={version!r}")
    return f"{spec}.{name}-{version}"


#: What a frontend takes as an array besides objects with ``.shape`` and ``.dtype``.
_ARRAY_LIKE = (list, tuple, int, float, complex, np.generic)


def check_array(op: str, name: str, x) -> None:
    """``x`` is an array, or a (nested) list or scalar that NumPy makes one of, else an error.

    ``None``, strings and other objects are not arrays: without this check they
    would read as rank-0 arrays and fail later with a misleading rank error.
    """
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return
    if isinstance(x, _ARRAY_LIKE):
        return
    fail(op, f"{name} must be an array (or a nested list or scalar of numbers)",
         f"{type(x).__module__}.{type(x).__qualname__}".removeprefix("builtins."))


def shapes(data, indices, op: str | None = None) -> dict[str, tuple[int, ...]]:
    """The shapes an error message shows; with ``op``, both inputs are checked to be arrays."""
    if op is not None:
        check_array(op, "data", data)
        check_array(op, "indices", indices)
    return {"data": _dtypes.shape_of(data), "indices": _dtypes.shape_of(indices)}


def check_addressable(plan) -> None:
    """With x64 off, indices are at most 32 bits: an axis of ``2**31`` or more is out of reach."""
    if not _dtypes.x64() and max(plan.bounds, default=0) > np.iinfo(np.int32).max:
        fail(plan.op, "with jax_enable_x64 off, indices are int32 and cannot address an axis of "
             "2**31 or more elements (enable it with jax.config.update('jax_enable_x64', True))",
             f"axis sizes {plan.bounds} for data axes {plan.index_axes}",
             {"data": plan.data_shape, "indices": plan.indices_shape})


def negatives(op: str, negative_indices, sh) -> bool:
    """The ``negative_indices`` option: True (the spec's rule) or False (``[0, s-1]`` only)."""
    if not isinstance(negative_indices, bool | np.bool_):
        fail(op, "negative_indices must be a bool", repr(negative_indices), sh)
    return bool(negative_indices)


def call(plan, data, indices, allowed, mode, fill_value, *, spec_default="error",
         indices_are_sorted=False, unique_indices=False, grad=None):
    """Every frontend's last step: indices checked and converted, mode resolved, plan run.

    On the first eager call of a signature the runner is also cached.
    """
    check_addressable(plan)
    sh = shapes(data, indices)
    idx = _dtypes.index_array(plan.op, indices, allowed, sh)
    mode = _modes.resolve(plan.op, mode, spec_default)
    key = getattr(_pending, "key", None)
    if key is not None and not _dtypes.needs_host(data):
        _pending.key = None  # the signature is settled here, for this call alone
        _dtypes.check_data(plan.op, data, sh)
        hints = (bool(indices_are_sorted), bool(unique_indices))
        gather = _apply.concrete_runner(plan, mode, _apply.scalar(fill_value), hints, grad, idx)
        runner = gather
        if isinstance(indices, np.ndarray):
            def runner(data, indices):
                return gather(data, _dtypes.index_array(plan.op, indices, allowed, sh))
        RUNNERS[key] = runner
        return gather(data, idx)  # idx: converted above already
    return _apply.run(plan, data, idx, mode, fill_value, indices_are_sorted=indices_are_sorted,
                      unique_indices=unique_indices, grad=grad)
