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


def shapes(data, indices) -> dict[str, tuple[int, ...]]:
    """The shapes an error message shows."""
    return {"data": _dtypes.shape_of(data), "indices": _dtypes.shape_of(indices)}


def negatives(op: str, negative_indices, sh) -> bool:
    """The ``negative_indices`` option: True (the spec's rule) or False (``[0, s-1]`` only)."""
    if not isinstance(negative_indices, bool | np.bool_):
        fail(op, "negative_indices must be a bool", repr(negative_indices), sh)
    return bool(negative_indices)


def call(plan, data, indices, allowed, mode, fill_value, *, spec_default="error", **run_kw):
    """Every frontend's last step: indices checked and converted, mode resolved, plan run."""
    idx = _dtypes.index_array(plan.op, indices, allowed, shapes(data, indices))
    return _apply.run(plan, data, idx, _modes.resolve(plan.op, mode, spec_default), fill_value,
                      **run_kw)
