"""How ``xgather.checked`` reads an accelerator's flags: ``xgather-bench readers``.

For each workload, the spec's default under ``xgather.checked`` and, for the floor,
``mode="promise_in_bounds"`` (no check), timed pipelined: :data:`PIPELINE` calls, one
wait, then every flag still unread is read (``xgather.raise_if_error``, so that no
sample leaves flags to the next). The checked function runs under each reader of
:data:`READERS`, set by ``xgather._checked.READ_GROUP``, which the checked call reads at
every call: the same compiled program each time, only the host's reading differs:

* ``per-flag``: ``READ_GROUP = 1``: each call's flag copied to the host by itself
  (``copy_to_host_async``), polled with ``is_ready`` at later calls, read when ready;
* ``groups of 8``: ``READ_GROUP = 8`` (the library's): one small program stacks the first
  values of 8 calls' flags, one copy brings them over.

Also a call's host time under each (no wait for its result), and the sizes of the groups
each reader read in one pipelined sample (``groups_read``: the reader checked, not assumed).

A CPU's flags are on the host already, and each is read by itself whatever
``READ_GROUP`` says: on a CPU the run takes them as an accelerator's (as
``tests/test_check.py`` does), so that the readers run their code; the figures then say
nothing of an accelerator.
"""

from __future__ import annotations

import contextlib
import time

from . import stats, systems
from .check import _functions, _inputs
from .crowding import save  # noqa: F401 - the side commands' JSON writer (__main__._report)
from .workloads import WORKLOADS, default_size

SCHEMA = "xgather-bench-readers/1"
#: Calls per pipelined sample, then one wait and every unread flag read.
PIPELINE = 10
#: ``{reader: READ_GROUP}``; ``promise`` runs the unchecked program (None: no flag).
READERS = {"promise": None, "per-flag": 1, "groups of 8": 8}
#: The workloads of a plain run: one gather (pipelined) and one model step.
DEFAULT_KEYS = ("W1", "M1")


@contextlib.contextmanager
def reader(group: int | None):
    """``xgather._checked.READ_GROUP`` set to ``group`` inside the block (None: as it is)."""
    from xgather import _checked
    saved = _checked.READ_GROUP
    if group is not None:
        _checked.READ_GROUP = group
    try:
        yield
    finally:
        _checked.READ_GROUP = saved


@contextlib.contextmanager
def flags_as_accelerators(platform: str):
    """On a CPU, the checked calls made inside the block (their first call among them)
    take their flags as an accelerator's, read in groups; elsewhere nothing changes."""
    from xgather import _checked
    if platform != "cpu":
        yield
        return
    saved = _checked._on_host
    _checked._on_host = lambda flag: False
    try:
        yield
    finally:
        _checked._on_host = saved


def groups_read(f, group: int | None, calls: int = PIPELINE) -> list[int]:
    """The sizes of the groups of flags read over ``calls`` calls of ``f`` under ``group``,
    then ``raise_if_error`` (as a pipelined sample runs)."""
    import jax

    import xgather
    from xgather import _checked
    sizes: list[int] = []
    close = _checked._Group.close

    def counted(self):
        if self.heads is None:
            sizes.append(len(self.calls))
        close(self)
    _checked._Group.close = counted
    try:
        with reader(group):
            out = None
            for _ in range(calls):
                out = f()
            jax.block_until_ready(out)
            xgather.raise_if_error()
    finally:
        _checked._Group.close = close
    return sizes


def _timers(fns: dict) -> dict:
    """``{reader: runner}``: PIPELINE calls, one wait, every unread flag read."""
    import jax

    import xgather
    out = {}
    for name, group in READERS.items():
        f = fns["promise" if group is None else "default"]

        def pipelined(f=f, group=group):
            with reader(group):
                for _ in range(PIPELINE - 1):
                    f()
                out = jax.block_until_ready(f())
                xgather.raise_if_error()
            return out
        out[name] = pipelined
    return out


def _host_times(fns: dict, calls: int) -> dict[str, float]:
    """Median host seconds of one call returning (no wait for its result), per reader,
    over ``calls`` calls in rounds of :data:`PIPELINE`, each round then waited for and
    its flags read (20 rounds; fewer where the run asks fewer than 20 rounds)."""
    import jax

    import xgather
    times: dict[str, list[float]] = {name: [] for name in READERS}
    for _ in range(max(1, calls // PIPELINE)):
        for name, group in READERS.items():
            f = fns["promise" if group is None else "default"]
            with reader(group):
                out = None
                for _ in range(PIPELINE):
                    t0 = time.perf_counter()
                    out = f()
                    times[name].append(time.perf_counter() - t0)
                jax.block_until_ready(out)
                xgather.raise_if_error()
    return {name: stats.median(v) for name, v in times.items()}


def run(keys=None, size: str | None = None, device=None, timing=None, progress=print) -> dict:
    import jax

    import xgather
    device = device or jax.devices()[0]
    size = size or default_size(device.platform)
    keys = list(keys or DEFAULT_KEYS)
    timing = timing or {"sample_s": 0.02, "budget_s": 2.0, "least": 15, "most": 100}
    results = []
    with flags_as_accelerators(device.platform):
        for n, key in enumerate(keys, 1):
            w = WORKLOADS[key]
            if not systems.checks(w, None):
                progress(f"[{n}/{len(keys)}] {key} {w.title}: skipped, its default has no "
                         "check to read")
                continue
            t_start = time.perf_counter()
            warm = _functions(w, *_inputs(w, *w.warmup_arrays(size), device))
            for f in warm.values():
                jax.block_until_ready(f())
            xgather.raise_if_error()
            data, idx = w.arrays(size)
            fns = _functions(w, *_inputs(w, data, idx, device))
            for f in fns.values():  # compiled, and its first flag read, before any timing
                jax.block_until_ready(f())
            xgather.raise_if_error()
            groups = {name: groups_read(fns["promise" if g is None else "default"], g)
                      for name, g in READERS.items()}
            for name, g in READERS.items():
                want = [] if g is None else [g] * (PIPELINE // g) + (
                    [PIPELINE % g] if PIPELINE % g else [])
                if groups[name] != want:
                    raise RuntimeError(f"{key}: the {name} reader read groups of "
                                       f"{groups[name]}, not {want}")
            timers = _timers(fns)
            reps = stats.common_reps(timers, "promise", timing["sample_s"])
            samples = stats.timed_rounds(timers, reps, timing["least"], timing["budget_s"],
                                         timing["most"])
            per_call = {k: [s / PIPELINE for s in v] for k, v in samples.items()}
            host = _host_times(fns, min(20, timing["least"]) * PIPELINE)
            row = {"workload": key, "title": w.title, "step": w.step,
                   "shapes": {"data": list(data.shape), "indices": list(idx.shape)},
                   "read_group": {k: g for k, g in READERS.items()},
                   "groups_read": groups,
                   "median_s": {k: stats.median(v) for k, v in per_call.items()},
                   "samples_s": per_call, "rounds": len(samples["promise"]),
                   "host_call_s": host,
                   "per-flag/promise": stats.paired_ratio(samples["per-flag"],
                                                          samples["promise"]),
                   "groups of 8/promise": stats.paired_ratio(samples["groups of 8"],
                                                             samples["promise"]),
                   "per-flag/groups of 8": stats.paired_ratio(samples["per-flag"],
                                                              samples["groups of 8"])}
            results.append(row)
            del fns, timers, warm
            progress(f"[{n}/{len(keys)}] {key} {w.title}: {row['rounds']} rounds, "
                     f"{time.perf_counter() - t_start:.1f} s")
    return {"size": size, "pipeline": PIPELINE,
            "flags_taken_as_accelerators": device.platform == "cpu",
            "rounds": timing, "results": results}


def table(record: dict) -> str:
    """Per workload: promise's time a call, each checked reader's over promise's and
    per-flag's over groups of 8 (pipelined), and a call's host time per reader."""
    lines = [f"flag readers: {record['device'].get('kind', record['device'])}, size "
             f"{record['size']}, pipelined = {record['pipeline']} calls, one wait, every "
             "flag read; ratios are medians of per-round ratios"
             + (" (a CPU: flags taken as an accelerator's)"
                if record.get("flags_taken_as_accelerators") else ""),
             f"{'workload':<30} {'promise us':>10} {'flag/pr':>8} {'grp8/pr':>8} "
             f"{'flag/grp8':>9} {'host us: pr':>11} {'flag':>7} {'grp8':>7}  groups read"]
    for r in record["results"]:
        host = r["host_call_s"]
        lines.append(
            f"{r['workload'] + ' ' + r['title']:<30.30} "
            f"{r['median_s']['promise'] * 1e6:10.1f} {r['per-flag/promise']:8.2f} "
            f"{r['groups of 8/promise']:8.2f} {r['per-flag/groups of 8']:9.2f} "
            f"{host['promise'] * 1e6:11.1f} {host['per-flag'] * 1e6:7.1f} "
            f"{host['groups of 8'] * 1e6:7.1f}  "
            f"flag {r['groups_read']['per-flag']}, grp8 {r['groups_read']['groups of 8']}")
    lines.append("flag: per-flag reads (READ_GROUP 1: each flag copied by itself, polled with "
                 "is_ready); grp8: groups of 8 (one stacking program, one copy); host us: a "
                 "call's time until it returns, no wait for its result")
    return "\n".join(lines)
