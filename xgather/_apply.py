"""Plan + arrays -> result: indices prepared for the mode, the gather traced and jitted;
the ``"error"`` mode's check itself is ``xgather._check``."""

from __future__ import annotations

import functools
from typing import NoReturn

import jax
import numpy as np
from jax import lax

from xgather import _check, _dtypes, _grad, _modes, _patches
from xgather._errors import XGatherTypeError, fail
from xgather._gather import NO_HINTS, Hints
from xgather._plan import Plan


def prepare(plan: Plan, mode: str, indices, flag: bool = False, use=None):
    """``use`` (the gather; identity if None) of the indices made ready, and the flag.

    Returns ``(bad, use(indices))``: negative indices wrapped where the spec says
    so, 64-bit indices narrowed on XLA:CPU; ``bad`` (None without ``flag``) is true
    where some index lies outside the spec's range. ``"error"`` emits the traced
    check (``xgather._check.emit``), whose flag ``bad`` then is.
    """
    indices = _modes.widen(plan, indices)
    use = use or (lambda i: i)
    bad, out = flag_and_wrap(plan, indices, flag and mode != "error",
                             lambda i: use(_modes.narrow(plan, i)), fused=mode == "error")
    if mode == "error":
        bad = _check.emit(plan, indices)
    return bad, out


def flag_and_wrap(plan: Plan, indices, flag: bool, use, fused: bool = False):
    """``use`` (the gather) of the indices wrapped, and with ``flag`` whether one is bad.

    Returns ``(bad, use(wrapped))``; ``bad`` (None without ``flag``) is true where
    an index lies outside the spec's range. Every program is exact for every legal
    index: the wrap is never skipped on a guess. Indices that cannot be negative
    (unsigned, or ``negative_indices=False``) need no wrap, known at trace time.

    With ``flag`` or ``fused`` (the programs that check), or where ``plan.wrap_pass``
    is ``"fused"`` (small gathers, wide slices), the wrap is a compare and a select
    inside the gather: it runs as fast there as in a branch of its own and compiles
    30-40% faster (docs/lowering.md). Otherwise (``"separate"``, ``"gather"``) one
    reduction over the indices asks whether any is negative, and only then does a
    branch of a conditional wrap them: indices in ``[0, s-1]``, the common case, go to
    the gather untouched, and XLA cannot fuse the wrap into the gather, where it would
    be recomputed for every element copied. With ``"gather"`` (element gathers, as many
    indices as elements copied) ``use`` runs inside each branch, so that the indices
    are not copied out of the conditional; with ``"separate"`` (row gathers) after it.
    """
    bad = _check.any_bad(plan, indices) if flag else None
    if not _modes.wraps(plan, indices):
        return bad, use(indices)
    if flag or fused or plan.wrap_pass == "fused":
        return bad, use(_modes.wrap(plan, indices))
    inner = use if plan.wrap_pass == "gather" else (lambda i: i)
    outer = (lambda i: i) if plan.wrap_pass == "gather" else use
    return None, outer(lax.cond(_check.reduce_any(indices < 0, platform=plan.platform),
                                lambda i: inner(_modes.wrap(plan, i)), inner, indices))


def gather_core(plan: Plan, mode: str, fill_value, data, indices, hints: Hints = NO_HINTS,
                grad=None, flag: bool = False):
    """The traced body of every op: prepare the indices, then gather.

    ``grad`` is ``None`` (the derivative of ``lax.gather``, summed in float32 for
    16-bit floats) or a ``(training, coeff)`` pair that reshapes it (see
    ``xgather._grad``).
    With ``flag``, returns ``(bad, out)`` (see ``prepare``).
    """
    def gather(idx):
        return _grad.gather(plan, mode, fill_value, hints, grad, data, idx)

    bad, out = prepare(plan, mode, indices, flag, gather)
    return (bad, out) if flag else out


# -- the cached jitted functions, and traces made under another library's patches --------------

def _jit_cache(make):
    """``make`` (which builds a jitted function) cached per arguments, except under
    another library's patches (an exporter's): there a fresh one, kept nowhere, whose
    trace would otherwise be reused by later calls outside the export. Keeps the
    cache's ``cache_clear`` and ``cache_info``."""
    cached = functools.lru_cache(maxsize=2048)(make)

    @functools.wraps(make)
    def get(*args):
        return (make if _patches.foreign() else cached)(*args)
    get.cache_clear, get.cache_info = cached.cache_clear, cached.cache_info
    return get


@_jit_cache
def compiled(plan: Plan, mode: str, fill_value, hints: Hints, grad=None):
    """One jitted function per (plan, mode, fill, hints, grad): same shapes never retrace."""
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, mode, fill_value, data, indices, hints, grad)
    return jax.jit(body)


@_jit_cache
def flagged(plan: Plan, fill_value, hints: Hints, grad=None):
    """``"error"`` on concrete device indices: one jitted function returning ``(bad, out)``.

    ``bad`` is true if some index lies outside the spec's range; ``out`` is the
    gather (XLA keeps stray reads in bounds). The caller reads ``bad`` and
    reports the first bad index from the indices themselves, so the program
    carries no report.
    """
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, "promise_in_bounds", fill_value, data, indices, hints, grad,
                               flag=True)
    return jax.jit(body)


def run(plan: Plan, data, indices, mode: str, fill_value=None, *,
        indices_are_sorted: bool = False, unique_indices: bool = False, grad=None,
        out_sharding=None):
    """Run ``plan`` on ``data`` and ``indices`` in ``mode``; ``fill_value`` a Python scalar
    (as ``xgather._dtypes.fill_scalar`` gives it: it keys the jit cache) or None.

    With ``"error"``, concrete indices are checked at once (see
    ``concrete_runner``); traced indices get a checkify check, and tracing
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
    return compiled(plan, mode, fill_value, hints, grad)(data, indices)


def _no_host_path(plan: Plan, data, where: str) -> NoReturn:
    fail(plan.op, "string data, and 64-bit data while jax_enable_x64 is off, take the host "
         f"path, which cannot run {where}", str(data.dtype),
         {"data": plan.data_shape, "indices": plan.indices_shape}, kind=XGatherTypeError)


def concrete_runner(plan: Plan, mode: str, fill_value, hints, grad, indices):
    """``(data, indices) -> result`` for concrete arrays of these shapes and kinds.

    Everything that depends only on the signature is settled here, once, so
    that a call does no more than its own work; the frontends cache the result
    per signature. Under ``"error"``, NumPy indices are checked on the host
    while the program runs, and device indices inside the program, which
    returns a flag beside the result (``flagged``; a host read of device
    indices would wait for the program that makes them). Either way a bad index
    is reported from the indices themselves (``xgather._check.host_check``).
    """
    if mode != "error":
        return compiled(plan, mode, fill_value, hints, grad)
    if isinstance(indices, np.ndarray):
        gather = compiled(plan, "promise_in_bounds", fill_value, hints, grad)
        check = _check.host_checker(plan)

        def host_checked(data, indices):
            # Dispatched first, so that the check runs while the program does (a bad
            # index still raises before the result is returned: XLA keeps stray reads
            # in bounds meanwhile).
            out = gather(data, indices)
            check(indices)
            return out
        return host_checked
    gather = flagged(plan, fill_value, hints, grad)

    def device_checked(data, indices):
        bad, out = gather(data, indices)
        if _check.flag_set(bad):  # waits for the program: an eager call raises at the call
            _check.host_check(plan, indices)
            raise AssertionError(f"{plan.op}: the device flagged an index the host check "
                                 "passed")
        return out
    return device_checked


def check_now_or_later(plan: Plan, mode: str, indices) -> str:
    """The mode to trace with, once ``"error"`` has been dealt with.

    Concrete indices (eager calls, constants under jit or grad) are checked on
    the host now, and the gather then runs as ``"promise_in_bounds"`` (the same
    gather, checked already). Traced indices keep ``"error"`` (a checkify check),
    and tracing stops with a clear error where nothing will keep it
    (``xgather._check.traced``).
    """
    if mode == "error":
        if not _dtypes.is_traced(indices):
            _check.host_check(plan, indices)
            return "promise_in_bounds"
        _check.traced(plan.op)
    return mode
