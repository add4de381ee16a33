"""Every private JAX name xgather reads, in one place.

Beside each name, a comment says why no public API does its job. Importing this
module never fails: a name that moved in the installed JAX is recorded in
``MISSING`` (name -> what went wrong), and the code that needs it takes the
fallback written beside it, which keeps results exact, and warns once
(``fallback``). ``tests/test_jaxprivate.py`` asserts, on every JAX the
project is tested on, that ``MISSING`` is empty and that each name still
means what xgather reads it for, so a move fails the suite loudly.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
import warnings
from typing import Any

import jax

#: Private names that the installed JAX lacks: name -> the error met reading it.
MISSING: dict[str, str] = {}
_warned: set[str] = set()
_lock = threading.Lock()


def _read(name: str, path: str, attr: str | None = None) -> Any:
    """``path.attr`` (the module ``path`` where ``attr`` is None), or None with ``name``
    and the error met in ``MISSING``."""
    try:
        value = importlib.import_module(path)
        return value if attr is None else getattr(value, attr)
    except Exception as err:  # noqa: BLE001 - a moved module or name: whatever it raises
        MISSING[name] = f"{path}{'' if attr is None else '.' + attr}: {type(err).__name__}: {err}"
        return None


def fallback(name: str, consequence: str) -> None:
    """Warn once per process that ``name`` is missing from this JAX, and what xgather
    does instead."""
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    warnings.warn(f"xgather: jax {jax.__version__} lacks the private name {MISSING[name]!r}; "
                  f"{consequence}. Install a jax that xgather is tested with (its README says "
                  "which) or report it.", RuntimeWarning, stacklevel=3)


# -- jax._src.config.enum_state --------------------------------------------------------------
# A config state that is part of every trace's context and of jit's C++ dispatch key. The
# public jax.config can only update states JAX defines; a library cannot declare one
# (jax.config.define_enum_state has no include_in_jit_key / include_in_trace_context).
_enum_state = _read("enum_state", "jax._src.config", "enum_state")


def enum_state(name: str, values: tuple[str, ...], default: str, help: str) -> Any:
    """A new trace-context config state, or None where this JAX cannot make one."""
    if _enum_state is None:
        return None
    try:
        return _enum_state(name, values, default, help, include_in_jit_key=True,
                           include_in_trace_context=True)
    except TypeError as err:  # the keywords changed meaning
        MISSING["enum_state"] = f"jax._src.config.enum_state: TypeError: {err}"
        return None


# -- the modules of lax's loops, of reverse-mode differentiation and of checkify ----------------
# Whether a scan/while body is traced inside a derivative, and whether a checkify is tracing
# the caller with which errors enabled: no public API says so. The ops look for these
# modules' frames among their callers (JAX traces a function by calling it).
LOOPS_MODULE = "jax._src.lax.control_flow.loops"
AD_MODULE = "jax._src.interpreters.ad"
CHECKIFY_MODULE = "jax._src.checkify"
#: The functions of AD_MODULE on the stack while ``grad``/``vjp``/``linearize`` traces.
_REVERSE = frozenset({"linearize", "vjp", "linearize_jaxpr", "linearize_subtrace"})
for _name, _module in (("loops", LOOPS_MODULE), ("ad", AD_MODULE),
                       ("checkify", CHECKIFY_MODULE)):
    _read(_name, _module)
#: ``checkify_errors`` where a checkify traces but its error set cannot be read.
UNKNOWN: frozenset = frozenset()


def checkify_errors(depth: int = 2):
    """The error set of the innermost ``checkify.checkify`` tracing the caller: None where
    none is, ``UNKNOWN`` where its frame holds no ``errors`` (checkify then decides)."""
    if "checkify" in MISSING:
        fallback("checkify", "a check under a plain jax.jit fails in checkify's own words")
        return UNKNOWN
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None:
        if frame.f_globals.get("__name__") == CHECKIFY_MODULE and \
                frame.f_code.co_name == "checked_fun":
            errors = frame.f_locals.get("errors")
            return errors if isinstance(errors, frozenset) else UNKNOWN
        frame = frame.f_back
    return None


def loop_inside_derivative() -> bool:
    """Whether a loop body is being traced inside a reverse-mode derivative: a frame of
    the loops' module below the caller, and a ``grad``/``vjp``/``linearize`` frame of JAX's
    AD module further out (a derivative taken inside the loop body is no such case)."""
    missing = next((name for name in ("loops", "ad") if name in MISSING), None)
    if missing is not None:
        fallback(missing, "a check traced in a differentiated loop body does not warn that "
                 "JAX drops it")
        return False
    frame: types.FrameType | None = sys._getframe(2)
    in_loop = False
    while frame is not None:
        module = frame.f_globals.get("__name__")
        if module == LOOPS_MODULE:
            in_loop = True
        elif in_loop and module == AD_MODULE and frame.f_code.co_name in _REVERSE:
            return True
        frame = frame.f_back
    return False


# -- jax._src.core.ShardingTypeError -----------------------------------------------------------
# The error JAX raises where it cannot infer a result's sharding on Explicit mesh axes; jax
# exports it under no public name (jax.errors has no sharding error).
# Where it is missing, an empty except clause: JAX's own error comes through.
SHARDING_TYPE_ERROR: Any = _read("ShardingTypeError", "jax._src.core", "ShardingTypeError") or ()


# -- jax._src.array.ArrayImpl ------------------------------------------------------------------
# The concrete class of a JAX array. The eager call's cache key compares ``type(x) is`` it:
# the public jax.Array is an ABC that tracers match too, and isinstance costs more.
ARRAY_IMPL: type = (_read("ArrayImpl", "jax._src.array", "ArrayImpl")
                   or type("NoArrayImpl", (), {}))


# -- jax._src.xla_bridge.backends_are_initialized ----------------------------------------------
# Whether JAX has started its backends: the public jax.devices() would start them.
def backends_started() -> bool | None:
    """True once JAX started a backend, None where this JAX cannot say."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    if started is None:
        MISSING["backends_are_initialized"] = (
            "jax._src.xla_bridge.backends_are_initialized: AttributeError")
        return None
    return bool(started())


# -- checkify.Error._pred ----------------------------------------------------------------------
# A checkify Error's failed-check predicates, as traced values. Its public ``get()`` and
# ``throw()`` read them on the host, after the program has run.
def error_predicates(err) -> list | None:
    """The predicates of a checkify ``Error``, or None where it has no such field."""
    preds = getattr(err, "_pred", None)
    if not isinstance(preds, dict):
        MISSING["Error._pred"] = "jax.experimental.checkify.Error._pred: not a dict"
        return None
    return list(preds.values())


# -- jax._src.core.ClosedJaxpr, for jax2onnx -----------------------------------------------------
# jax2onnx 0.17 reads jax._src.core.ClosedJaxpr, which jax 0.12 merged into Jaxpr; the
# public jax.extend.core.ClosedJaxpr still names that class. xgather.export sets the old
# name to it where it is missing (the same class JAX exports), before jax2onnx traces.
def alias_closed_jaxpr() -> bool:
    """Give ``jax._src.core`` its ``ClosedJaxpr`` where this JAX lacks it; True where the
    name is there (now or before)."""
    core: Any = sys.modules.get("jax._src.core")  # imported with jax
    if core is None:
        return False
    if hasattr(core, "ClosedJaxpr"):
        return True
    import jax.extend.core as public
    closed = getattr(public, "ClosedJaxpr", None)
    if closed is None:
        return False
    core.ClosedJaxpr = closed
    return True
