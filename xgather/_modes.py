"""Out-of-bounds modes, and the default where a spec calls an out-of-range index an error.

Modes (``mode=`` on every op):

* ``"error"``: an index outside the spec's range is an error. Eagerly it raises
  [`OutOfBoundsError`][xgather.OutOfBoundsError] at once; under ``jax.jit`` the traced function
  must be wrapped with [`xgather.checked`][xgather.checked] (see ``xgather._check``).
* ``"clip"``: in-range negative indices wrap; anything still outside is clamped
  to the nearest end (``< -s`` reads position 0, ``>= s`` reads ``s-1``).
* ``"fill"``: in-range negative indices wrap; anything outside yields
  ``fill_value`` (0 unless given) and sends no gradient back.
* ``"promise_in_bounds"``: the caller promises every index is in range; no
  check, no masking (XLA clamps whatever slips through).

``mode=None`` means the spec's own rule. For a spec that calls an out-of-range
index an error, that is ``"error"`` unless a process-wide default was set with
the ``XGATHER_MODE`` environment variable, [`set_default_mode`][xgather.set_default_mode] or the
[`default_mode`][xgather.default_mode] context manager: a JAX config state, so that it is
part of what a trace is keyed on and a jitted function follows the default in force at the call.
Specs that define the result of an out-of-range index (OpenVINO Gather: zeros) keep their rule.

"The spec's range" is ``[-s, s-1]`` where negative indices count from the end
(``plan.negative``), else ``[0, s-1]``; ``negative_indices=False`` on an op
chooses the second, which also skips the wrap (``xgather._indices``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Literal

import jax
from jax import lax

from xgather import _jaxprivate
from xgather._errors import XGatherError, choice

Mode = Literal["error", "clip", "fill", "promise_in_bounds"]
MODES: tuple[str, ...] = ("error", "clip", "fill", "promise_in_bounds")
"""The modes every op takes (``mode=``); ``None`` is the spec's own rule."""

_LAX_MODE = {
    "error": lax.GatherScatterMode.PROMISE_IN_BOUNDS,  # checked before the gather
    "clip": lax.GatherScatterMode.CLIP,
    "fill": lax.GatherScatterMode.FILL_OR_DROP,
    "promise_in_bounds": lax.GatherScatterMode.PROMISE_IN_BOUNDS,
}


def _env_default() -> str:
    value = os.environ.get("XGATHER_MODE") or "error"
    if value not in MODES:
        raise XGatherError(f"XGATHER_MODE must be one of {', '.join(MODES)}; got {value!r}")
    return value


def set_default_mode(mode: Mode | None) -> None:
    """Set the process-wide mode used where a spec calls out-of-range an error.

    ``None`` restores the spec's rule (``"error"``). The environment variable
    ``XGATHER_MODE`` sets the same default at import.
    """
    if mode is not None:
        choice("xgather.set_default_mode", "mode", mode, MODES)
    _DEFAULT.set(mode or "error")


@contextlib.contextmanager
def default_mode(mode: Mode | None):
    """Context manager form of [`set_default_mode`][xgather.set_default_mode] (restored on
    exit), for the current thread only; it overrides the process's default there.

    The default is part of what a trace is keyed on, as JAX's own config contexts
    are: a function jitted (or [`xgather.checked`][xgather.checked]) outside the block runs in
    the default in force at each call, inside the block and after it.
    """
    if mode is not None:
        choice("xgather.default_mode", "mode", mode, MODES)
    with _DEFAULT.traced_as(mode or "error"):
        yield


def current_default() -> str | None:
    """The default in force here: [`default_mode`][xgather.default_mode]'s, else the
    process's (None: the spec's rule)."""
    mode = _DEFAULT.value
    return None if mode == "error" else mode


def resolve(op: str, mode: str | None, spec_default: str = "error") -> str:
    """The mode an op runs in: the caller's, else the process default, else the spec's."""
    if mode is None:
        mode = (current_default() or spec_default) if spec_default == "error" else spec_default
    choice(op, "mode", mode, MODES)
    return mode


def lax_mode(mode: str) -> lax.GatherScatterMode:
    return _LAX_MODE[mode]


class TraceState:
    """A JAX config state of ``values`` (``jax.config.update(name, ...)`` and the
    upper-case environment variable set it for the process), read and set here.

    It is part of every trace's context (the caches of tracing, lowering and nested
    jits) and of the jit dispatch key: without the latter, a jitted function called
    again from Python under another value would run the program traced under the
    first (JAX's C++ dispatch cache looks at jit-key states only). Where this JAX cannot
    make such a state, it is always ``default``, and asking for another value warns once
    (``xgather._jaxprivate.fallback``).
    """

    def __init__(self, name: str, values: tuple[str, ...], default: str, help: str):
        self.name, self.values, self.default = name, values, default
        self.fallback_value = default  # the process's value where JAX has no such state
        self._state: Any = _jaxprivate.enum_state(name, values, default, help)

    @property
    def value(self) -> str:
        """The value asked for here."""
        return self.fallback_value if self._state is None else self._state.value

    def set(self, value: str) -> None:
        """Set the state for the process (every thread), as ``jax.config.update`` does."""
        if self._state is None:
            self.fallback_value = value
        else:
            jax.config.update(self.name, value)

    def traced_as(self, value: str, where: str | None = None):
        """A context manager that sets the state to ``value`` for a block (nothing where
        JAX has no such state). ``where``: the public function asking, which checks
        ``value`` against ``values`` first."""
        if where is not None:
            choice(where, "kind", value, self.values)
        if self._state is None:
            if value != self.default:
                _jaxprivate.fallback("enum_state", f"{self.name} stays {self.default!r}")
            return contextlib.nullcontext()
        return self._state(value)


#: The default mode where a spec calls an out-of-range index an error (``TraceState``).
_DEFAULT = TraceState("xgather_default_mode", MODES, _env_default(),
                      "The mode of xgather's ops where their spec calls an out-of-range "
                      "index an error (error, clip, fill or promise_in_bounds).")
