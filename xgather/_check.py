"""The ``"error"`` mode's check: the flag, the report, and when a failure is raised.

Read top to bottom, this module is the whole check:

1. **The flag** (``xgather._indices.out_of_range``): one boolean, "some index lies outside the
   spec's range", reduced beside the gather in the form each backend runs fastest:
   what an eager call on device indices reads.
2. **The report** (``report_format``, ``report_args``): the op, the first
   bad index as given, its position, the valid range and the count of bad
   indices. Concrete indices are checked on the host (``host_check``);
   traced ones get a ``checkify`` check (``emit``) whose one reduction gives
   the flag, the count and the first position; under [`checked`][xgather.checked] the host
   makes the report from those when it raises.
3. **Where a traced check may go** (``traced``): under ``checkify`` that
   keeps user checks (so under [`checked`][xgather.checked]), else a clear error at trace time.
4. **When a failure is raised** ([`checked`][xgather.checked]): each call returns its result
   at once and queues its flag (``_Calls``): a CPU's is on the host already (and read at
   once where it is ready then: only a set one is queued), an
   accelerator's are read in groups of [`READ_GROUP`][xgather.READ_GROUP] calls (``_Group``:
   one small program stacks their first values, one copy to the host). Flags are read
   at a later call of any checked function in the same thread (blocking only when
   more than [`MAX_PENDING`][xgather.MAX_PENDING] calls are pending), at
   [`raise_if_error`][xgather.raise_if_error],
   or at exit. ``sync=True`` (or [`sync_checks`][xgather.sync_checks], ``XGATHER_SYNC_CHECKS=1``)
   reads it at the call.

Eager calls raise at the call: NumPy indices are checked on the host while the
gather runs; device indices by a program that returns the flag beside the result
(``xgather._apply.eager_runner``). ``gather`` puts the check beside a gather.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import inspect
import math
import os
import sys
import threading
import types
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from xgather import _dtypes, _indices, _jaxprivate, _patches
from xgather._errors import OutOfBoundsError, UncheckedWarning, XGatherTypeError, fail
from xgather._gather import Call
from xgather._modes import TraceState

# -- 1. the flag -------------------------------------------------------------------------------

def gather(call: Call, data, indices, *, flag: bool = False):
    """``(bad, out)``: ``call``'s gather (``xgather._indices.gather``), checked.

    In the ``"error"`` mode the traced check goes in beside it (``emit``), whose flag
    ``bad`` is; with ``flag`` (an eager call on device indices) ``bad`` is the flag
    alone, which the caller reads; otherwise ``bad`` is None. A program that checks
    wraps negative indices inside the gather.
    """
    checks = call.mode == "error" or flag
    bad = _flag(call.plan, indices, call.mode == "error", call.where) if checks else None
    return bad, _indices.gather(call, data, indices, inline_wrap=checks)


def _flag(plan, indices, report: bool, where: str | None = None):
    """The traced check (``report``: ``emit``), or the flag alone
    (``xgather._indices.out_of_range``)."""
    if not report:
        return _indices.out_of_range(plan, indices)
    return emit(plan, _indices.fit_dtype(plan, indices), where)


def flag_text(plan) -> str:
    """What ``explain`` says of the flag that the ``"error"`` mode's check reduces."""
    n = math.prod(plan.indices_shape)
    if isinstance(n, int) and n == 0:
        return 'bound check (mode="error"): no index to check'
    return ('bound check (mode="error"): under a transformation, one reduction over the '
            f"{n} index values counts the bad ones and finds the first; on device indices "
            "eagerly, " + _indices.any_form(n, plan.flag_form, pad=not plan.small))


# -- 2. the report -----------------------------------------------------------------------------

#: What every report of a bad index holds (what tells it from a user's own checks).
REPORT_END = "out-of-range value(s) in indices)"


def report_format(plan, ndim: int, where: str = "") -> str:
    """The message, with ``{0[k]}`` for the k-th value of the packed report; ``where``
    (the user's file and line, for traced checks) is appended."""
    slots = iter(range(ndim + 6))

    def slot():
        return f"{{0[{next(slots)}]}}"

    value = slot()
    at = ("indices[" + ", ".join(slot() for _ in range(ndim)) + "]") if ndim \
        else "indices (a scalar)"
    lo = f"-{slot()}" if plan.negative else "0"
    hi, axis, size, count = slot(), slot(), slot(), slot()
    tail = f"; the gather was traced at {where}" if where else ""
    tail = tail.replace("{", "{{").replace("}", "}}")
    if not plan.index_vector and plan.bounds[0] == 0:  # not "[-0, -1]"
        return (f"{plan.op}: index {value} at {at} is out of range: data axis {axis} has "
                f"size 0, so no index is in range ({count} {REPORT_END}{tail}")
    if 0 in plan.bounds:  # index tuples: the reported component's range may be empty
        empty = ", ".join(str(a) for a, s in zip(plan.index_axes, plan.bounds, strict=True)
                          if s == 0)
        return (f"{plan.op}: index {value} at {at} is out of range for data axis {axis} of "
                f"size {size}: data axis {empty} has size 0, so no index tuple is in range "
                f"({count} {REPORT_END}{tail}")
    return (f"{plan.op}: index {value} at {at} is out of range [{lo}, {hi}] "
            f"for data axis {axis} of size {size} ({count} {REPORT_END}{tail}")


def report_args(plan, indices):
    """The values ``report_format`` shows, packed in one array, from concrete indices."""
    bad = np.logical_not(_indices.valid(plan, indices, np)).ravel()
    first = int(np.argmax(bad))
    return np.asarray(_report_values(plan, indices, bad.sum(), first, np))


def _report_values(plan, indices, count, first, xp):
    """The report from the first bad index's flat position and the count of bad ones:
    what is left is scalar work (a dynamic read of one index, an unravel)."""
    if indices.ndim == 0:
        value = indices
    elif xp is np:
        value = indices.ravel()[first]
    else:
        value = lax.dynamic_index_in_dim(indices.ravel(), first, keepdims=False)
    args = _report_list(plan, indices.shape, count, first, value, xp)
    return xp.stack([xp.asarray(a).astype(indices.dtype) for a in args])


def _report_list(plan, shape, count, first, value, xp):
    """The values ``report_format`` shows, in its order, for indices of ``shape``."""
    component = first % shape[-1] if plan.index_vector else 0
    bounds, axes = np.asarray(plan.bounds), np.asarray(plan.index_axes)
    size = xp.asarray(bounds)[component] if plan.index_vector else bounds[0]
    axis = xp.asarray(axes)[component] if plan.index_vector else axes[0]
    pos = xp.unravel_index(first, shape) if shape else ()
    return [value, *pos] + ([size] if plan.negative else []) + [size - 1, axis, size, count]


def _count_first(plan, indices):
    """``(count, first)`` of the indices outside the spec's range: how many, and the flat
    position of the first (its size where none is), in one variadic reduction."""
    bad = lax.reshape(lax.bitwise_not(_indices.valid(plan, indices, jnp)), (indices.size,))
    n = bad.size
    kind = jnp.int64 if n >= np.iinfo(np.int32).max else jnp.int32
    count = lax.convert_element_type(bad, kind)
    first = lax.select(bad, lax.iota(kind, n), lax.full((n,), n, kind))
    # One pass. Tried on XLA:CPU (jax 0.10.2 and 0.12.0.1) and slower, in time and in
    # compilation: a first stage over (rows, lanes) blocks, as the flag's, in integers or
    # in float32 sums (then the first bad one in its block); two float32 reductions (a sum,
    # and a max of reversed positions); a float32 max for the flag and the first with the
    # count under lax.cond. Each gave 1.5-2x the check's time on 1M indices.
    return lax.reduce((count, first), (kind(0), kind(n)), _add_min, (0,))


def _add_min(a, b):
    """``_count_first``'s reducer: one function, whose traced form JAX keeps (a new lambda
    at every trace was traced again)."""
    return lax.add(a[0], b[0]), lax.min(a[1], b[1])


_HOST_LIST_MAX = 64  # up to this many indices, Python's min and max beat NumPy's reductions


def _host_range(plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The spec's range of each index component: lowest and highest valid values."""
    lows = tuple(-s if plan.negative else 0 for s in plan.bounds)
    return lows, tuple(s - 1 for s in plan.bounds)


def _in_range(indices: np.ndarray, vector: bool, lows, highs) -> bool:
    """All indices within ``[lows, highs]`` (per component where ``vector``)."""
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
    """The check on concrete indices, raising
    [`OutOfBoundsError`][xgather.OutOfBoundsError] at once. The indices' minimum and
    maximum decide; only a bad index costs the report. Indices that other processes hold
    part of (``jax.distributed``) are checked on the devices, every process raising the
    same error."""
    if isinstance(indices, jax.Array) and not indices.is_fully_addressable:
        _device_checker(plan)(indices)
        return
    indices = np.asarray(indices)
    if indices.size == 0 or _in_range(indices, plan.index_vector, *_host_range(plan)):
        return
    indices = _indices.fit_dtype(plan, indices)  # room for sizes and counts
    raise OutOfBoundsError(report_format(plan, indices.ndim).format(report_args(plan, indices)))


@functools.lru_cache(maxsize=256)
def _device_checker(plan):
    """The traced check alone, read at once: for indices this process cannot read whole."""
    def check(indices):
        emit(plan, indices)
    return checked(jax.jit(check), sync=True)


def host_checker(plan):
    """``host_check`` for ``plan``'s NumPy indices, its range settled once: the
    per-call check of a cached eager call."""
    vector = plan.index_vector
    lows, highs = _host_range(plan)

    def check(indices: np.ndarray) -> None:
        if indices.size and not _in_range(indices, vector, lows, highs):
            host_check(plan, indices)  # the report
    return check


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


def emit(plan, indices, where: str | None = None):
    """The traced check: a checkify check on whether some index is out of range, which
    carries the report and ``where``, the user's file and line (found here where not
    given); returns that flag.

    One variadic reduction over the indices gives the flag, the count of bad indices
    and the first one's flat position. Under [`checked`][xgather.checked] the check carries those
    and the first bad value alone, and the host makes the report from them when it
    raises (``_site_report``): the scalar work of the report compiles slower than
    the reduction. Under a ``checkify`` of the user's, the device makes the whole
    report, which that ``checkify`` formats.
    """
    if indices.size == 0:
        return jnp.zeros((), bool)
    indices = replicated(indices)
    count, first = _count_first(plan, indices)
    bad = lax.gt(count, np.zeros((), count.dtype))
    where = call_site() if where is None else where
    if _TRACING.value == "yes":  # in lax ops, as _count_first
        dtype = indices.dtype
        value = lax.dynamic_slice(lax.reshape(indices, (indices.size,)), (first,), (1,))
        report = lax.concatenate([lax.broadcast(lax.convert_element_type(count, dtype), (1,)),
                                  lax.broadcast(lax.convert_element_type(first, dtype), (1,)),
                                  value], 0)
        checkify.check(lax.bitwise_not(bad), _site(plan, indices.shape, where), report)
    else:
        checkify.check(lax.bitwise_not(bad), report_format(plan, indices.ndim, where),
                       _report_values(plan, indices, count, first, jnp))
    return bad


class _Numbered:
    """Hashable things that a program refers to by number (traced into it as a constant),
    each numbered once: the host looks the number up when a check failed."""

    def __init__(self):
        self._numbers: dict = {}
        self._things: list = []
        self._lock = threading.Lock()

    def number(self, thing) -> int:
        with self._lock:
            number = self._numbers.get(thing)
            if number is None:
                number = self._numbers[thing] = len(self._things)
                self._things.append(thing)
            return number

    def __getitem__(self, number: int):
        return self._things[number]


_SITE = "xgather report of site "  # a compact report's message: the site, then 3 values
_sites = _Numbered()  # (plan, indices' shape, the user's file and line)


def _site(plan, shape, where: str) -> str:
    """The message of a compact report: the site's number and three values to format."""
    return f"{_SITE}{_sites.number((plan, shape, where))}: {{0[0]}} {{0[1]}} {{0[2]}}"


def _site_report(msg: str) -> str | None:
    """The report of a compact message (``_site``), made on the host; None for any
    other message. A ``shard_map``'s check comes as ``at mapped index K: `` and the
    message: the report says which shard, whose indices the position is within."""
    at = msg.find(_SITE)
    if at < 0:
        return None
    number, values = msg[at + len(_SITE):].split(":", 1)
    plan, shape, where = _sites[int(number)]
    count, first, value = (int(v) for v in values.split()[:3])
    args = [int(a) for a in _report_list(plan, shape, count, first, value, np)]
    report = report_format(plan, len(shape), where).format(args)
    shard = msg[:at].strip().rstrip(":")
    if shard:  # "at mapped index 3"
        report += (f"; in the shard {shard} of a shard_map, where the position is within "
                   f"that shard's indices")
    return report


# -- 3. where a traced check may go ------------------------------------------------------------

_OUTSIDE = ("xgather", "jax", "jaxlib", "functools", "contextlib")


def _user_frame() -> tuple[types.FrameType | None, int]:
    """The first frame outside xgather and JAX, and its ``stacklevel`` from the caller."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _OUTSIDE:
        frame, level = frame.f_back, level + 1
    return frame, level


def call_site() -> str:
    """``file:line`` of the user's code that called the op (at trace time)."""
    frame, _ = _user_frame()
    return "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def traced(op: str) -> None:
    """Called where an ``"error"`` op traces its check: fails at trace time unless a
    ``checkify`` that keeps user checks ([`checked`][xgather.checked] is one) will functionalise it,
    and warns where JAX will drop it (a loop body inside a reverse-mode derivative)."""
    errors = _jaxprivate.checkify_errors()
    if errors is None and _patches.foreign():  # an exporter tracing, without xgather's plugin
        fail(op, 'mode="error" is traced under another library\'s patches of JAX, as an '
             f"exporter traces: {_patches.EXPORT_ADVICE}, which exports the check as "
             "onnxruntime's own; elsewhere, wrap the function in xgather.checked(f) or "
             "choose mode=\"clip\", \"fill\" or \"promise_in_bounds\"")
    if errors is None:  # no checkify is tracing
        fail(op, 'mode="error" checks indices at run time, which needs the traced function '
             "to be wrapped: use xgather.checked(f) as the outermost wrapper (or "
             "jax.experimental.checkify.checkify), or choose mode=\"clip\", \"fill\" or "
             "\"promise_in_bounds\"")
    if errors is not _jaxprivate.UNKNOWN and not checkify.user_checks <= errors:
        fail(op, 'mode="error" checks indices with checkify.check, which this '
             "checkify.checkify's errors set would drop: add checkify.user_checks to it "
             "(errors=checkify.float_checks | checkify.user_checks), or wrap with "
             "xgather.checked, or choose another mode",
             "errors=" + ", ".join(sorted(e.__name__ for e in errors)))
    if _jaxprivate.loop_inside_derivative():
        _, level = _user_frame()
        warnings.warn(UncheckedWarning(
            f"{op}: its mode=\"error\" check is traced in a lax.scan/map/fori_loop/"
            "while_loop body under a reverse-mode derivative, where JAX drops checkify "
            "checks: an out-of-range index would go unreported. Check the indices outside "
            "the loop, take the derivative inside the loop body, or choose mode=\"clip\", "
            "\"fill\" or \"promise_in_bounds\""), stacklevel=level)


# -- 4. when a failure is raised ---------------------------------------------------------------

MAX_PENDING = 16
"""The most calls of [`checked`][xgather.checked] functions whose flags a thread leaves
unread: a call that finds this many waits for the oldest before it runs."""

READ_GROUP = 8
"""On an accelerator, [`checked`][xgather.checked] reads flags in groups of this many
calls: one small program stacks their first values, one copy brings them to the host.
Copying and reading each flag by itself costs a call more host time than a small
gather takes (about 80 µs on an H100). A CPU's flags are on the host already: each is
read by itself, as soon as it is ready."""

_sync_all = os.environ.get("XGATHER_SYNC_CHECKS", "") not in ("", "0")


def sync_checks(enabled: bool = True) -> None:
    """Make every [`checked`][xgather.checked] function read its flag at the call (``True``), as
    ``sync=True`` does, or return to deferred reads (``False``): for debugging, as
    ``CUDA_LAUNCH_BLOCKING=1`` does for torch. The environment variable
    ``XGATHER_SYNC_CHECKS=1`` sets it at import."""
    global _sync_all
    _sync_all = bool(enabled)


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

    def failed(self) -> int | None:
        """The position in ``calls`` of the first call whose check failed, if any
        (waits for the flags)."""
        hit = np.flatnonzero(np.asarray(self.heads)[:len(self.calls)])
        return int(hit[0]) if hit.size else None


@jax.jit
def _heads(*flags):
    return jnp.stack([flag[0] != 0 for flag in flags])


class _Calls:
    """One thread's calls whose flags are unread, in call order: each host flag's
    ``_Pending``, each accelerator group; and how many calls of each checked function
    this thread made (the number an error names)."""
    __slots__ = ("groups", "count", "calls")

    def __init__(self):
        self.groups: collections.deque[_Pending | _Group] = collections.deque()
        self.count = 0
        self.calls: dict = {}

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

    def clear(self) -> None:
        self.groups.clear()
        self.count = 0


_local = threading.local()
_queues: list[_Calls] = []  # every thread's, for the report at exit
_queues_lock = threading.Lock()


def _on_host(flag) -> bool:
    """Whether a program's flag is in host memory already (a CPU's)."""
    return all(d.platform == "cpu" for d in flag.devices())


def _queue() -> _Calls:
    queue = getattr(_local, "queue", None)
    if queue is None:
        queue = _local.queue = _Calls()
        with _queues_lock:
            if not _queues:  # registered once JAX runs, so that it runs before JAX's own
                atexit.register(_report_at_exit)
            _queues.append(queue)
    return queue


def _settle(queue: _Calls, keep: int) -> None:
    """Read the flags of ``queue`` in call order: those ready (a whole group's), and the
    oldest ones while more than ``keep`` remain (``keep=0``: all). Raises the first
    failure. (A host flag's entry is read on a branch of its own: this runs at every
    call, where a group-of-one interface cost half a microsecond more a call.)"""
    groups = queue.groups
    while groups:
        entry = groups[0]
        if isinstance(entry, _Pending):  # a flag on the host
            if queue.count <= keep and not entry.flag.is_ready():
                return
            groups.popleft()
            queue.count -= 1
            if flag_set(entry.flag):
                _fail(queue, [entry], 0)
            continue
        if queue.count <= keep and (entry.heads is None or not entry.heads.is_ready()):
            return
        entry.close()
        groups.popleft()
        queue.count -= len(entry.calls)
        at = entry.failed()
        if at is not None:
            _fail(queue, entry.calls, at)


def _fail(queue: _Calls, calls: list[_Pending], at: int) -> None:
    """Raise ``calls[at]``'s failure, ``queue`` read up to ``calls``: the calls after it
    are dropped unread (and counted in the error)."""
    later = queue.count + len(calls) - at - 1
    queue.clear()
    _raise(calls[at], deferred=True, later=later)


def raise_if_error() -> None:
    """Wait for this thread's pending checks of [`checked`][xgather.checked] functions
    and raise the first failure, once ([`OutOfBoundsError`][xgather.OutOfBoundsError], or
    a user's own checkify error)."""
    queue = getattr(_local, "queue", None)
    if queue is not None and queue.count:
        _settle(queue, 0)


_layouts = _Numbered()  # how a traced checkify Error is packed (_pack)


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
        return replicated(lax.convert_element_type(lax.reshape(x, (math.prod(x.shape),)),
                                                   wide))
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
        where += f"; {later} later call(s) were pending and are not checked)" if later else ")"
    if msg is None:  # no check failed (a JAX whose Error hides its predicates)
        return
    msg = msg.split(" (`check` failed)")[0]
    msg = _site_report(msg) or msg
    if REPORT_END not in msg:  # a user's own checkify.check
        try:
            error.throw()
        except Exception as err:
            err.add_note(where)
            raise
    raise OutOfBoundsError(f"{msg}\n  in {where}")


def _raise_now(pending: _Pending, out, state, args, kwargs, donating) -> None:
    """A synchronous call's failure. The step is not applied: nnx's variables are not
    written back, and the arguments are as they were. Where the call donated arguments,
    they are gone: nnx's variables are written back then, and the error carries the
    call's result as ``result``, so that a training loop can go on."""
    try:
        _raise(pending, deferred=False)
    except Exception as err:  # xgather's error, or a user's own checkify.check
        if donating:
            if state is not None:
                _nnx().update((args, kwargs), state)
            err.result = out  # type: ignore[attr-defined]  # any exception: a new attribute
            err.add_note("The call donated its arguments, which are gone: its result is "
                         "this error's `result` (nnx objects among the arguments were "
                         "updated).")
        raise


def _report_at_exit() -> None:
    """A failure still unread at exit is reported as a warning, not lost. Each flag is
    read by itself: no program runs at exit."""
    for queue in list(_queues):
        calls = [p for entry in queue.groups
                 for p in (entry.calls if isinstance(entry, _Group) else [entry])]
        queue.clear()
        for at, pending in enumerate(calls):
            try:
                if flag_set(pending.flag):
                    _raise(pending, deferred=True, later=len(calls) - at - 1)
            except Exception as err:  # noqa: BLE001 - reported, whatever it is
                warnings.warn(f"xgather: a check failed and was never read (call "
                              f"xgather.raise_if_error() to raise it): {err}",
                              UncheckedWarning, stacklevel=1)
                break


#: Whether [`checked`][xgather.checked] is tracing (``xgather._modes.TraceState``): part of
#: the trace context, so that a function jitted inside ``fn`` keeps the traces made there
#: (which hold functionalised checks) apart from those of a plain call, which gets
#: xgather's own error.
_TRACING = TraceState("xgather_checked_tracing", ("no", "yes"), "no",
                      "Whether xgather.checked is tracing (set by xgather alone).")


_ARRAY = _jaxprivate.ARRAY_IMPL
_TRACER = jax.core.Tracer
#: Argument types that cannot hold an nnx object: where flax.nnx is imported, a call whose
#: arguments are all of these still goes to ``jax.jit`` as they are (``_plain``).
_PLAIN = frozenset({_ARRAY, np.ndarray, int, float, bool, complex, np.bool_, np.int32,
                    np.int64, np.float32, np.float64})


def _plain(args, kwargs) -> bool:
    """Whether every argument is an array or a number (no container to look into)."""
    for x in args:
        if type(x) not in _PLAIN:
            return False
    for x in kwargs.values():
        if type(x) not in _PLAIN:
            return False
    return True


def _is_dynamic(leaf) -> bool:
    """What ``jax.jit`` traces: arrays and Python numbers. Other leaves (functions, strings,
    equinox's function fields) are compile-time constants."""
    return isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float | complex)


def _dynamic(tree, leaves) -> list[bool]:
    """Which of ``tree``'s ``leaves`` are traced: ``_is_dynamic``'s, except that a Python
    number that is an equinox module's field is a compile-time constant, as under
    ``eqx.filter_jit`` (``eqx.nn.Dropout``'s ``inference`` flag is one)."""
    dynamic = [_is_dynamic(x) for x in leaves]
    eqx = sys.modules.get("equinox")
    if eqx is None:
        return dynamic
    nodes = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, eqx.Module))
    at = 0
    for node in nodes:
        if not isinstance(node, eqx.Module):
            at += 1
            continue
        n = len(jax.tree.leaves(node))
        for i in range(at, at + n):
            if type(leaves[i]) in (bool, int, float, complex):  # not NumPy's float64
                dynamic[i] = False
        at += n
    return dynamic


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Everything of a call's arguments that is not an array: the jit key of the program.
    ``graph`` is flax.nnx's graph definition where the arguments hold nnx objects."""
    treedef: Any
    graph: Any
    statics: tuple  # (leaf position, value) of the constant leaves
    donated: tuple[bool, ...]  # per array leaf
    argnums: tuple  # (position, value) of the static positional arguments
    argnames: tuple  # (name, value) of the static keyword arguments

    def build(self, donated, kept):
        """The arguments again, from the array leaves (inside the trace)."""
        statics, flags = dict(self.statics), iter(self.donated)
        d, k = iter(donated), iter(kept)
        leaves = [statics[i] if i in statics else next(d if next(flags) else k)
                  for i in range(self.treedef.num_leaves)]
        tree = self.treedef.unflatten(leaves)
        if self.graph is not None:
            tree = _nnx().merge(self.graph, tree)
        args, kwargs = tree
        args = list(args)
        for i, value in self.argnums:
            args[i] = value
        return tuple(args), {**kwargs, **dict(self.argnames)}

    def state(self, args, kwargs):
        """nnx's variables after the call, to write back (None without nnx objects)."""
        if self.graph is None:
            return None
        return _nnx().state((args, kwargs), _nnx().Variable)


def _nnx():
    return sys.modules.get("flax.nnx")


def _split(fn_name, args, kwargs, argnums, argnames, donate_nums, donate_names):
    """``(spec, donated, kept)``: a call's arguments as a hashable spec and two lists of
    arrays, those to donate and the rest."""
    statics_pos = tuple((i, args[i]) for i in argnums if i < len(args))
    statics_kw = tuple((n, kwargs[n]) for n in argnames if n in kwargs)
    tree = _without(args, kwargs, argnums, argnames)
    graph, nnx = None, _nnx()
    if nnx is not None:
        objects = (nnx.Pytree, nnx.Variable)
        if any(isinstance(x, objects) for x in jax.tree.leaves(
                tree, is_leaf=lambda x: isinstance(x, objects))):
            graph, tree = nnx.split(tree)
    paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    dynamic = _dynamic(tree, [leaf for _, leaf in paths])
    statics, donated, dyn_d, dyn_k = [], [], [], []
    for i, (path, leaf) in enumerate(paths):
        if not dynamic[i]:
            statics.append((i, leaf))
            continue
        top, key = (_key(path[0]), _key(path[1])) if len(path) > 1 else (None, None)
        give = (top == 0 and key in donate_nums) or (top == 1 and key in donate_names)
        donated.append(give)
        (dyn_d if give else dyn_k).append(leaf)
    spec = _Spec(treedef, graph, tuple(statics), tuple(donated), statics_pos, statics_kw)
    try:
        hash(spec)
    except TypeError as err:
        fail(f"xgather.checked({fn_name})", "every argument that is not an array must be "
             "hashable (it becomes a compile-time constant)", str(err), kind=XGatherTypeError)
    return spec, dyn_d, dyn_k


def _without(args, kwargs, argnums, argnames):
    """The arguments as one tree, the static ones left out (``None`` in their place)."""
    if not (argnums or argnames):
        return args, kwargs
    return (tuple(None if i in argnums else a for i, a in enumerate(args)),
            {n: v for n, v in kwargs.items() if n not in argnames})


class _Result:
    """A result's arrays, and what puts them back into its structure (``_split_result``)
    as the pytree's auxiliary data. ``jax.jit`` keeps that with each compiled program, so
    a call gets the structure that its own shapes' trace made."""
    __slots__ = ("arrays", "how")

    def __init__(self, arrays, how):
        self.arrays, self.how = arrays, how

    def value(self):
        """The result as ``fn`` returned it."""
        treedef, dynamic, statics = self.how.parts
        if dynamic is None:
            return treedef.unflatten(self.arrays)
        arrays, statics = iter(self.arrays), iter(statics)
        return treedef.unflatten([next(arrays) if d else next(statics) for d in dynamic])


class _How:
    """``_Result``'s auxiliary data, compared by identity (its constants need not be)."""
    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = parts


jax.tree_util.register_pytree_node(
    _Result, lambda r: (r.arrays, r.how), lambda how, arrays: _Result(list(arrays), how))


def _split_result(out) -> _Result:
    """A result's arrays, and its structure and other leaves (functions, strings:
    equinox's fields), which cannot leave a jitted program."""
    leaves, treedef = jax.tree.flatten(out)
    dynamic = _dynamic(out, leaves)
    if all(dynamic):
        return _Result(leaves, _How((treedef, None, ())))
    statics = tuple(x for x, d in zip(leaves, dynamic, strict=True) if not d)
    return _Result([x for x, d in zip(leaves, dynamic, strict=True) if d],
                   _How((treedef, tuple(dynamic), statics)))


def _key(entry):
    """The index or name of one step of a pytree path."""
    for attr in ("idx", "key", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return None


def _argnums(value) -> tuple:
    """jax.jit's forms: one position or name, or several."""
    return (value,) if isinstance(value, int | str) else tuple(value)


def _nums_and_names(fn, nums: tuple, names: tuple) -> tuple[tuple, tuple]:
    """Positions and names made to name the same arguments, through ``fn``'s signature,
    as ``jax.jit`` does: ``static_argnames=("n",)`` also holds where ``n`` is passed by
    position, and ``static_argnums=(2,)`` where the third argument is passed by name.
    (The checked programs take ``*args, **kwargs``, where ``jax.jit`` cannot see it.)"""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: as given
        return nums, names
    both = (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, *both)]
    if not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        # counted from the signature's end, not from the end of a call's arguments
        nums = tuple(i + len(positional) if -len(positional) <= i < 0 else i for i in nums)
    more_nums = [i for i, p in enumerate(positional) if p.name in names and p.kind in both]
    more_names = [positional[i].name for i in nums  # (with *args, -1 is the call's last)
                  if 0 <= i < len(positional) and positional[i].kind in both]
    return (tuple(dict.fromkeys((*nums, *more_nums))),
            tuple(dict.fromkeys((*names, *more_names))))


def checked(fn=None, *, sync: bool = False, static_argnums=(), static_argnames=(),
            donate_argnums=(), donate_argnames=()):
    """``fn`` with xgather's bound checks kept, compiled once per argument structure.

    Returns a jitted function that runs ``fn`` under ``checkify`` in one program,
    which returns the result and a flag. The call returns the result without
    waiting for the program: the flag is read later (on an accelerator, with those
    of [`READ_GROUP`][xgather.READ_GROUP] calls together, copied to the host
    asynchronously), and an [`OutOfBoundsError`][xgather.OutOfBoundsError] is raised at
    the next call of any checked function in this thread once that flag is read (the
    call waits only when more than [`MAX_PENDING`][xgather.MAX_PENDING] flags are unread), at
    [`raise_if_error`][xgather.raise_if_error], or reported at exit. ``sync=True`` (or
    [`sync_checks`][xgather.sync_checks]) raises at the call itself.

    ``fn`` may be jitted already or contain ``jax.grad``, ``jax.vmap``, loops,
    and flax.nnx transforms; its arguments and results may be pytrees of arrays,
    nnx objects (their variables are written back after the call, as ``nnx.jit``
    does) and equinox modules (fields that are not arrays are compile-time
    constants). ``static_argnums``, ``static_argnames``, ``donate_argnums`` and
    ``donate_argnames`` are ``jax.jit``'s. Use it as the outermost wrapper;
    called inside another transformation it fails with a clear error (or, under a
    ``checkify`` that keeps user checks, leaves the check to that one; traced by
    jax2onnx, it is ``fn``, whose ops export with their checks).
    Also a decorator: ``@xgather.checked`` or ``@xgather.checked(sync=True)``.

    Examples:
        >>> import jax, numpy as np, xgather
        >>> f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i))
        >>> f(np.arange(3.0, dtype=np.float32), np.array([2, -1])).tolist()
        [2.0, 2.0]
        >>> _ = f(np.arange(3.0, dtype=np.float32), np.array([3]))  # returns at once
        >>> try:
        ...     xgather.raise_if_error()
        ... except xgather.OutOfBoundsError as err:
        ...     print(str(err).split(" for data")[0])
        onnx.Gather-13: index 3 at indices[0] is out of range [-3, 2]
    """
    if fn is None:
        return functools.partial(checked, sync=sync, static_argnums=static_argnums,
                                 static_argnames=static_argnames, donate_argnums=donate_argnums,
                                 donate_argnames=donate_argnames)
    if not callable(fn):
        fail("xgather.checked", "fn must be a callable (a function of arrays)",
             type(fn).__name__, kind=XGatherTypeError)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    argnums, argnames = _nums_and_names(fn, _argnums(static_argnums), _argnums(static_argnames))
    donate_nums, donate_names = _nums_and_names(fn, _argnums(donate_argnums),
                                                _argnums(donate_argnames))
    static = frozenset(argnums + argnames)

    programs: dict = {}  # spec -> [spec, its jitted program]
    known: dict = {}  # (structure, constants) -> (that list, array leaves, donated): no nnx

    def program(spec, donated, kept):
        """The program of arguments that ``jax.jit`` cannot take as they are: ``fn`` on
        their array leaves, nnx's variables written back (``_Spec``)."""
        def body(donated, kept):
            args, kwargs = spec.build(donated, kept)
            return _split_result(fn(*args, **kwargs)), spec.state(args, kwargs)
        with _TRACING.traced_as("yes"):
            err, (out, state) = checkify.checkify(body, errors=checkify.user_checks)(donated,
                                                                                      kept)
        return *_pack(err), out, state

    def direct_program(*args, **kwargs):
        """The program of arguments that ``jax.jit`` takes as they are (arrays, numbers)."""
        with _TRACING.traced_as("yes"):
            err, out = checkify.checkify(fn, errors=checkify.user_checks)(*args, **kwargs)
        return *_pack(err), out

    direct = jax.jit(direct_program, static_argnums=argnums, static_argnames=argnames,
                     donate_argnums=donate_nums, donate_argnames=donate_names)
    direct_fails = False  # once jax.jit refused the arguments as they are

    def arrays_of(args, kwargs):
        """``(entry, donated, kept)``: settled once per structure and constants, where no
        nnx object is among the arguments (those are split by nnx on every call)."""
        tree = _without(args, kwargs, argnums, argnames)
        leaves, treedef = jax.tree.flatten(tree)
        dynamic = _dynamic(tree, leaves)
        constants = tuple(x for x, d in zip(leaves, dynamic, strict=True) if not d)
        key = (treedef, constants) if not (argnums or argnames) else (
            treedef, constants, tuple((i, args[i]) for i in argnums if i < len(args)),
            tuple((n, kwargs[n]) for n in argnames if n in kwargs))
        try:
            hit = known.get(key)
        except TypeError:  # an unhashable constant: _split says which
            hit = None
        if hit is not None:
            entry, dynamic, give = hit
            arrays = [x for x, d in zip(leaves, dynamic, strict=True) if d]
            return (entry, [x for x, g in zip(arrays, give, strict=True) if g],
                    [x for x, g in zip(arrays, give, strict=True) if not g])
        spec, donated, kept = _split(name, args, kwargs, argnums, argnames, donate_nums,
                                     donate_names)
        entry = programs.get(spec)
        if entry is None:
            entry = programs[spec] = [spec, jax.jit(functools.partial(program, spec),
                                                    donate_argnums=0)]
        if spec.graph is None:
            constants = dict(spec.statics)
            known[key] = (entry, tuple(i not in constants for i in range(len(leaves))),
                          spec.donated)
        return entry, donated, kept

    def run(args, kwargs):
        """``(flag, leaves, out, state)`` of a call that ``jax.jit`` did not take as it is
        (``wrapper`` tries that first): through ``arrays_of``. None where an exporter
        traces the call (``_exporting``): nothing is traced then."""
        entry, donated, kept = arrays_of(args, kwargs)
        if _exporting(donated or kept):
            return None
        flag, leaves, result, state = entry[1](donated, kept)
        return flag, leaves, result.value(), state

    def forget():
        """Drop every trace and program made so far (those made under an exporter's patches
        among them): the next call traces again."""
        nonlocal direct_fails
        direct.clear_cache()
        programs.clear()
        known.clear()
        direct_fails = False

    name_key = object()  # this function's count of calls in a thread's queue
    on_host = None  # whether flags are on the host already (a CPU's), once known

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal on_host, direct_fails
        _dtypes.check_jit_arguments(name, args, kwargs, static)
        queue = _queue()
        if queue.count:
            _settle(queue, MAX_PENDING - 1)
        # Through jax.jit as it is where it takes the arguments and the result (no nnx
        # objects, no constants): fewer microseconds a call than through arrays_of.
        ran = None
        modules = sys.modules
        if not direct_fails and (("flax.nnx" not in modules and "equinox" not in modules)
                                 or _plain(args, kwargs)):
            if _exporting(args):  # an exporter traces the call: as below
                return fn(*args, **kwargs)
            try:
                flag, leaves, out = direct(*args, **kwargs)
                state = None
                ran = True
            except TypeError:  # a function, a string, an equinox field: a constant
                ran = False  # (or fn's own TypeError, which arrays_of's way raises again)
        if not ran:
            taken = run(args, kwargs)
            if taken is None:  # an exporter traces the call: fn's ops export with their checks
                return fn(*args, **kwargs)
            flag, leaves, out, state = taken
            if ran is False:
                direct_fails = True  # the second way took what jax.jit refused
        if type(flag) is not _ARRAY and isinstance(flag, _TRACER):  # inside a transformation
            if _patches.foreign():  # an exporter, unseen by _exporting: as above
                forget()
                return fn(*args, **kwargs)
            if _jaxprivate.checkify_errors() is None:
                fail(f"xgather.checked({name})", "must be the outermost wrapper: it was called "
                     "inside a JAX transformation (jax.jit, nnx.jit, jax.eval_shape, ...), "
                     "where its result's check cannot be read. Put the transformation inside "
                     "it, as in xgather.checked(jax.jit(f)); checked compiles fn already")
            # An outer checkify takes the checks over: fn again, traced with the report.
            return fn(*args, **kwargs)
        counts = queue.calls
        number = counts[name_key] = counts.get(name_key, 0) + 1
        if sync or _sync_all:
            if flag_set(flag):  # before nnx's variables are written back: not applied
                _raise_now(_Pending(flag, leaves, name, number), out, state, args, kwargs,
                           donate_nums or donate_names)
            if state is not None:
                _nnx().update((args, kwargs), state)
            return out
        if state is not None:
            _nnx().update((args, kwargs), state)
        if on_host is None:
            on_host = _on_host(flag)
        # A CPU flag that is ready already (a small program runs on the calling thread) is
        # read now, which waits for nothing: a clear one is done with, a set one is queued
        # behind the calls before it and raised as any other (1 µs a call less than
        # queueing every flag).
        if on_host and flag.is_ready() and not flag_set(flag):
            return out
        queue.add(_Pending(flag, leaves, name, number), None if on_host else flag.sharding)
        return out

    return wrapper


def _exporting(arrays) -> bool:
    """Whether an exporter (jax2onnx) traces a call whose array arguments are ``arrays``
    (a sequence, maybe empty): the first a tracer, under another library's patches of JAX.
    What is traced there holds the exporter's primitives, which nothing else lowers."""
    return bool(arrays) and isinstance(arrays[0], _TRACER) and _patches.foreign()


def flag_set(flag) -> bool:
    """Whether the first value of a flag a program returned is set: a boolean (an eager
    call's) or ``_pack``'s integers, 0 or 1. Read on the host, it waits for the program. A
    single-device CPU array is read through the buffer protocol, the lowest byte of its
    first value (on a little-endian host), sooner than ``np.asarray``: 1.3 µs, where
    reading ``flag.dtype`` first cost 0.6 µs more. Other arrays (GPU, sharded) are
    copied over."""
    if _LITTLE_ENDIAN:
        try:
            return memoryview(flag).cast("B")[0] != 0
        except (BufferError, TypeError, NotImplementedError):
            pass
    return bool(np.asarray(flag).ravel()[0])


_LITTLE_ENDIAN = sys.byteorder == "little"
