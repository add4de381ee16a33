"""Small helpers shared by the spec frontends."""

from __future__ import annotations

import numpy as np

from xgather import _apply, _dtypes, _modes
from xgather._errors import fail


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


def call(plan, data, indices, allowed, mode, fill_value, *, spec_default="error", **run_kw):
    """Every frontend's last step: indices checked and converted, mode resolved, plan run."""
    check_addressable(plan)
    idx = _dtypes.index_array(plan.op, indices, allowed, shapes(data, indices))
    return _apply.run(plan, data, idx, _modes.resolve(plan.op, mode, spec_default), fill_value,
                      **run_kw)
