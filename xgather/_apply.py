"""Plan + arrays -> result: the entry every op's call reaches (``run``), the jitted
programs, and the eager path. The traced work flows one way from here:
``xgather._check`` (the check, where the mode asks for one) -> ``xgather._indices`` (the
indices made ready) -> ``xgather._grad`` (the derivative) -> ``xgather._gather``
(``lax.gather``)."""

from __future__ import annotations

import functools

import jax
import numpy as np

from xgather import _check, _dtypes, _patches, _report
from xgather._errors import fail
from xgather._gather import Call
from xgather._plan import Plan

# -- the cached jitted functions, and traces made under another library's patches --------------

#: Every ``jit_cache``'s cache, for [`clear_caches`][xgather.clear_caches].
CACHES: list = []


def jit_cache(make):
    """``make`` (which builds a jitted function) cached per arguments, except under
    another library's patches (an exporter's): there a fresh one, kept nowhere, whose
    trace would otherwise be reused by later calls outside the export. Keeps the
    cache's ``cache_clear`` and ``cache_info``."""
    cached = functools.lru_cache(maxsize=2048)(make)
    CACHES.append(cached)

    @functools.wraps(make)
    def get(*args):
        return (make if _patches.foreign() else cached)(*args)
    get.cache_clear, get.cache_info = cached.cache_clear, cached.cache_info
    return get


@jit_cache
def program(call: Call, flag: bool):
    """``call``'s jitted function, one per ``(call, flag)`` (same shapes never retrace).

    With ``flag`` (``"error"`` on concrete device indices, the call's mode then
    ``"promise_in_bounds"``) it returns ``(bad, out)``:
    ``bad`` is true if some index lies outside the spec's range, ``out`` the gather
    (XLA keeps stray reads in bounds). The caller reads ``bad`` and reports the first
    bad index from the indices themselves, so the program carries no report.
    """
    def body(data, indices):
        with jax.named_scope(call.plan.op):
            bad, out = _check.gather(call, data, indices, flag=flag)
        return (bad, out) if flag else out
    return jax.jit(body)


def run(call: Call, data, indices):
    """Run ``call`` on ``data`` (a JAX array or tracer: ``xgather._frontend`` takes the host
    path for data JAX cannot hold) and ``indices``; ``call.fill_value`` a Python scalar (as
    ``xgather._dtypes.fill_scalar`` gives it: it keys the jit cache) or None.

    With ``"error"``, concrete indices are checked at once (see
    ``eager_runner``); traced indices get a checkify check, and tracing
    stops with a clear error where nothing will functionalise that check.
    """
    if not _dtypes.is_traced(data, indices):
        return eager_runner(call, data, indices)(data, indices)
    mode = check_now_or_later(call.plan, call.mode, indices)
    where = _check.call_site() if mode == "error" else None  # the op's caller, at trace
    return program(call._replace(mode=mode, where=where), False)(data, indices)


def eager_runner(call: Call, data, indices, *, own_indices: bool = False):
    """``(data, indices) -> result`` for concrete arrays of these shapes and kinds, which
    reads no memory of the caller's after it returns (``held``; ``own_indices``: the
    runner is given indices no caller holds, converted already).

    Everything that depends only on the signature is settled here, once, so
    that a call does no more than its own work; the frontends cache the result
    per signature. Under ``"error"``, NumPy indices are checked on the host
    while the program runs, and device indices inside the program, which
    returns a flag beside the result (``program(call, True)``; a host read of device
    indices would wait for the program that makes them). Either way a bad index
    is reported from the indices themselves (``xgather._check.host_check``).
    """
    plan = call.plan
    checks = call.mode == "error"
    on_host = isinstance(indices, np.ndarray)
    gather = program(call._replace(mode="promise_in_bounds") if checks else call,
                     checks and not on_host)
    if not checks:
        return held(gather, data, indices, own_indices)
    if on_host:
        check = _report.host_checker(plan)

        def host_checked(data, indices):
            # Dispatched first, so that the check runs while the program does (a bad
            # index still raises before the result is returned: XLA keeps stray reads
            # in bounds meanwhile).
            out = gather(data, indices)
            check(indices)
            return out
        return held(host_checked, data, indices, own_indices)

    tracer = jax.core.Tracer

    def device_checked(data, indices):
        bad, out = gather(data, indices)
        if isinstance(bad, tracer):
            # Arrays known now, inside a trace (constants that a function under jax.jit,
            # lax.scan or xgather.checked closes over; jax.disable_jit under checkify): the
            # program went into that trace, and the indices are checked on the host now.
            _check.host_check(plan, indices)
            return out
        if _check.flag_set(bad):  # waits for the program: an eager call raises at the call
            _check.host_check(plan, indices)
            raise AssertionError(f"{plan.op}: the device flagged an index the host check "
                                 "passed")
        return out
    # The flag's read waits for the program, which has then read NumPy data.
    return held(device_checked, data, indices, own_indices, waits=True)


def held(runner, data, indices, own_indices: bool = False, *, waits: bool = False):
    """``runner``, made to read no memory of the caller's after it returns.

    JAX reads a NumPy argument in place where it can (on a CPU, without a copy), and an
    eager call returns before its program has run: a caller who then refills the array
    (a data loader's batch buffer) would change what the program reads, unchecked. So:

    * NumPy indices are copied before the call, and the program reads the copy, which
      no caller holds. The gather reads every index at least once, so the copy costs at
      most what the gather's own read of them does, and the call stays asynchronous.
    * NumPy data of up to ``xgather._dtypes.COPY_MAX`` bytes is copied too. Larger data
      is read in place, and the call waits until its program has run (``waits``: the
      runner waits already): a gather may read a few rows of a large table, where a copy
      of the table would cost more than the gather.

    DLPack tensors on the host reach here as NumPy views of their memory. The choice is
    fixed per signature, since the shapes and kinds of the inputs are.
    """
    copy_indices = isinstance(indices, np.ndarray) and not own_indices
    copy_data = isinstance(data, np.ndarray) and data.nbytes <= _dtypes.COPY_MAX
    wait = isinstance(data, np.ndarray) and not copy_data and not waits
    if not (copy_data or copy_indices or wait):
        return runner

    def owned(data, indices):
        out = runner(np.array(data) if copy_data else data,
                     np.array(indices) if copy_indices else indices)
        if wait and not isinstance(out, jax.core.Tracer):
            out.block_until_ready()
        return out
    return owned


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
    elif mode in ("clip", "fill") and _patches.foreign():
        # An exporter tracing without xgather's plugin (which turns every mode into
        # "promise_in_bounds" on indices it made in range): jax2onnx 0.17 drops lax.gather's
        # clip and fill modes, and its GatherND wraps the indices again.
        fail(plan.op, f'mode="{mode}" is traced under another library\'s patches of JAX, as '
             "an exporter traces, which would lose it: jax2onnx (0.17) drops lax.gather's "
             f"clip and fill modes and exports other values: {_patches.EXPORT_ADVICE}")
    return mode
