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
import math
import os
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from xgather import _jaxprivate
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


# set_default_mode sets the process's default (every thread sees it); default_mode
# overrides it in the current context (thread, task) for a block.
_process_default: str | None = _env_default()
_UNSET = object()
_default: contextvars.ContextVar = contextvars.ContextVar(
    "xgather_default_mode", default=_UNSET)  # noqa: B039 (a sentinel, never mutated)


def set_default_mode(mode: Mode | None) -> None:
    """Set the process-wide mode used where a spec calls out-of-range an error.

    ``None`` restores the spec's rule (``"error"``). The environment variable
    ``XGATHER_MODE`` sets the same default at import.
    """
    global _process_default
    if mode is not None:
        choice("xgather.set_default_mode", "mode", mode, MODES)
    _process_default = mode


@contextlib.contextmanager
def default_mode(mode: Mode | None):
    """Context manager form of :func:`set_default_mode` (restored on exit), for the
    current thread (or asyncio task) only; it overrides the process's default there.

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
    """The default in force here: :func:`default_mode`'s, else the process's (None: the
    spec's rule)."""
    mode = _default.get()
    return _process_default if mode is _UNSET else mode


def resolve(op: str, mode: str | None, spec_default: str = "error") -> str:
    """The mode an op runs in: the caller's, else the process default, else the spec's."""
    if mode is None:
        mode = (current_default() or spec_default) if spec_default == "error" else spec_default
    choice(op, "mode", mode, MODES)
    return mode


def lax_mode(mode: str) -> lax.GatherScatterMode:
    return _LAX_MODE[mode]


CHECK_STYLES = ("report", "flag", "speculate", "full")


class TraceState:
    """A JAX config state of ``values`` (``jax.config.update(name, ...)`` and the
    upper-case environment variable set it for the process), read and set here.

    It is part of every trace's context (the caches of tracing, lowering and nested
    jits) and of the jit dispatch key: without the latter, a jitted function called
    again from Python under another value would run the program traced under the
    first (JAX's C++ dispatch cache looks at jit-key states only). Where this JAX cannot
    make such a state, it is always ``default``, and asking for another value warns once
    (:func:`xgather._jaxprivate.fallback`).
    """

    def __init__(self, name: str, values: tuple[str, ...], default: str, help: str):
        self.name, self.values, self.default = name, values, default
        self._state: Any = _jaxprivate.enum_state(name, values, default, help)

    @property
    def value(self) -> str:
        """The value asked for here."""
        return self.default if self._state is None else self._state.value

    def traced_as(self, value: str, where: str | None = None):
        """A context manager that sets the state to ``value`` for a block (nothing where
        JAX has no such state). ``where``: the public function asking, which checks
        ``value`` against :attr:`values` first."""
        if where is not None:
            choice(where, "kind", value, self.values)
        if self._state is None:
            if value != self.default:
                _jaxprivate.fallback("enum_state", f"{self.name} stays {self.default!r}")
            return contextlib.nullcontext()
        return self._state(value)


#: How bound checks are traced (:class:`TraceState`):
#:
#: * ``"report"`` (the default): the check carries its report (first bad index,
#:   position, count) and the result is exact. ``"full"`` is the same, for
#:   :func:`xgather.checked`'s report program: its traces (which hold the
#:   functionalised checks) are then never reused by a plain call of a jitted
#:   function inside ``fn``, which keeps its own error that names the remedies.
#: * ``"flag"``: a flag alone decides; :func:`xgather.checked` reruns with the
#:   report when it is set. Saves the report's tracing and compilation.
#: * ``"speculate"``: where the wrap would take a branch, the flag is whether
#:   any index lies outside ``[0, s-1]`` (in-range negative indices set it
#:   too), and the result is that of the indices as given, valid only while
#:   the flag is clear: no negative wrap, no branch. :func:`xgather.checked`
#:   traces its fast program so and reruns an exact program whenever the flag
#:   is set.
#:
#: Being part of the trace context, the state keeps a function jitted inside
#: ``fn`` from reusing a trace made with another style. Where this JAX has no such
#: API, the style is always ``"report"`` (exact, slower to trace).
_STYLE = TraceState("xgather_check_style", CHECK_STYLES, "report",
                    "How xgather traces its bound checks (report, flag or speculate).")


def check_style(style: str):
    """Trace bound checks in ``style`` (see :data:`_STYLE`): :func:`xgather.checked`."""
    return _STYLE.traced_as(style)


def current_style() -> str:
    return _STYLE.value


def under_derivative(reverse: bool = False) -> bool:
    """True while a derivative traces the caller, at any depth (also inside a loop body
    that one differentiates); with ``reverse``, only ``grad``/``vjp``/``linearize``.

    JAX (0.10.2) drops checkify checks from a ``lax.scan`` or ``while_loop`` body
    that reverse mode differentiates, and a speculative program's flag with them;
    under a derivative :func:`xgather.checked` therefore traces exact programs
    (see the README). Where JAX's trace stack cannot be read, the answer is True.
    """
    running = _jaxprivate.trace_kinds()
    if running is None:
        _jaxprivate.fallback("trace_ctx", "xgather.checked traces exact programs only")
        return True
    kinds = _jaxprivate.LINEARIZE_TRACES
    if not reverse:
        kinds = kinds | _jaxprivate.FORWARD_TRACES
    return any(kind in kinds for kind in running)


def _traced_by(name: str, module: str, otherwise: bool, consequence: str) -> bool:
    """Whether code of ``module`` is tracing the caller's caller; ``otherwise`` (with a
    warning, once) where this JAX has no such module."""
    found = _jaxprivate.on_stack(name, module, depth=3)
    if found is None:
        _jaxprivate.fallback(name, consequence)
        return otherwise
    return found


def in_loop_body() -> bool:
    """True while ``lax.scan``, ``lax.map``, ``fori_loop`` or ``while_loop`` traces its body."""
    return _traced_by("loops", _jaxprivate.LOOPS_MODULE, False,
                      "a check traced in a differentiated loop body does not warn that JAX "
                      "drops it")


def checks_functionalised() -> bool:
    """True while ``checkify.checkify`` (so also :func:`xgather.checked`) is tracing."""
    return _traced_by("checkify", _jaxprivate.CHECKIFY_MODULE, True,
                      "a check under a plain jax.jit fails in checkify's own words, not "
                      "xgather's")


def widen(plan, indices):
    """Narrow integer indices become int32 so that ``index + s`` cannot overflow; where
    ``plan`` has an axis that the indices' type cannot count to (int32 indices into an
    axis of 2**31 elements or more, with x64 on), 64-bit ones (NumPy or JAX arrays)."""
    if np.dtype(indices.dtype).itemsize < 4:
        indices = indices.astype(np.int32)
    if max(plan.bounds, default=0) > np.iinfo(indices.dtype).max:
        wide = np.uint64 if np.dtype(indices.dtype).kind == "u" else np.int64
        indices = indices.astype(wide)  # the axis exists only with x64 on
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
    if not wraps(plan, indices):
        return indices
    return jnp.where(indices < 0, indices + bounds_array(plan, indices), indices)


def wraps(plan, indices) -> bool:
    """Whether negative indices count from the end here (the spec's rule, signed indices)."""
    return plan.negative and jnp.issubdtype(indices.dtype, jnp.signedinteger)


def outside(plan, indices):
    """True where a (signed) index lies outside ``[0, s-1]``: negative, or past the end."""
    return (indices < 0) | (indices >= bounds_array(plan, indices))


def flag_and_wrap(plan, indices, flag: bool, use, speculate: bool = False):
    """``use`` (the gather) of the indices wrapped, and with ``flag`` whether one is bad.

    Returns ``(bad, use(wrapped))``; ``bad`` (None without ``flag``) is true where
    an index lies outside the spec's range.

    With ``flag`` and ``speculate``, where the wrap would take a branch (not
    ``"fused"``), ``bad`` is instead true where an index lies outside
    ``[0, s-1]``, and the result is ``use`` of the indices as given, valid only
    where ``bad`` is clear: the caller runs an exact program when it is set.
    One reduction beside the gather; no branch and no wrap to trace, compile or
    run. (A fused wrap costs no more than that, so those plans stay exact, and
    their in-range negative indices never need a second program.) Otherwise,
    by ``plan.wrap_pass``:

    * ``"fused"`` (small gathers): the wrap is a compare and a select inside the
      gather, where a branch would cost more.
    * ``"separate"`` and ``"gather"``: one reduction over the indices asks whether
      any lies outside ``[0, s-1]``; only then does a branch of a conditional
      compute the flag and the wrap. Indices in ``[0, s-1]``, the common case, so
      cost one read. The branch also keeps the wrap out of the gather: XLA fuses
      such cheap producers into it, where they are recomputed for every element
      copied (neither an optimization barrier, which XLA:CPU removes before
      fusion, nor an expensive op in between stops that; a conditional does).
      With ``"gather"`` (element gathers, as many indices as elements copied)
      ``use`` runs inside each branch, so that the indices are not copied out of
      the conditional; with ``"separate"`` (row gathers) after it.
    """
    if not wraps(plan, indices):
        return (any_bad(plan, indices) if flag else None), use(indices)
    if flag and speculate and plan.speculates:
        return _any(outside(plan, indices), pad=not plan.small, backend=plan.backend), \
            use(indices)
    if plan.wrap_pass == "fused":
        return (any_bad(plan, indices) if flag else None), use(wrap(plan, indices))
    inner = use if plan.wrap_pass == "gather" else (lambda i: i)
    outer = (lambda i: i) if plan.wrap_pass == "gather" else use
    if not flag:
        return None, outer(lax.cond(_any(indices < 0, backend=plan.backend),
                                    lambda i: inner(wrap(plan, i)), inner, indices))

    def some_outside(i):  # taken only where an index is negative or bad: compiled lean
        return any_bad(plan, i, blocked=False), inner(wrap(plan, i))

    def all_inside(i):
        return jnp.zeros((), bool), inner(i)

    bad, out = lax.cond(_any(outside(plan, indices), backend=plan.backend), some_outside,
                        all_inside, indices)
    return bad, outer(out)


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


#: How every report of a bad index ends (what tells it from a user's own checks).
REPORT_END = "out-of-range value(s) in indices)"


def _report_format(plan, ndim: int) -> str:
    """The message, with ``{0[k]}`` for the k-th value of the packed report."""
    slots = iter(range(ndim + 6))

    def slot():
        return f"{{0[{next(slots)}]}}"

    value = slot()
    where = ("indices[" + ", ".join(slot() for _ in range(ndim)) + "]") if ndim \
        else "indices (a scalar)"
    lo = f"-{slot()}" if plan.negative else "0"
    hi, axis, size, count = slot(), slot(), slot(), slot()
    if not plan.index_vector and plan.bounds[0] == 0:  # not "[-0, -1]"
        return (f"{plan.op}: index {value} at {where} is out of range: data axis {axis} has "
                f"size 0, so no index is in range ({count} out-of-range value(s) in indices)")
    if 0 in plan.bounds:  # index tuples: the reported component's range may be empty
        empty = ", ".join(str(a) for a, s in zip(plan.index_axes, plan.bounds, strict=True)
                          if s == 0)
        return (f"{plan.op}: index {value} at {where} is out of range for data axis {axis} of "
                f"size {size}: data axis {empty} has size 0, so no index tuple is in range "
                f"({count} out-of-range value(s) in indices)")
    return (f"{plan.op}: index {value} at {where} is out of range [{lo}, {hi}] "
            f"for data axis {axis} of size {size} ({count} out-of-range value(s) in indices)")


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


# Up to this many indices the check's report is computed on every call (cheaper than
# a branch); above it, only when some index is bad.
_EAGER_REPORT = 1 << 15
# XLA:CPU runs a float32 max over _LIBRARY_MIN or more values as a library kernel; over
# fewer it compiles loops (one unrolled loop up to _UNROLLED_MAX values). Beside large
# gathers, flags of _UNROLLED_MAX+1 to _LIBRARY_MIN-1 values are padded up to _LIBRARY_MIN,
# which compiles faster and costs a little per call, hidden by such a gather. Beside small
# gathers (Plan.small) the padding would be a large part of the call (and the CPU client
# runs only programs of under 1000 flops inline), so their flags are not padded: a boolean
# jnp.any compiles faster than the float loops there and runs as fast. Over several
# thousand values jnp.any compiles slowly, hence the float max everywhere else. Above
# _EAGER_REPORT a first stage reduces (rows, lanes) blocks. The measurements behind these
# choices: docs/checks.md.
_LIBRARY_MIN, _UNROLLED_MAX = 1 << 12, 32
_BLOCK_ROWS, _BLOCK_LANES = 32, 128


def _any(bad, blocked: bool = True, pad: bool = True, *, backend: str):
    """``bad.any()``, in the form XLA:CPU compiles and runs fastest; ``jnp.any`` elsewhere.

    On XLA:CPU the flag is a float32 max, which goes to a library kernel (a
    boolean reduction of many values becomes a tree of scalar reduce-window loops,
    slow to compile and to run). With ``pad``, fewer than ``_LIBRARY_MIN`` values
    (but more than ``_UNROLLED_MAX``) are padded with ``False`` up to that size so
    that the library kernel takes them too; without it, they are reduced by
    ``jnp.any`` (see the note above for both). Above
    ``_EAGER_REPORT``, a first stage reduces (rows, lanes) blocks over their
    rows, a vector loop fused with the compare that makes ``bad``, so that the
    max reads one value per block and lane plus the ragged tail. ``blocked=False``
    skips the first stage: one kernel fewer to compile, for flags that are rarely
    computed.

    ``backend``: the plan's (``Plan.backend``), whose form alone is traced. Both
    forms compute the same flag, so a program lowered for another backend stays
    exact, in the form chosen for this one; one form is traced, not both under
    ``lax.platform_dependent``, which would cost every checked trace time.
    """
    flat = bad.ravel()
    n = flat.size
    if n == 0:
        return jnp.zeros((), bool)
    m, _, size = _cpu_flag_steps(n, blocked, pad)

    def cpu(flat):
        if m:
            lanes = flat[:m].reshape(-1, _BLOCK_ROWS, _BLOCK_LANES).any(axis=1).ravel()
            flat = jnp.concatenate([lanes, flat[m:]]) if m < n else lanes
        if size > flat.size:
            flat = jnp.pad(flat, (0, size - flat.size))
        if _UNROLLED_MAX < size < _LIBRARY_MIN:  # not padded: beside a small gather
            return jnp.any(flat)
        return jnp.max(flat.astype(jnp.float32)) > 0

    return cpu(flat) if backend == "cpu" else jnp.any(flat)


def _cpu_flag_steps(n: int, blocked: bool = True,
                    pad: bool = True) -> tuple[int, int, int]:
    """``(m, read, size)``: how :func:`_any` reduces ``n`` values on XLA:CPU. The first
    ``m`` are reduced in (rows, lanes) blocks first (0: none), leaving ``read`` values
    (the block results and the rest), which the float32 max reads padded to ``size``."""
    block = _BLOCK_ROWS * _BLOCK_LANES
    m = n // block * block if blocked and n > _EAGER_REPORT else 0
    read = size = m // _BLOCK_ROWS + n - m
    if pad and _UNROLLED_MAX < read < _LIBRARY_MIN:
        size = _LIBRARY_MIN
    return m, read, size


def flag_text(plan) -> str:
    """What ``explain`` says of the flag that the ``"error"`` mode's check reduces."""
    n = math.prod(plan.indices_shape)
    what = 'bound check (mode="error"): '
    if plan.backend != "cpu":
        return what + f"jnp.any over the {n} index values"
    m, read, size = _cpu_flag_steps(n, pad=not plan.small)
    blocks = (f"{m} of them in ({_BLOCK_ROWS}, {_BLOCK_LANES}) blocks first, then " if m
              else "")
    if _UNROLLED_MAX < size < _LIBRARY_MIN:  # not padded: beside a small gather
        return what + f"jnp.any over the {n} index values" + (f" ({blocks}over {read})"
                                                                  if m else "")
    kind = "one unrolled max" if size <= _UNROLLED_MAX else "the library max"
    padded = f" padded to {size}" if size > read else ""
    return what + f"a float32 max over the {n} index values ({blocks}{kind} over {read}{padded})"


def any_bad(plan, indices, blocked: bool = True):
    """One flag: some index lies outside the spec's range (before any wrap)."""
    return _any(jnp.logical_not(valid(plan, indices, jnp)), blocked, pad=not plan.small,
                backend=plan.backend)


def replicated(x):
    """``x``, replicated where it is sharded over a mesh's Explicit axes: there JAX asks
    every indexed read for its result's sharding, and the report reads single values."""
    try:
        sharding = jax.typeof(x).sharding
        explicit = sharding.mesh.explicit_axes
    except AttributeError:  # pragma: no cover - other JAX versions
        return x
    if explicit and any(entry is not None for entry in sharding.spec):
        return jax.sharding.reshard(x, jax.sharding.NamedSharding(sharding.mesh,
                                                                  jax.sharding.PartitionSpec()))
    return x


def check(plan, indices, bad=None) -> None:
    """Emit the checkify check: op, the first bad index as given, its position, the range.

    ``bad`` is the flag (:func:`any_bad`, or :func:`flag_and_wrap`'s), computed
    here when not given. Unless the check style is ``"report"`` (see
    :func:`check_style`), the check carries no report.
    For large index arrays the report (first bad index, its position, the count)
    is computed under ``lax.cond`` only when some index is bad; small ones compute
    it on every call, which costs less than the branch.
    """
    if indices.size == 0:
        return
    if bad is None:
        bad = any_bad(plan, indices)
    if current_style() not in ("report", "full"):
        checkify.check(jnp.logical_not(bad), f"{plan.op}: an index may be out of range")
        return
    indices = replicated(indices)
    if indices.size <= _EAGER_REPORT:
        report = _report_args(plan, indices, jnp)
    else:
        shape = jax.eval_shape(lambda i: _report_args(plan, i, jnp), indices)
        report = jax.lax.cond(bad, lambda i: _report_args(plan, i, jnp),
                              lambda i: jnp.zeros(shape.shape, shape.dtype), indices)
    checkify.check(jnp.logical_not(bad), _report_format(plan, indices.ndim), report)


_HOST_LIST_MAX = 64  # up to this many indices, Python's min and max beat NumPy's reductions


def _host_range(plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The spec's range of each index component: lowest and highest valid values."""
    lows = tuple(-s if plan.negative else 0 for s in plan.bounds)
    return lows, tuple(s - 1 for s in plan.bounds)


def _in_range(indices: np.ndarray, vector: bool, lows, highs) -> bool:
    """All indices within ``[lows, highs]`` (per component where ``vector``), from their
    minimum and maximum."""
    if vector:
        flat = indices.reshape(-1, indices.shape[-1])
        mins, maxs = flat.min(axis=0).tolist(), flat.max(axis=0).tolist()
    elif indices.size <= _HOST_LIST_MAX:
        values = indices.ravel().tolist()
        return lows[0] <= min(values) and max(values) <= highs[0]
    else:
        mins, maxs = [indices.min().item()], [indices.max().item()]
    # Python ints: exact for every index type (uint64 against int64 bounds included).
    return all(lo <= a and b <= hi for a, b, lo, hi in zip(mins, maxs, lows, highs,
                                                           strict=True))


def host_check(plan, indices) -> None:
    """The same check on concrete indices, raising :class:`OutOfBoundsError` at once.

    The indices' minimum and maximum decide; only a bad index costs the report.
    """
    indices = np.asarray(indices)
    if indices.size == 0 or _in_range(indices, plan.index_vector, *_host_range(plan)):
        return
    indices = widen(plan, indices)  # room for sizes and counts
    raise OutOfBoundsError(_report_format(plan, indices.ndim).format(
        _report_args(plan, indices, np)))


def host_checker(plan):
    """:func:`host_check` for ``plan``'s NumPy indices, its range settled once: the
    per-call check of a cached eager call."""
    vector = plan.index_vector
    lows, highs = _host_range(plan)

    def check(indices: np.ndarray) -> None:
        if indices.size and not _in_range(indices, vector, lows, highs):
            host_check(plan, indices)  # the report
    return check


def not_functionalised(op: str) -> None:
    fail(op, 'mode="error" checks indices at run time, which needs the traced function '
         'to be wrapped: use xgather.checked(f) (or jax.experimental.checkify.checkify), '
         'or choose mode="clip", "fill" or "promise_in_bounds"')
