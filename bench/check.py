"""What the spec's default check costs: ``xgather-bench check``.

For each workload, three JAX systems run the same jitted function, a fourth the
hand-written check:

* ``promise``: ``mode="promise_in_bounds"``, no check (the floor);
* ``default``: the spec's default under ``xgather.checked``, which returns each
  result without waiting for its flag (the flag is read at a later call);
* ``sync``: the same under ``xgather.checked(f, sync=True)``, which reads the flag
  before the call returns;
* ``lax-checked``: no xgather, what an expert writes by hand (``systems.lax_checked_fn``):
  one ``jax.jit`` program of the gather in ``lax`` (negative indices wrapped as the
  spec says) and ``jnp.any`` of the spec's out-of-range test, whose flag the host reads
  (a Python ``bool``) at the next call, raising where it is set: the floor of any check
  that returns a flag. Only where the default checks (not OpenVINO's Gather-7).

Each is timed two ways, in shuffled rounds of all of them: *blocked* (every call
waits for its result, as a benchmark of one op does) and *pipelined*
(:data:`PIPELINE` calls, then one wait, as a training loop runs). A ``lax-checked``
call blocked waits for its result, then reads the previous call's flag; pipelined, it
reads the previous call's flag, then dispatches. The default's time over
``lax-checked``'s has a limit, :data:`LAX_CHECKED_LIMIT`. The host
time of a call, without any wait for the result, is also timed: for
``default`` it is the dispatch (the program queued, the flag's copy started,
earlier flags that are ready read); ``sync`` adds the flag's read, which waits
for the program. First calls (trace, compile, run) are timed :data:`FIRST_CALLS`
times each, after one call of each system at other shapes, each time after
``jax.clear_caches()``, in an order rotated each time (``stats.first_calls``); the
median is kept.

``pieces`` times, on the same device, what a deferred check's host time is made
of, with a tiny gather: a call with one output and with a flag beside it, a flag's
copy to the host started, ``is_ready``, a flag's read with and without that copy,
and a read of :data:`xgather._checked.READ_GROUP` flags together, per call.
"""

from __future__ import annotations

import gc
import time

from . import stats, systems
from .crowding import save  # noqa: F401 - the side commands' JSON writer (__main__._report)
from .workloads import WORKLOADS, default_keys, default_size

SCHEMA = "xgather-bench-check/1"
#: Calls per pipelined sample before the one wait.
PIPELINE = 10
MODES = ("promise", "default", "sync")
#: The hand-written check (``systems.LAX_CHECKED``), beside the modes where the default checks.
LAX_CHECKED = systems.LAX_CHECKED
#: The most the default may take over ``lax-checked``, blocked and pipelined.
LAX_CHECKED_LIMIT = 1.10
#: First calls timed per mode and workload, each after JAX's caches are emptied.
FIRST_CALLS = 3


def _functions(w, d, i, extra, lax_checked: bool = False):
    """``{mode: f}``: the workload's jitted function in each mode, called as ``f()``.
    OpenVINO's Gather defines an out-of-range index (zeros): no check to read there.
    ``lax_checked``: :data:`LAX_CHECKED` too, where the default checks: ``f()`` a pipelined
    call (the previous flag read, then the dispatch), ``f.blocked()`` a blocked one,
    ``f.finish()`` the last flag's read (``systems.LaxCheckedRunner``)."""
    import jax

    import xgather
    fns = {}
    for mode in MODES:
        if mode == "promise":
            f = jax.jit(systems._xgather_fn(w, "promise_in_bounds", negative_indices=False))
        else:
            f = jax.jit(systems._xgather_fn(w, None))
            if systems.checks(w, None):
                f = xgather.checked(f, sync=mode == "sync")
        fns[mode] = (lambda f=f: f(d, i, *extra))
    if lax_checked and (runner := systems.lax_checked_runner(w, d, i, extra)) is not None:
        def call(runner=runner):
            return runner.call()
        call.blocked, call.finish = runner, runner.finish
        fns[LAX_CHECKED] = call
    return fns


def _inputs(w, data, idx, device):
    import jax
    d, i = systems.jax_inputs(data, idx, device)
    extra = () if w.step is None else (
        jax.device_put(systems.steps.weights(w, data, idx), device),)
    return d, i, extra


def _timers(fns):
    """``{system: runner}``: each mode blocked, pipelined, and its host time alone."""
    import jax
    out = {}
    for mode, f in fns.items():
        out[f"{mode} blocked"] = getattr(f, "blocked", None) or (
            lambda f=f: jax.block_until_ready(f()))

        def pipelined(f=f):
            for _ in range(PIPELINE - 1):
                f()
            return jax.block_until_ready(f())
        out[f"{mode} pipelined"] = pipelined
    return out


def _host_times(fns, calls: int) -> dict[str, float]:
    """Median host seconds of one call returning (no wait for its result), per mode,
    over ``calls`` calls in rounds of :data:`PIPELINE`, each round then waited for."""
    import jax
    times: dict[str, list[float]] = {m: [] for m in fns}
    for _ in range(max(1, calls // PIPELINE)):
        for mode, f in fns.items():
            out = None
            for _ in range(PIPELINE):
                t0 = time.perf_counter()
                out = f()
                times[mode].append(time.perf_counter() - t0)
            jax.block_until_ready(out)
    return {m: stats.median(v) for m, v in times.items()}


def _median_us(f, prep=None, n: int = 100) -> float:
    """Median host µs of ``f(prep())`` (``f()`` without ``prep``), the first calls left out."""
    times = []
    for _ in range(n):
        x = prep() if prep else None
        t0 = time.perf_counter()
        f(x) if prep else f()
        times.append(time.perf_counter() - t0)
    return stats.median(times[5:]) * 1e6


def pieces(device) -> dict[str, float]:
    """Host µs of the pieces a deferred check's call is made of, on ``device``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import xgather
    from xgather import _checked
    d = jax.device_put(np.arange(64 * 16, dtype=np.float32).reshape(64, 16), device)
    i = jax.device_put(np.arange(8, dtype=np.int32), device)

    def gather(d, i):
        return xgather.onnx.gather(d, i, mode="promise_in_bounds", negative_indices=False)
    one = jax.jit(gather)
    two = jax.jit(lambda d, i: (gather(d, i), jnp.stack([jnp.any(i > 63).astype(i.dtype), i[0]])))

    def flag():  # a flag its program has finished
        return jax.block_until_ready(two(d, i)[1])

    def copied():  # a finished flag whose copy to the host has had time to finish
        f = flag()
        f.copy_to_host_async()
        time.sleep(0.0005)
        return f
    calls = [_checked._Pending(flag(), [], "pieces", n) for n in range(_checked.READ_GROUP)]

    def read_group():  # as checked reads a full group: stacked, copied, read
        group = _checked._Group(calls[0], None)
        group.calls[1:] = calls[1:]
        group.close()
        group.failed()
    for f in (one, two):
        jax.block_until_ready(f(d, i))
    read_group()
    host = _host_times({"call, one output": lambda: one(d, i),
                        "call, a flag beside": lambda: two(d, i)}, 100)
    return {**{k: v * 1e6 for k, v in host.items()},
            "flag.copy_to_host_async()": _median_us(lambda f: f.copy_to_host_async(), flag),
            "flag.is_ready()": _median_us(lambda f: f.is_ready(), flag),
            "read a copied flag": _median_us(np.asarray, copied),
            "read a flag, no copy first": _median_us(np.asarray, flag),
            "read a group, per call": _median_us(read_group) / _checked.READ_GROUP}


def run(keys=None, size: str | None = None, device=None, timing=None, progress=print) -> dict:
    import jax
    device = device or jax.devices()[0]
    size = size or default_size(device.platform)
    keys = keys or default_keys(device.platform)
    timing = timing or {"sample_s": 0.02, "budget_s": 2.0, "least": 15, "most": 100}
    results = []
    for n, key in enumerate(keys, 1):
        w = WORKLOADS[key]
        t_start = time.perf_counter()
        warm = _functions(w, *_inputs(w, *w.warmup_arrays(size), device), lax_checked=True)
        for f in warm.values():
            jax.block_until_ready(f())
        data, idx = w.arrays(size)
        fns = _functions(w, *_inputs(w, data, idx, device), lax_checked=True)
        if LAX_CHECKED in fns:
            _same_result(key, fns[LAX_CHECKED](), fns["promise"]())
        first_samples = stats.first_calls(
            {mode: (lambda f=f: jax.block_until_ready(f())) for mode, f in fns.items()},
            set(fns), FIRST_CALLS, jax.clear_caches, lambda mode: gc.collect())
        first = {k: stats.median(v) for k, v in first_samples.items()}
        timers = _timers(fns)
        reps = stats.common_reps(timers, "promise blocked", timing["sample_s"])
        for name in timers:
            if name.endswith("pipelined"):  # a pipelined call is PIPELINE calls
                reps[name] = max(1, reps[name] // PIPELINE)
        samples = stats.timed_rounds(timers, reps, timing["least"], timing["budget_s"],
                                     timing["most"])
        host = _host_times(fns, 20 * PIPELINE)
        for f in fns.values():  # the last flag left unread: a bad index raises here
            getattr(f, "finish", lambda: None)()
        per_call = {k: [s / (PIPELINE if k.endswith("pipelined") else 1) for s in v]
                    for k, v in samples.items()}
        row = {"workload": key, "title": w.title, "step": w.step,
               "shapes": {"data": list(data.shape), "indices": list(idx.shape)},
               "checked": w.op != "openvino.gather7",
               "median_s": {k: stats.median(v) for k, v in per_call.items()},
               "samples_s": per_call, "rounds": len(samples["promise blocked"]),
               "first_call_s": first, "first_call_samples_s": first_samples,
               "host_call_s": host,
               # sync's call: the same dispatch, then the flag's read (waiting for it)
               "host_split_s": {"dispatch": host["default"],
                                "flag_read": max(0.0, host["sync"] - host["default"])}}
        for shape in ("blocked", "pipelined"):
            for mode in ("default", "sync"):
                row[f"{mode}/promise {shape}"] = stats.paired_ratio(
                    samples[f"{mode} {shape}"], samples[f"promise {shape}"])
            if LAX_CHECKED in fns:
                row[f"default/{LAX_CHECKED} {shape}"] = stats.paired_ratio(
                    samples[f"default {shape}"], samples[f"{LAX_CHECKED} {shape}"])
                row[f"{LAX_CHECKED}/promise {shape}"] = stats.paired_ratio(
                    samples[f"{LAX_CHECKED} {shape}"], samples[f"promise {shape}"])
        row["first_call_ratio"] = first["default"] / first["promise"]
        results.append(row)
        del fns, timers, warm
        progress(f"[{n}/{len(keys)}] {key} {w.title}: {row['rounds']} rounds, "
                 f"{time.perf_counter() - t_start:.1f} s")
    return {"size": size, "pipeline": PIPELINE, "rounds": timing,
            "lax_checked_limit": LAX_CHECKED_LIMIT, "results": results,
            "pieces_us": pieces(device)}


def _same_result(key: str, got, want) -> None:
    """``lax-checked``'s result equals promise's (to float32 rounding), or no timing."""
    import jax
    import numpy as np
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"{key}: {LAX_CHECKED} computes another result than xgather's "
                               "promise: no timing")


def table(record: dict) -> str:
    """The check's cost per workload: default (deferred) and sync over promise, blocked
    and pipelined; a first call over promise's; a call's host time per mode."""
    lines = [f"the check's cost: {record['device'].get('kind', record['device'])}, size "
             f"{record['size']}, pipelined = {record['pipeline']} calls then one wait; "
             "ratios are medians of per-round ratios to promise",
             f"{'workload':<30} {'promise us':>10} {'def/pr blk':>10} {'def/pr pip':>10} "
             f"{'sync blk':>8} {'sync pip':>8} {'1st call':>8} {'host us: pr':>11} "
             f"{'def':>6} {'sync':>6} {'dispatch':>8} {'read':>6}"]
    for r in record["results"]:
        us = r["median_s"]["promise blocked"] * 1e6
        host = r["host_call_s"]
        lines.append(
            f"{r['workload'] + ' ' + r['title']:<30.30} {us:10.1f} "
            f"{r['default/promise blocked']:10.2f} {r['default/promise pipelined']:10.2f} "
            f"{r['sync/promise blocked']:8.2f} {r['sync/promise pipelined']:8.2f} "
            f"{r['first_call_ratio']:8.2f} {host['promise'] * 1e6:11.1f} "
            f"{host['default'] * 1e6:6.1f} {host['sync'] * 1e6:6.1f} "
            f"{r['host_split_s']['dispatch'] * 1e6:8.1f} "
            f"{r['host_split_s']['flag_read'] * 1e6:6.1f}")
    lines.append("host us: a call's time until it returns, no wait for its result (sync's "
                 "includes the flag's read, which waits for the program); dispatch: the "
                 "deferred default's; read: sync's over that")
    lines += lax_checked_lines(record)
    if "pieces_us" in record:
        lines.append("a deferred call's pieces, host us (a tiny gather): " + "; ".join(
            f"{k} {v:.1f}" for k, v in record["pieces_us"].items()))
    return "\n".join(lines)



def lax_checked_lines(record: dict) -> list[str]:
    """The default over ``lax-checked`` per workload that has it, blocked and pipelined,
    each marked ``over`` past :data:`LAX_CHECKED_LIMIT`; none for a record without it."""
    rows = [r for r in record["results"] if f"default/{LAX_CHECKED} blocked" in r]
    if not rows:
        return []
    limit = record.get("lax_checked_limit", LAX_CHECKED_LIMIT)
    lines = [f"the default over {LAX_CHECKED} (jax.jit of the lax gather and jnp.any of the "
             "spec's out-of-range test, its flag read at the next call), limit "
             f"{limit:.2f}; {LAX_CHECKED} over promise beside it",
             f"{'workload':<30} {'def/' + LAX_CHECKED + ' blk':>20} {'':4} "
             f"{'def/' + LAX_CHECKED + ' pip':>20} {'':4} {'lax-chk/pr blk':>14} "
             f"{'lax-chk/pr pip':>14}"]
    for r in rows:
        cells = ""
        for shape in ("blocked", "pipelined"):
            ratio = r[f"default/{LAX_CHECKED} {shape}"]
            mark = "over" if ratio > limit else ""
            cells += f" {ratio:20.2f} {mark:<4}"
        lines.append(f"{r['workload'] + ' ' + r['title']:<30.30}{cells} "
                     f"{r[f'{LAX_CHECKED}/promise blocked']:14.2f} "
                     f"{r[f'{LAX_CHECKED}/promise pipelined']:14.2f}")
    return lines
