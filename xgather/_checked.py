"""[`checked`][xgather.checked]: the ``"error"`` mode's check under the user's own jit, and
when a failure is raised.

The jit is the user's; xgather puts ``checkify`` inside it and owns what comes out: one
flag a call, queued per thread and read later (``_Calls``: a CPU's flag by itself, an
accelerator's in groups, ``_Group``), the report, and the moment a failure is raised.
No failure is dropped: each is raised in its turn, an interrupt leaves the flag it waited
for queued, a thread's queue outlives the thread, and a forked child reports its own.
"""

from __future__ import annotations

import atexit
import collections
import functools
import math
import os
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from xgather import _check, _dtypes, _frontend, _jaxprivate, _patches, _report
from xgather._errors import OutOfBoundsError, UncheckedWarning, XGatherTypeError, fail

MAX_PENDING = 16
"""The most calls of [`checked`][xgather.checked] functions whose flags a thread leaves
unread: a call that finds this many waits for the oldest before it runs."""

READ_GROUP = 8
"""On an accelerator, [`checked`][xgather.checked] reads flags in groups of this many
calls: one small program stacks their first values, one copy brings them to the host
(copying each flag by itself costs a call more host time than a small gather takes). A
CPU's flags are on the host already: each is read by itself, once it is ready."""


def _env_on(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


_sync_all = _env_on(os.environ.get("XGATHER_SYNC_CHECKS", ""))


def sync_checks(enabled: bool = True) -> None:
    """Make every [`checked`][xgather.checked] function read its flag at the call (``True``), as
    ``sync=True`` does, or return to deferred reads (``False``): for debugging, as
    ``CUDA_LAUNCH_BLOCKING=1`` does for torch. The environment variable
    ``XGATHER_SYNC_CHECKS=1`` sets it at import (``0``, ``false``, ``no``: off)."""
    global _sync_all
    _sync_all = bool(enabled)


# -- the queue of unread flags ------------------------------------------------------------------

class _Pending:
    """One call's flag and checkify error as its program returned them (``_pack``),
    and which call it was. The error is made an ``Error`` again only where a check
    failed (``error``)."""
    __slots__ = ("flag", "leaves", "name", "call")

    def __init__(self, flag, leaves, name: str, call: int):
        self.flag, self.leaves, self.name, self.call = flag, leaves, name, call

    def error(self):
        values = np.asarray(self.flag)
        structure, shapes, packed = _layouts[int(values[1])]
        if not packed:
            return structure.unflatten(self.leaves)
        at, leaves = 2, []
        for shape, dtype in shapes:
            n = math.prod(shape)
            leaves.append(values[at:at + n].astype(dtype).reshape(shape))
            at += n
        return structure.unflatten(leaves)


class _Group:
    """Calls whose flags, on one accelerator sharding, are read together: once the group
    is closed (full, or read before it filled), ``heads`` stacks their first values on
    the device and is copied to the host asynchronously. (A flag on the host already is
    a queue's entry by itself: its ``_Pending``.)"""
    __slots__ = ("calls", "sharding", "heads")

    def __init__(self, pending: _Pending, sharding):
        self.calls, self.sharding, self.heads = [pending], sharding, None

    def close(self) -> None:
        if self.heads is None:
            flags = [p.flag for p in self.calls]
            # the same count every time: one program per layout of flags (READ_GROUP 1:
            # the flag itself is copied, no program)
            heads = flags[0] if READ_GROUP == len(flags) == 1 else \
                _heads(*flags, *flags[-1:] * (READ_GROUP - len(flags)))
            heads.copy_to_host_async()
            self.heads = heads

    def failed(self) -> list[int]:
        """The positions in ``calls`` of the calls whose check failed (waits for the
        flags)."""
        return np.flatnonzero(np.asarray(self.heads).ravel()[:len(self.calls)]).tolist()


@jax.jit
def _heads(*flags):
    return jnp.stack([flag[0] != 0 for flag in flags])


class _Calls:
    """One thread's calls whose flags are unread, in call order: each host flag's
    ``_Pending``, each accelerator group; how many calls are pending (``count``), and
    how many calls of each checked function this thread made (the number an error names)."""
    __slots__ = ("groups", "count", "calls", "thread")

    def __init__(self):
        self.groups: collections.deque[_Pending | _Group] = collections.deque()
        self.count = 0
        self.calls: dict = {}
        self.thread = threading.current_thread()

    def add(self, pending: _Pending, sharding) -> None:
        """Queue a call's flag: ``sharding`` None where it is on the host already."""
        self.count += 1
        groups = self.groups
        last = groups[-1] if groups else None
        if isinstance(last, _Group) and last.heads is None:  # an open group
            if sharding is not None and sharding == last.sharding:
                last.calls.append(pending)
                if len(last.calls) >= READ_GROUP:
                    last.close()
                return
            last.close()
        if sharding is None:
            groups.append(pending)
            return
        group = _Group(pending, sharding)
        groups.append(group)
        if READ_GROUP <= 1:  # a group of one is full at once: its copy starts now
            group.close()


def _on_host(flag) -> bool:
    """Whether a program's flag is in host memory already (a CPU's)."""
    return all(d.platform == "cpu" for d in flag.devices())


_local = threading.local()
_queues: list[_Calls] = []  # every thread's, for raise_if_error and the report at exit
_queues_lock = threading.Lock()


def _queue() -> _Calls:
    queue = getattr(_local, "queue", None)
    if queue is None:
        queue = _local.queue = _Calls()
        with _queues_lock:
            if not _queues:  # registered once JAX runs, so that it runs before JAX's own
                atexit.register(_report_at_exit)
                # a multiprocessing child made by fork leaves through os._exit, past atexit,
                # after its finalizers (cleared when it starts: registered here, later)
                util = sys.modules.get("multiprocessing.util")
                if util is not None:
                    util.Finalize(None, _report_at_exit, exitpriority=0)
            _queues.append(queue)
    return queue


def _forked() -> None:
    """In a child made by ``fork``: the parent's queues are the parent's to read."""
    _local.queue = None
    _queues.clear()


os.register_at_fork(after_in_child=_forked)


def _settle(queue: _Calls, keep: int) -> None:
    """Read the flags of ``queue`` in call order: those ready (a whole group's), and the
    oldest ones while more than ``keep`` remain (``keep=0``: all). Raises the first
    failure; the calls after it stay queued, and are read and raised in their turn. An
    entry leaves the queue only once its flag was read, so that an interrupt while
    waiting for it leaves it there."""
    groups = queue.groups
    while groups:
        entry = groups[0]
        if isinstance(entry, _Pending):  # a flag on the host (or a failed call, read)
            if queue.count <= keep and not entry.flag.is_ready():
                return
            failed = _check.flag_set(entry.flag)
            groups.popleft()
            queue.count -= 1
            if failed:
                _raise(entry, deferred=True, later=queue.count)
            continue
        if queue.count <= keep and (entry.heads is None or not entry.heads.is_ready()):
            return
        entry.close()
        hits = entry.failed()
        groups.popleft()
        queue.count -= len(entry.calls)
        if hits:
            # the group's other failed calls go back to the front, read already
            groups.extendleft(reversed([entry.calls[at] for at in hits[1:]]))
            queue.count += len(hits) - 1
            _raise(entry.calls[hits[0]], deferred=True, later=queue.count)


def raise_if_error() -> None:
    """Wait for this thread's pending checks of [`checked`][xgather.checked] functions
    and raise the first failure ([`OutOfBoundsError`][xgather.OutOfBoundsError], or a
    user's own checkify error); the next one is raised by the next call. Failures left by
    threads that have ended are raised here too, by any thread."""
    queue = getattr(_local, "queue", None)
    if queue is not None and queue.count:
        _settle(queue, 0)
    if len(_queues) > 1 or queue is None:
        with _queues_lock:
            ended = [q for q in _queues if not q.thread.is_alive()]
        for q in ended:
            _settle(q, 0)
            with _queues_lock:
                if not q.count and q in _queues:
                    _queues.remove(q)


def clear_caches() -> None:
    """Forget every plan, jitted function and eager call path xgather has cached, the
    compiled programs they hold, and the tables its checks grow.

    An eager call keeps the jitted function it ran per signature (op, shapes, dtypes,
    attributes; at most 2048), and so its compiled program: a process that calls the ops
    on thousands of distinct shapes can hold a few GiB (the dtypes guide says more). This
    frees them; later calls compile again. Where no flag of a
    [`checked`][xgather.checked] call is pending (read them first with
    [`raise_if_error`][xgather.raise_if_error]), the tables that number the checks'
    sites and flag layouts are emptied too, and JAX's own caches with them
    (``jax.clear_caches()``), since compiled programs hold those numbers; the queues of
    ended threads are dropped, and each thread's count of its calls starts again.

    Examples:
        >>> import numpy as np, xgather
        >>> out = xgather.onnx.gather(np.arange(4.0), np.array([1]))
        >>> xgather.clear_caches()
    """
    _frontend.clear_caches()
    with _queues_lock:
        _queues[:] = [q for q in _queues if q.count or q.thread.is_alive()]
        pending = any(q.count for q in _queues)
    if not pending:
        for queue in _queues:  # the calls' numbers start again (a pending one keeps its own)
            queue.calls.clear()
    if not pending and (len(_report._sites) or len(_layouts)):
        jax.clear_caches()
        _report._sites.clear()
        _layouts.clear()


# -- what a checked program returns, and the error it raises -------------------------------------

_layouts = _report._Numbered()  # how a traced checkify Error is packed (_pack)


def _pack(err):
    """``(flag, leaves)``: what a checked program returns of the checkify ``err``.

    ``flag`` is one 1-D integer array: whether a check failed, the number of the
    layout that rebuilds ``err`` (traced into the program), then, where every array of
    ``err`` is of integers or booleans (xgather's reports, most checks), those arrays
    raveled, and ``leaves`` is empty; otherwise ``leaves`` are ``err``'s arrays. Each
    output of a program costs its call about a microsecond and a half: the checkify
    Error is rebuilt only where a check failed (``_Pending.error``).
    """
    preds = _jaxprivate.error_predicates(err)
    leaves, structure = jax.tree.flatten(err)
    shapes = tuple((np.shape(x), np.dtype(x.dtype)) for x in leaves)
    packed = all(np.issubdtype(d, np.integer) or d == np.bool_ for _, d in shapes)
    number = _layouts.number((structure, shapes, packed))
    if preds is None:  # this JAX's Error hides its predicates: read every call's error
        _jaxprivate.fallback("Error._pred", "xgather.checked reads every call's error")
        failed = jnp.ones((), bool)
    else:
        failed = functools.reduce(lax.bitwise_or, (
            lax.reduce(p, False, lax.bitwise_or, tuple(range(p.ndim))) for p in preds),
            np.zeros((), bool))
    wide = jnp.int64 if any(d.itemsize == 8 for _, d in shapes) and packed else jnp.int32

    def flat(x):  # in lax ops, as _count_first; one sharding for the concatenation
        return _check.replicated(lax.convert_element_type(
            lax.reshape(x, (math.prod(x.shape),)), wide))
    head = [flat(failed), lax.full((1,), number, wide)]
    if packed:
        return lax.concatenate(head + [flat(x) for x in leaves], 0), []
    return lax.concatenate(head, 0), leaves


def _raise(pending: _Pending, deferred: bool, later: int = 0):
    """Raise the failure that ``pending``'s checkify error holds."""
    error = pending.error()
    msg = error.get()
    where = f"call {pending.call} of xgather.checked({pending.name})"
    if deferred:
        where += (" (an earlier call, whose flag was read after it returned; "
                  "xgather.checked(f, sync=True) raises at the call itself")
        where += (f"; {later} later call(s) are still pending: their failures, if any, "
                  "are raised next)" if later else ")")
    if msg is None:  # no check failed (a JAX whose Error hides its predicates)
        return
    msg = msg.split(" (`check` failed)")[0]
    err = _report.site_error(msg)
    if err is None and _report.REPORT_END not in msg:  # a user's own checkify.check
        try:
            error.throw()
        except Exception as user:
            user.add_note(where)
            raise
    err = err or OutOfBoundsError(msg)
    err.args = (f"{err.args[0]}\n  in {where}",)
    err.call, err.call_index = pending.call, pending.call - 1
    raise err


def _report_at_exit() -> None:
    """Failures still unread at exit are reported as warnings, not lost. Each flag is
    read by itself: no program runs at exit."""
    with _queues_lock:
        queues = list(_queues)
    for queue in queues:
        calls = [p for entry in queue.groups
                 for p in (entry.calls if isinstance(entry, _Group) else [entry])]
        queue.groups.clear()
        queue.count = 0
        for at, pending in enumerate(calls):
            try:
                if _check.flag_set(pending.flag):
                    _raise(pending, deferred=True, later=len(calls) - at - 1)
            except Exception as err:  # noqa: BLE001 - reported, whatever it is
                warnings.warn(f"xgather: a check failed and was never read (call "
                              f"xgather.raise_if_error() to raise it): {err}",
                              UncheckedWarning, stacklevel=1)


# -- checked ---------------------------------------------------------------------------------

def checked(fn=None, *, jit=None, sync: bool = False, **jit_options):
    """``fn`` compiled by ``jit`` with xgather's bound checks kept inside it.

    ``jit`` is ``jax.jit`` (the default), ``flax.nnx.jit``, ``equinox.filter_jit``, or
    any function with ``jax.jit``'s contract; ``jit_options`` are its own
    (``static_argnums``, ``donate_argnames``, ``out_shardings``, ...). ``fn`` runs under
    ``checkify`` inside it (nnx's ``nnx.checkify`` where the jit is nnx's), and the jit
    does the rest by its own rules: static and donated arguments, nnx's write-back,
    equinox's partition, caching and retracing. ``.lower`` is the jit's, of the checked
    program (its flag, then ``fn``'s result). NumPy arguments are read before the call
    returns, as the eager ops read them (the dtypes guide says how).

    The call returns at once; an [`OutOfBoundsError`][xgather.OutOfBoundsError] is
    raised at a later call of any checked function in this thread (which waits only past
    [`MAX_PENDING`][xgather.MAX_PENDING] unread flags), at
    [`raise_if_error`][xgather.raise_if_error], or reported at exit, each failure in its
    turn. ``sync=True`` (or [`sync_checks`][xgather.sync_checks]) raises at the call,
    older failures first, after the step ran (``nnx.jit`` has written it back; a
    donating call's error carries its result as ``result``).

    The outermost wrapper; also a decorator (``@xgather.checked(jit=nnx.jit)``). Its
    ``jitted`` is the jit's function, which returns ``((flag, leaves), result)``: export
    that with ``jax.export`` (symbolic shapes too); ``flag[0]`` is 1 where a check failed.

    Examples:
        >>> import numpy as np, xgather
        >>> f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i))
        >>> d = np.arange(3.0, dtype=np.float32)
        >>> f(d, np.array([2, -1])).tolist(), f(d, np.array([3])).shape  # returns
        ([2.0, 2.0], (1,))
        >>> try:
        ...     xgather.raise_if_error()
        ... except xgather.OutOfBoundsError as err:
        ...     print(str(err).split(" for data")[0], err.index, err.call)
        onnx.Gather-13: index 3 at indices[0] is out of range [-3, 2] 3 2
    """
    if fn is None:
        return functools.partial(checked, jit=jit, sync=sync, **jit_options)
    if not callable(fn):
        fail("xgather.checked", "fn must be a callable (a function of arrays)",
             type(fn).__name__, kind=XGatherTypeError)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    program = (jit or jax.jit)(_checkified(fn, jit), **jit_options)
    static = _static(jit_options)
    donating = any(k.startswith("donate") and v not in ((), None, "none")
                   for k, v in jit_options.items())
    name_key, on_host = object(), None  # its calls' counter; flags on the host (a CPU's)?

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal on_host
        args, kwargs, wait = _dtypes.jit_arguments(name, args, kwargs, static)
        queue = _queue()
        now = sync or _sync_all
        if queue.count:  # a sync call raises older failures first, before it runs
            _settle(queue, 0 if now else MAX_PENDING - 1)
        if args and type(args[0]) is not _ARRAY and _exporting(args):
            return fn(*args, **kwargs)  # an exporter traces: fn's ops export with their checks
        (flag, leaves), out = program(*args, **kwargs)
        if type(flag) is not _ARRAY and isinstance(flag, _TRACER):
            return _inside_a_trace(name, fn, args, kwargs)
        if wait:  # a large NumPy argument, read in place before the call returns
            flag.block_until_ready()
        counts = queue.calls
        number = counts[name_key] = counts.get(name_key, 0) + 1
        if now:
            if _check.flag_set(flag):
                _raise_now(_Pending(flag, leaves, name, number), out, donating)
            return out
        if on_host is None:
            on_host = _on_host(flag)
        # A ready CPU flag (a small program ran on this thread) is read now: a set one is
        # queued and raised in its turn. Behind waiting flags, asking costs more than it finds.
        if on_host and not queue.count and flag.is_ready() and not _check.flag_set(flag):
            return out
        queue.add(_Pending(flag, leaves, name, number), None if on_host else flag.sharding)
        return out

    return _exposing(wrapper, program)


def _exposing(wrapper, program):
    """``wrapper`` with the jit's ``lower`` (of the checked program: its flag, then fn's
    result) and ``jitted``, the jit's function (for ``jax.export``). Not its ``trace``:
    ``jax.eval_shape`` takes a function's trace as its own, and would show the flag."""
    for attr in ("lower", "clear_cache"):
        if hasattr(program, attr):
            setattr(wrapper, attr, getattr(program, attr))
    wrapper.jitted = program
    return wrapper


def _checkified(fn, jit):
    """``fn`` under checkify, for ``jit`` to compile: ``((flag, leaves), result)``."""
    nnx = sys.modules["flax.nnx"] if getattr(jit, "__module__", "").startswith(
        "flax.nnx") else None

    @functools.wraps(fn)  # the jit reads fn's signature (static and donated names)
    def body(*args, **kwargs):
        with _check.TRACING.traced_as("yes"):
            if nnx is not None:  # nnx's reference semantics: its own checkify
                err, out = nnx.checkify(fn, errors=_check.CHECKED_ERRORS)(*args, **kwargs)
            else:  # a closure: arguments the jit keeps static stay Python values
                aside: list = []
                err, arrays = checkify.checkify(lambda: _arrays_of(fn(*args, **kwargs), aside),
                                                errors=_check.CHECKED_ERRORS)()
                out = _rebuild(arrays, *aside)
        return _pack(err), out
    return body


def _inside_a_trace(name: str, fn, args, kwargs):
    """A checked call inside another trace: ``fn`` itself under an exporter (its ops
    export with their checks) or an outer checkify (which takes the checks over), else
    an error."""
    if not _patches.foreign() and _jaxprivate.checkify_errors(3) is None:
        fail(f"xgather.checked({name})", "must be the outermost wrapper: it was called "
             "inside a JAX transformation (jax.jit, nnx.jit, jax.eval_shape, ...), "
             "where its result's check cannot be read. Put the transformation inside "
             "it; checked compiles fn with its jit already")
    return fn(*args, **kwargs)


def _raise_now(pending: _Pending, out, donating: bool) -> None:
    """A sync call's failure; where the call donated its arguments, its result goes with
    the error (``result``), so that a training loop can go on."""
    try:
        _raise(pending, deferred=False)
    except Exception as err:
        if donating:
            err.result = out  # type: ignore[attr-defined]  # a new attribute
            err.add_note("The call donated its arguments, which are gone: its "
                         "result is this error's `result`.")
        raise


def _arrays_of(out, aside: list) -> list:
    """``out``'s arrays, for checkify to return; its structure and other leaves
    (equinox's function fields, which the jit keeps static) go into ``aside``."""
    leaves, tree = jax.tree.flatten(out)
    keep = [isinstance(x, jax.Array | np.ndarray | np.generic) for x in leaves]
    aside += [tree, keep, [x for x, k in zip(leaves, keep, strict=True) if not k]]
    return [x for x, k in zip(leaves, keep, strict=True) if k]


def _rebuild(arrays, tree, keep, others):
    arrays, others = iter(arrays), iter(others)
    return tree.unflatten([next(arrays) if k else next(others) for k in keep])


def _static(options) -> frozenset:
    """The positions and names that ``jit_options`` keep static (not traced, not cut)."""
    out: set = set()
    for key in ("static_argnums", "static_argnames"):
        value = options.get(key, ())
        out.update((value,) if isinstance(value, int | str) else value or ())
    return frozenset(out)


_ARRAY = _jaxprivate.ARRAY_IMPL
_TRACER = jax.core.Tracer


def _exporting(args) -> bool:
    """Whether an exporter (jax2onnx) traces a call whose first argument is ``args[0]``:
    a tracer, under another library's patches of JAX. What is traced there holds the
    exporter's primitives, which nothing else lowers."""
    return bool(args) and isinstance(args[0], _TRACER) and _patches.foreign()
