"""What a failed check says: the report of a bad index, and the table of the sites that a
traced check refers to by number.

The report (``report_format``, ``report_args``): the op, the first bad index as given, its
position, the valid range and the count of bad indices, as a message and as the
attributes of the [`OutOfBoundsError`][xgather.OutOfBoundsError] (``out_of_bounds``).
Concrete indices are checked and reported on the host (``host_check``,
``host_checker``); a traced check under
[`checked`][xgather.checked] carries three values and its site's number (``_site``), and
the host makes the report when it raises (``site_error``).
"""

from __future__ import annotations

import threading

import numpy as np
from jax import lax

from xgather import _indices
from xgather._errors import OutOfBoundsError, named

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



def out_of_bounds(plan, ndim: int, args: list[int], where: str = "") -> OutOfBoundsError:
    """The error of ``report_format``'s values ``args`` (``_report_list``'s order), with
    what its message says as attributes. ``where``: ``call_site``'s."""
    where, _, node = where.partition("|")
    msg = report_format(plan, ndim, where).format(args)
    err = OutOfBoundsError(named(msg, node) if node else msg)
    err.node = node or None
    value, pos, rest = args[0], tuple(args[1:1 + ndim]), args[1 + ndim:]
    low = -rest.pop(0) if plan.negative else 0
    high, axis, size, count = rest
    file, _, line = where.rpartition(":")
    err.op, err.index, err.position, err.valid_range = plan.op, value, pos, (low, high)
    err.axis, err.size, err.count = axis, size, count
    if file and line.isdigit():
        err.file, err.line = file, int(line)
    return err


# -- the check of concrete indices, on the host ----------------------------------------------

_HOST_LIST_MAX = 64  # up to this many indices, Python's min and max beat NumPy's reductions


def _host_range(plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The spec's range of each index component: lowest and highest valid values."""
    lows = tuple(-s if plan.negative else 0 for s in plan.bounds)
    return lows, tuple(s - 1 for s in plan.bounds)


def _in_range(indices: np.ndarray, vector: bool, lows, highs) -> bool:
    """All indices within ``[lows, highs]`` (per component where ``vector``)."""
    if vector:
        flat = indices.reshape(-1, indices.shape[-1])
        if indices.size <= _HOST_LIST_MAX:
            columns = flat.T.tolist()
            mins, maxs = [min(c) for c in columns], [max(c) for c in columns]
        else:
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
    """The check on concrete indices this process holds whole, raising
    [`OutOfBoundsError`][xgather.OutOfBoundsError] at once. The indices' minimum and
    maximum decide; only a bad index costs the report."""
    indices = np.asarray(indices)
    if indices.size == 0 or _in_range(indices, plan.index_vector, *_host_range(plan)):
        return
    indices = _indices.fit_dtype(plan, indices)  # room for sizes and counts
    args = [int(a) for a in report_args(plan, indices)]
    raise out_of_bounds(plan, indices.ndim, args)


def host_checker(plan):
    """``host_check`` for ``plan``'s NumPy indices, its range settled once: the
    per-call check of a cached eager call."""
    vector = plan.index_vector
    lows, highs = _host_range(plan)

    def check(indices: np.ndarray) -> None:
        if indices.size and not _in_range(indices, vector, lows, highs):
            host_check(plan, indices)  # the report
    return check


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

    def __len__(self) -> int:
        return len(self._things)

    def clear(self) -> None:
        with self._lock:
            self._numbers.clear()
            self._things.clear()


_SITE = "xgather report of site "  # a compact report's message: the site, then 3 values
_sites = _Numbered()  # (plan, indices' shape, the user's file and line)


def _site(plan, shape, where: str) -> str:
    """The message of a compact report: the site's number and three values to format."""
    return f"{_SITE}{_sites.number((plan, shape, where))}: {{0[0]}} {{0[1]}} {{0[2]}}"


def site_error(msg: str) -> OutOfBoundsError | None:
    """The error of a compact message (``_site``), its report made on the host; None for
    any other message. A ``shard_map``'s check comes as ``at mapped index K: `` and the
    message: the report says which shard, whose indices the position is within."""
    at = msg.find(_SITE)
    if at < 0:
        return None
    number, values = msg[at + len(_SITE):].split(":", 1)
    plan, shape, where = _sites[int(number)]
    count, first, value = (int(v) for v in values.split()[:3])
    args = [int(a) for a in _report_list(plan, shape, count, first, value, np)]
    err = out_of_bounds(plan, len(shape), args, where)
    shard = msg[:at].strip().rstrip(":")
    if shard:  # "at mapped index 3"
        err.args = (f"{err.args[0]}; in the shard {shard} of a shard_map, where the "
                    "position is within that shard's indices",)
    return err
