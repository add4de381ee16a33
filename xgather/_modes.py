"""Out-of-bounds modes, the negative-index wrap and the bound check.

Modes (``mode=`` on every op):

* ``"error"``: an index outside the spec's range is an error. Eagerly it raises
  :class:`~xgather.OutOfBoundsError` at once; under ``jax.jit`` the check is a
  ``jax.experimental.checkify`` check, so the traced function must be wrapped
  with :func:`xgather.checked` (or ``checkify.checkify``).
* ``"clip"``: in-range negative indices wrap; anything still outside is clamped
  to the nearest end (``< -s`` reads position 0, ``>= s`` reads ``s-1``).
* ``"fill"``: in-range negative indices wrap; anything outside yields
  ``fill_value`` (0 unless given) and sends no gradient back.
* ``"promise_in_bounds"``: the caller promises every index is in range; no
  check, no masking (XLA clamps whatever slips through).

``mode=None`` means the spec's own rule. For a spec that calls an out-of-range
index an error, that is ``"error"`` unless a process-wide default was set with
the ``XGATHER_MODE`` environment variable, :func:`set_default_mode` or the
:func:`default_mode` context manager. Specs that define the result of an
out-of-range index (OpenVINO Gather: zeros) keep their rule.

"The spec's range" is ``[-s, s-1]`` where negative indices count from the end
(``plan.negative``), else ``[0, s-1]``; ``negative_indices=False`` on an op
chooses the second, which also skips the wrap.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from xgather._errors import OutOfBoundsError, XGatherError, choice, fail

Mode = Literal["error", "clip", "fill", "promise_in_bounds"]
MODES: tuple[str, ...] = ("error", "clip", "fill", "promise_in_bounds")

_LAX_MODE = {
    "error": lax.GatherScatterMode.PROMISE_IN_BOUNDS,  # checked before the gather
    "clip": lax.GatherScatterMode.CLIP,
    "fill": lax.GatherScatterMode.FILL_OR_DROP,
    "promise_in_bounds": lax.GatherScatterMode.PROMISE_IN_BOUNDS,
}


def _env_default() -> str | None:
    value = os.environ.get("XGATHER_MODE") or None
    if value is not None and value not in MODES:
        raise XGatherError(f"XGATHER_MODE must be one of {', '.join(MODES)}; got {value!r}")
    return value


_default: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "xgather_default_mode", default=_env_default())  # noqa: B039 (a str or None)


def set_default_mode(mode: Mode | None) -> None:
    """Set the process-wide mode used where a spec calls out-of-range an error.

    ``None`` restores the spec's rule (``"error"``). The environment variable
    ``XGATHER_MODE`` sets the same default at import.
    """
    if mode is not None:
        choice("xgather.set_default_mode", "mode", mode, MODES)
    _default.set(mode)


@contextlib.contextmanager
def default_mode(mode: Mode | None):
    """Context manager form of :func:`set_default_mode` (restored on exit).

    The mode is read when an op is traced: a function already jitted keeps
    the mode it was traced with.
    """
    if mode is not None:
        choice("xgather.default_mode", "mode", mode, MODES)
    token = _default.set(mode)
    try:
        yield
    finally:
        _default.reset(token)


def current_default() -> str | None:
    """The process-wide default set by :func:`set_default_mode` (None: the spec's rule)."""
    return _default.get()


def resolve(op: str, mode: str | None, spec_default: str = "error") -> str:
    """The mode an op runs in: the caller's, else the process default, else the spec's."""
    if mode is None:
        mode = (_default.get() or spec_default) if spec_default == "error" else spec_default
    choice(op, "mode", mode, MODES)
    return mode


def lax_mode(mode: str) -> lax.GatherScatterMode:
    return _LAX_MODE[mode]


def checks_functionalised() -> bool:
    """True while ``checkify.checkify`` (so also :func:`xgather.checked`) is tracing."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "jax._src.checkify":
            return True
        frame = frame.f_back
    return False


def widen(indices):
    """Narrow integer indices become int32 so that ``index + s`` cannot overflow."""
    if jnp.dtype(indices.dtype).itemsize < 4:
        return indices.astype(jnp.int32)
    return indices


def bounds_array(plan, indices, xp=jnp):
    """``s`` for each index: a scalar, or ``indices``' shape for index tuples (NumPy or JAX)."""
    if plan.index_vector:
        s = xp.asarray(np.asarray(plan.bounds), dtype=indices.dtype)
        return xp.broadcast_to(s, indices.shape)
    return xp.asarray(plan.bounds[0], dtype=indices.dtype)


def wrap(plan, indices):
    """Negative indices count from the end where the spec says so: ``i + s`` for ``i < 0``.

    A compare, an add and a select: plain ops that every backend and every
    exporter knows (no bit casts; ONNX has ``BitCast`` only from opset 26).
    An index below ``-s`` stays negative, so out of range for every mode.
    """
    if not plan.negative or not jnp.issubdtype(indices.dtype, jnp.signedinteger):
        return indices
    return jnp.where(indices < 0, indices + bounds_array(plan, indices), indices)


def wrap_apart(plan, indices):
    """:func:`wrap` in a computation of its own, skipped when no index is negative.

    XLA fuses cheap element-wise producers (the wrap's compare, add and
    select) into a gather, which then recomputes them for every element of
    every slice; neither an optimization barrier (XLA:CPU removes barriers
    before fusion) nor an expensive op in between stops that. A branch of a
    conditional does: the wrap runs once per index, in its own loop, and
    only when some index is negative (one reduction over the indices, which
    are few next to the elements they copy).
    """
    if not plan.negative or not jnp.issubdtype(indices.dtype, jnp.signedinteger):
        return indices
    return lax.cond(_any(indices < 0), lambda i: wrap(plan, i), lambda i: i, indices)


def narrow(plan, indices):
    """64-bit indices saturated into the int32 range on XLA:CPU, where every axis fits it.

    XLA:CPU's gather keeps only the low 32 bits of a 64-bit index into a small
    operand (jax 0.10.2: index ``2**32 + 5`` reads row 5 under ``"fill"``).
    Saturating first keeps every out-of-range index out of range, on the same
    side, and in-range indices unchanged. The dtype stays 64-bit, and other
    backends (chosen when the program is lowered) skip the clamp. Runs after
    :func:`wrap`.
    """
    if jnp.dtype(indices.dtype).itemsize != 8 or max(plan.bounds, default=0) >= 2**31:
        return indices
    info = np.iinfo(np.int32)
    low = jnp.asarray(0 if jnp.issubdtype(indices.dtype, jnp.unsignedinteger) else info.min,
                      indices.dtype)
    clamp = functools.partial(lax.clamp, low, max=jnp.asarray(info.max, indices.dtype))
    return lax.platform_dependent(indices, cpu=clamp, default=lambda i: i)


def valid(plan, indices, xp):
    """True where an index lies in the spec's range (before any wrap)."""
    s = bounds_array(plan, indices, xp)
    valid = indices < s
    if np.issubdtype(indices.dtype, np.signedinteger):
        valid = valid & (indices >= (-s if plan.negative else 0))
    return valid


def _report_format(plan, ndim: int) -> str:
    """The message, with ``{0[k]}`` for the k-th value of the packed report."""
    slots = iter(range(ndim + 6))

    def slot():
        return f"{{0[{next(slots)}]}}"

    value = slot()
    where = ("indices[" + ", ".join(slot() for _ in range(ndim)) + "]") if ndim \
        else "indices (a scalar)"
    lo = f"-{slot()}" if plan.negative else "0"
    return (f"{plan.op}: index {value} at {where} is out of range [{lo}, {slot()}] "
            f"for data axis {slot()} of size {slot()} ({slot()} out-of-range value(s) in indices)")


def _report_args(plan, indices, xp):
    """The values :func:`_report_format` shows, packed in one array (one program output)."""
    bad = xp.logical_not(valid(plan, indices, xp)).ravel()
    first = xp.argmax(bad)
    pos = xp.unravel_index(first, indices.shape)
    axes = np.broadcast_to(np.asarray(plan.index_axes), indices.shape if plan.index_vector
                           else (1,)).ravel()
    size = xp.broadcast_to(bounds_array(plan, indices, xp), indices.shape).ravel()[first]
    axis = xp.asarray(axes)[first % axes.size]
    value = indices.ravel()[first] if indices.ndim else indices
    args = [value, *pos] + ([size] if plan.negative else []) + [size - 1, axis, size, bad.sum()]
    return xp.stack([xp.asarray(a).astype(indices.dtype) for a in args])


# Above this many indices the flag is reduced in blocks and the report is computed
# only when some index is bad; below it both are cheaper than the branch.
_EAGER_REPORT = 1 << 15
_BLOCK_ROWS, _BLOCK_LANES = 16, 64


def _any(bad):
    """``bad.any()``, in the form XLA:CPU compiles and runs fastest; ``jnp.any`` elsewhere.

    XLA:CPU rewrites a boolean reduction into a tree of reduce-window loops:
    scalar code, and about a hundred milliseconds of compile time each. A
    float32 max goes to a library kernel instead (XNNPACK's successor in
    jaxlib 0.10), which compiles at once: that serves index arrays up to
    ``_EAGER_REPORT``. Above it the flag is reduced in (rows, lanes) blocks
    over rows first, a vector loop over lanes (3x faster than the tree on 1M
    indices), with barriers that keep XLA from folding the stages back into one
    reduction. Which form runs is chosen when the program is lowered.
    """
    flat = bad.ravel()
    block = _BLOCK_ROWS * _BLOCK_LANES
    n, m = flat.size, flat.size // block * block
    if n == 0:
        return jnp.zeros((), bool)
    if n <= _EAGER_REPORT or m == 0:
        return lax.platform_dependent(
            flat, cpu=lambda f: jnp.max(f.astype(jnp.float32)) > 0, default=jnp.any)

    def blocked(flat):
        lanes = jax.lax.optimization_barrier(
            flat[:m].reshape(-1, _BLOCK_ROWS, _BLOCK_LANES).any(axis=1))
        lanes = jax.lax.optimization_barrier(lanes.any(axis=0))
        return lanes.any() | jnp.any(flat[m:]) if m < n else lanes.any()

    return lax.platform_dependent(flat, cpu=blocked, default=jnp.any)


def any_bad(plan, indices):
    """One flag: some index lies outside the spec's range (before any wrap)."""
    return _any(jnp.logical_not(valid(plan, indices, jnp)))


def check(plan, indices) -> None:
    """Emit the checkify check: op, the first bad index as given, its position, the range.

    For large index arrays only the flag is computed on the fast path, and the
    report (first bad index, its position, the count) under ``lax.cond`` when
    some index is bad; small ones compute the report on every call, which costs
    less than the branch. (:func:`xgather.checked` runs a program without the
    report while no index is bad.)
    """
    if indices.size == 0:
        return
    bad = any_bad(plan, indices)
    if indices.size <= _EAGER_REPORT:
        report = _report_args(plan, indices, jnp)
    else:
        shape = jax.eval_shape(lambda i: _report_args(plan, i, jnp), indices)
        report = jax.lax.cond(bad, lambda i: _report_args(plan, i, jnp),
                              lambda i: jnp.zeros(shape.shape, shape.dtype), indices)
    checkify.check(jnp.logical_not(bad), _report_format(plan, indices.ndim), report)


def host_check(plan, indices) -> None:
    """The same check on concrete indices, raising :class:`OutOfBoundsError` at once."""
    indices = widen(np.asarray(indices))  # room for sizes and counts
    if indices.size == 0 or valid(plan, indices, np).all():
        return
    raise OutOfBoundsError(_report_format(plan, indices.ndim).format(
        _report_args(plan, indices, np)))


def not_functionalised(op: str) -> None:
    fail(op, 'mode="error" checks indices at run time, which needs the traced function '
         'to be wrapped: use xgather.checked(f) (or jax.experimental.checkify.checkify), '
         'or choose mode="clip", "fill" or "promise_in_bounds"')
