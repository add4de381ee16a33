"""Plan + arrays -> result: indices prepared for the mode, the gather traced and jitted,
checks run eagerly or functionalised (:func:`checked`)."""

from __future__ import annotations

import functools
import sys
import types
import warnings
from typing import NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from xgather import _dtypes, _grad, _jaxprivate, _modes
from xgather._errors import OutOfBoundsError, UncheckedWarning, XGatherTypeError, fail
from xgather._gather import NO_HINTS, Hints
from xgather._plan import Plan


def prepare(plan: Plan, mode: str, indices, flag: bool = False, use=None,
            speculate: bool | None = None):
    """``use`` (the gather; identity if None) of the indices made ready, and the flag.

    Returns ``(bad, use(indices))``: negative indices wrapped where the spec says
    so (for larger gathers in a branch of their own, skipped when no index is
    negative: see :func:`xgather._modes.flag_and_wrap`), 64-bit indices narrowed
    on XLA:CPU; ``bad`` (None without ``flag``) is true where some index lies
    outside the spec's range. ``"error"`` emits the checkify check on ``bad``
    (``flag`` is then implied). ``speculate`` (by default: whether checks are
    traced in the ``"speculate"`` style) flags every index outside ``[0, s-1]``
    instead and skips the wrap, for a caller that reruns exactly when the flag
    is set.
    """
    indices = _modes.widen(plan, indices)
    error = mode == "error"
    use = use or (lambda i: i)
    if speculate is None:
        speculate = _modes.current_style() == "speculate"
    bad, out = _modes.flag_and_wrap(plan, indices, flag or error,
                                    lambda i: use(_modes.narrow(plan, i)), speculate)
    if error:
        _modes.check(plan, indices, bad)
    return bad, out


def gather_core(plan: Plan, mode: str, fill_value, data, indices, hints: Hints = NO_HINTS,
                grad=None, flag: bool = False, speculate: bool | None = None):
    """The traced body of every op: prepare the indices, then gather.

    ``grad`` is ``None`` (the derivative of ``lax.gather``, summed in float32 for
    16-bit floats) or a ``(training, coeff)`` pair that reshapes it (see
    :mod:`xgather._grad`).
    With ``flag``, returns ``(bad, out)`` (see :func:`prepare`, also for ``speculate``).
    """
    def gather(idx):
        return _grad.gather(plan, mode, fill_value, hints, grad, data, idx)

    bad, out = prepare(plan, mode, indices, flag, gather, speculate)
    return (bad, out) if flag else out


@functools.lru_cache(maxsize=2048)
def compiled(plan: Plan, mode: str, fill_value, hints: Hints, grad=None):
    """One jitted function per (plan, mode, fill, hints, grad): same shapes never retrace."""
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, mode, fill_value, data, indices, hints, grad)
    return jax.jit(body)


@functools.lru_cache(maxsize=2048)
def flagged(plan: Plan, fill_value, hints: Hints, grad=None, speculate=False):
    """``"error"`` on concrete device indices: one jitted function returning ``(bad, out)``.

    ``bad`` is true if some index lies outside the spec's range (with
    ``speculate``: outside ``[0, s-1]``, and ``out`` is then valid only while
    ``bad`` is clear); ``out`` is the gather (XLA keeps stray reads in bounds).
    The caller reads ``bad`` and reports the first bad index from the
    indices themselves, so the program carries no report.
    """
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, "promise_in_bounds", fill_value, data, indices, hints, grad,
                               flag=True, speculate=speculate)
    return jax.jit(body)


def throw(err) -> None:
    """Raise a checkify error: xgather's bound report as :class:`OutOfBoundsError` with its
    message, any other failed check (a user's own ``checkify.check``) as checkify raises it."""
    msg = err.get()
    if msg:
        msg = msg.split(" (`check` failed)")[0]
        if not msg.endswith(_modes.REPORT_END):
            err.throw()
        raise OutOfBoundsError(msg)


def run(plan: Plan, data, indices, mode: str, fill_value=None, *,
        indices_are_sorted: bool = False, unique_indices: bool = False, grad=None,
        out_sharding=None):
    """Run ``plan`` on ``data`` and ``indices`` in ``mode``; ``fill_value`` a Python scalar
    (as :func:`xgather._dtypes.fill_scalar` gives it: it keys the jit cache) or None.

    With ``"error"``, concrete indices are checked at once (see
    :func:`concrete_runner`); traced indices get a checkify check, and tracing
    stops with a clear error where nothing will functionalise that check.
    """
    hints = Hints(bool(indices_are_sorted), bool(unique_indices), out_sharding)
    if _dtypes.needs_host(data):
        if _dtypes.is_traced(indices):
            _no_host_path(plan, data, "under a JAX transformation")
        try:
            return _dtypes.host_gather(
                plan.op, data,
                lambda iota, fill: run(plan, iota, indices, mode, fill, indices_are_sorted=False,
                                       unique_indices=False),
                fill_value if mode == "fill" else None)
        except jax.errors.TracerArrayConversionError:  # constant indices inside jax.jit
            _no_host_path(plan, data, "inside jax.jit")
    data = _dtypes.check_data(plan.op, data,
                              {"data": plan.data_shape, "indices": plan.indices_shape})
    if not _dtypes.is_traced(data, indices):
        return concrete_runner(plan, mode, fill_value, hints, grad, indices)(data, indices)
    mode = check_now_or_later(plan, mode, indices)
    gather = compiled(plan, mode, fill_value, hints, grad)
    if mode == "error" and _modes.under_derivative():
        if _modes.in_loop_body() and _modes.under_derivative(reverse=True):
            warnings.warn(UncheckedWarning(
                f"{plan.op}: its mode=\"error\" check is traced in a lax.scan/map/fori_loop/"
                "while_loop body under a derivative, where JAX drops checkify checks in reverse "
                "mode: an out-of-range index would go unreported. Check the indices outside the "
                "loop, or choose mode=\"clip\", \"fill\" or \"promise_in_bounds\""),
                stacklevel=_user_stacklevel())
        if _modes.current_style() == "speculate":
            with _modes.check_style("flag"):  # exact: its flag may be dropped (under_derivative)
                return gather(data, indices)
    return gather(data, indices)


def _no_host_path(plan: Plan, data, where: str) -> NoReturn:
    fail(plan.op, "string data, and 64-bit data while jax_enable_x64 is off, take the host "
         f"path, which cannot run {where}", str(data.dtype),
         {"data": plan.data_shape, "indices": plan.indices_shape}, kind=XGatherTypeError)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside xgather and JAX (for warnings)."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
            "xgather", "jax"):
        frame, level = frame.f_back, level + 1
    return level


def concrete_runner(plan: Plan, mode: str, fill_value, hints, grad, indices):
    """``(data, indices) -> result`` for concrete arrays of these shapes and kinds.

    Everything that depends only on the signature is settled here, once, so
    that a call does no more than its own work; the frontends cache the result
    per signature. Under ``"error"``, NumPy indices are checked on the host
    while the program runs, and device indices inside the program, which
    returns a flag beside the result (a host read of device indices would wait
    for the program that makes them). That
    program speculates (:func:`flagged`): where the wrap would take a branch of
    its own, its flag is set by any index outside ``[0, s-1]``. When it is,
    the host check reports a bad index, and in-range negative indices are
    gathered again by the exact program, which this signature then keeps.
    Either way a bad index is reported from the indices themselves
    (:func:`xgather._modes.host_check`).
    """
    if mode != "error":
        return compiled(plan, mode, fill_value, hints, grad)
    if isinstance(indices, np.ndarray):
        gather = compiled(plan, "promise_in_bounds", fill_value, hints, grad)
        check = _modes.host_checker(plan)

        def host_checked(data, indices):
            # Dispatched first, so that the check runs while the program does (a bad
            # index still raises before the result is returned: XLA keeps stray reads
            # in bounds meanwhile).
            out = gather(data, indices)
            check(indices)
            return out
        return host_checked
    exact = flagged(plan, fill_value, hints, grad)
    gather = flagged(plan, fill_value, hints, grad, speculate=True)

    def device_checked(data, indices):
        nonlocal gather
        bad, out = gather(data, indices)
        try:  # flag_set, inlined
            if not memoryview(bad)[()]:
                return out
        except (BufferError, TypeError):
            if not copied_flag_set(bad):
                return out
        _modes.host_check(plan, indices)
        if gather is exact:
            raise AssertionError(f"{plan.op}: the device flagged an index the host check "
                                 "passed")
        gather = exact  # in-range negative indices: wrap them from now on
        return device_checked(data, indices)
    return device_checked


def flag_set(flag) -> bool:
    """The flag a checked program returned, read on the host (it waits for the program).

    A single-device CPU array is read through the buffer protocol, sooner than
    ``np.asarray`` reads it; other arrays (GPU, sharded) are copied over
    (:func:`copied_flag_set`). The per-call paths of :func:`checked` and
    :func:`concrete_runner` inline the first case, which saves a call.
    """
    try:
        return bool(memoryview(flag)[()])
    except (BufferError, TypeError):
        return copied_flag_set(flag)


def copied_flag_set(flag) -> bool:
    """:func:`flag_set` where the flag has no single CPU buffer: a GPU or sharded array
    is copied to the host; a checkify ``Error`` (where :func:`_any_error` found no
    flag field) is set when it holds a message."""
    if isinstance(flag, checkify.Error):
        return flag.get() is not None
    return bool(np.asarray(flag))


def check_now_or_later(plan: Plan, mode: str, indices) -> str:
    """The mode to trace with, once ``"error"`` has been dealt with.

    Concrete indices (eager calls, constants under jit or grad) are checked on
    the host now, and the gather then runs as ``"promise_in_bounds"`` (the same
    gather, checked already). Traced indices keep ``"error"`` (a checkify check),
    and tracing stops with a clear error where nothing will functionalise it.
    """
    if mode == "error":
        if not _dtypes.is_traced(indices):
            _modes.host_check(plan, indices)
            return "promise_in_bounds"
        if not _modes.checks_functionalised():
            _modes.not_functionalised(plan.op)
    return mode


def _any_error(err):
    """True where a checkify ``Error`` holds a failed check (one scalar), or None."""
    preds = _jaxprivate.error_predicates(err)
    if preds is None:  # a checkify without the field: report the whole error instead
        _jaxprivate.fallback("Error._pred", "xgather.checked runs every call with the report")
        return None
    flag = jnp.zeros((), bool)
    for p in preds:
        flag = flag | jnp.any(p)
    return flag


def checked(fn, *, static_argnums=(), static_argnames=()):
    """``fn`` with xgather's bound checks functionalised, compiled once per input shape.

    Returns a jitted function that runs ``fn`` under ``checkify.checkify`` and
    raises :class:`~xgather.OutOfBoundsError` if an index was out of range.
    ``fn`` may be jitted already (``xgather.checked(jax.jit(f))``) or contain
    ``jax.grad``/``jax.vmap``; non-array arguments go in ``static_argnums`` /
    ``static_argnames`` as for ``jax.jit``. Use it as the outermost wrapper: it
    reads the error flag on the host after each call.

    Each call runs a program that returns only the result and one flag. It is
    traced without the report (the first bad index, its position, the count)
    and, where an op's wrap would take a branch of its own, speculates: the
    flag is set by any index outside ``[0, s-1]``, so the program needs no
    negative wrap and no branch, and its result counts only while the flag is
    clear. When the flag is set, the exact program (the wrap,
    the flag of the spec's range, still no report; compiled on first use)
    runs: if its flag is clear (in-range negative indices), its result is
    returned, and it is the fast program from then on. If it is set, ``fn``
    runs again with the full report, which the error shows (see
    :func:`xgather._modes.check_style`).
    """
    if not callable(fn):
        fail("xgather.checked", "fn must be a callable (a function of arrays)",
             type(fn).__name__, kind=XGatherTypeError)
    jit_kw = dict(static_argnums=static_argnums, static_argnames=static_argnames)
    checkified = checkify.checkify(fn, errors=checkify.user_checks)
    full_jit = jax.jit(checkified, **jit_kw)

    def full(*args, **kwargs):
        with _modes.check_style("full"):
            return full_jit(*args, **kwargs)

    def traced(style):
        def flag_and_out(*args, **kwargs):
            with _modes.check_style(style):
                err, out = checkified(*args, **kwargs)
            flag = _any_error(err)
            return (err if flag is None else flag), out
        return jax.jit(flag_and_out, **jit_kw)

    exact = traced("flag")
    fast = traced("speculate")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal fast
        flag, out = fast(*args, **kwargs)
        try:  # flag_set, inlined: every call's path
            if not memoryview(flag)[()]:
                return out
        except (BufferError, TypeError):
            if not copied_flag_set(flag):
                return out
        if fast is not exact:
            flag, out = exact(*args, **kwargs)
            if not flag_set(flag):  # in-range negative indices: the exact program from now on
                fast = exact
                return out
        throw(full(*args, **kwargs)[0])
        raise AssertionError(f"{getattr(fn, '__name__', fn)!r}: a check failed on the device "
                             "and passed in the report")

    return wrapper
