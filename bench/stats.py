"""Statistics and timing loops (no JAX here: the systems bring their own sync)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable


def median(xs):
    return statistics.median(xs)


def spread(xs) -> float:
    """Relative interquartile range: (p75 - p25) / median."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    m = median(xs)
    return (q[2] - q[0]) / m if m else 0.0


def p90(xs) -> float:
    """The 90th percentile (inclusive): where a median hides a slow mode, this shows it."""
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def time_batch(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call over ``reps`` back-to-back calls (``fn`` must block until done)."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def first_calls(fns: dict[str, Callable[[], object]], cold: set[str], samples: int,
                clear: Callable[[], None], before: Callable[[str], None] | None = None
                ) -> dict[str, list[float]]:
    """Seconds of each system's first call: ``{name: samples}``.

    The systems in ``cold`` (JAX's) are timed ``samples`` times, each time right after
    ``clear()`` (JAX's caches emptied: the call traces, compiles and runs again), in an
    order rotated at each pass, so that no system is always the one that runs first, nor
    always the one that follows the others at the same shapes. The others (peers built
    beforehand) are timed once, in the first pass. ``before(name)`` runs before each
    timed call (a progress note, a garbage collection), outside the time. Then every
    system is called once more, untimed, so that each is left warm (compiled again where
    the caches were emptied).
    """
    names = list(fns)
    out: dict[str, list[float]] = {name: [] for name in names}
    for k in range(samples):
        turn = k % len(names) if names else 0
        for name in names[turn:] + names[:turn]:
            if k and name not in cold:
                continue
            if name in cold:
                clear()
            if before is not None:
                before(name)
            t0 = time.perf_counter()
            fns[name]()
            out[name].append(time.perf_counter() - t0)
    for fn in fns.values():
        fn()
    return out


def calibrate(fn: Callable[[], object], target_s: float = 0.02, max_reps: int = 4000,
              probe_s: float = 0.002) -> int:
    """Calls per sample so that one sample lasts about ``target_s``.

    A call's time is the median of 3 batches of back-to-back calls, each batch at least
    ``probe_s`` long, after a warm call: single calls right after another system ran
    read 2-3x slow, and set as few as a third of the calls (short samples spread more).
    """
    fn()
    n = 1
    while n < max_reps and time_batch(fn, n) * n < probe_s:
        n *= 4
    t = median([time_batch(fn, n) for _ in range(3)])
    return max(1, min(max_reps, int(target_s / max(t, 1e-9))))


def common_reps(fns: dict[str, Callable[[], object]], reference: str, target_s: float,
                max_sample_s: float = 0.25) -> dict[str, int]:
    """The same number of calls per sample for every system, set by ``reference``.

    Calls per sample change what a call costs (the first call after another
    system ran meets cold caches), so systems are compared at equal counts; only
    a system slower than ``max_sample_s`` a sample gets fewer.
    """
    n = calibrate(fns[reference], target_s)
    out = {}
    for name, fn in fns.items():
        t = median([time_batch(fn, 1) for _ in range(2)])
        out[name] = max(1, min(n, int(max_sample_s / max(t, 1e-7))))
    return out


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, reps: dict[str, int],
                on_round=None) -> dict[str, list[float]]:
    """``rounds`` rounds, each timing every system once, so noise hits them alike.

    The order is shuffled from round to round (seeded, so runs repeat): a system
    whose thread pool spins on after its call (onnxruntime, OpenMP) slows whoever
    runs next, and one that reads the same buffers leaves them in cache for
    whoever runs next; a fresh order spreads both over every system. A mere
    rotation would keep each system's predecessor the same.
    """
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    rng = random.Random(0)
    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            samples[name].append(time_batch(fns[name], reps[name]))
        if on_round:
            on_round(r + 1)
    return samples


def rounds_for(sample_s: float, least: int, budget_s: float, most: int) -> int:
    """Rounds whose samples of ``sample_s`` take about ``budget_s`` a system, within
    ``[least, most]`` (``least`` wins where they cross)."""
    return max(least, min(most, int(budget_s / max(sample_s, 1e-9))))


def timed_rounds(fns: dict[str, Callable[[], object]], reps: dict[str, int], least: int,
                 budget_s: float, most: int, warmup: int = 2,
                 on_round=None) -> dict[str, list[float]]:
    """``warmup`` untimed rounds, then shuffled rounds (:func:`interleaved`) as many as
    fit ``budget_s`` of samples a system (:func:`rounds_for`), set by the longest sample.

    Many short rounds, not a few long ones: the state of a shared machine drifts over
    tens of milliseconds, and a median over many rounds lands on the common mode where
    one over 15 lands on either (docs/benchmark.md).
    """
    warm = interleaved(fns, warmup, reps)
    longest = max(median(v) * reps[k] for k, v in warm.items())
    return interleaved(fns, rounds_for(longest, least, budget_s, most), reps, on_round)


def by_library(fns: dict[str, Callable[[], object]], reps: dict[str, int],
               library: Callable[[str], str], least: int,
               budget_s: float | Callable[[str], float], most: int, warmup: int = 2,
               on_block=None) -> dict[str, list[float]]:
    """Each library's systems in a block of their own: ``warmup`` untimed rounds, then
    interleaved rounds of that library's systems alone (:func:`timed_rounds`).

    No other library runs inside a block, so a system's figure does not depend on
    which others share the run: their threads spinning down, their freed memory and
    their cache footprint land in the untimed rounds. Inside a block the systems of
    one library (xgather's modes and ``lax``: one JAX runtime) share shuffled rounds,
    so that noise which drifts over the run hits them alike, as in the pair-alone
    rounds. ``library(name)`` names a system's library; ``budget_s`` may depend on
    it (a callable of the library's name). The blocks run in a seeded shuffled order.
    """
    groups: dict[str, list[str]] = {}
    for name in fns:
        groups.setdefault(library(name), []).append(name)
    order = list(groups)
    random.Random(0).shuffle(order)
    samples: dict[str, list[float]] = {}
    for n, lib in enumerate(order, 1):
        block = {k: fns[k] for k in groups[lib]}
        budget = budget_s(lib) if callable(budget_s) else budget_s
        samples.update(timed_rounds(block, reps, least, budget, most, warmup))
        if on_block:
            on_block(n, len(order))
    return {k: samples[k] for k in fns}


def paired_ratio(a, b) -> float:
    """Median over rounds of ``a[k] / b[k]``: samples of two systems from the same rounds.

    Noise that hits a round hits both systems in it, so the per-round ratio cancels
    it where the ratio of the two medians would not.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples need the same number of rounds: {len(a)}, {len(b)}")
    return median([x / y for x, y in zip(a, b, strict=True)])


def paired_spread(a, b) -> float:
    """Relative interquartile range of the per-round ratios ``a[k] / b[k]``."""
    return spread([x / y for x, y in zip(a, b, strict=True)])


def ratios_to_best(medians: dict[str, float]) -> dict[str, float]:
    best = min(medians.values())
    return {k: v / best for k, v in medians.items()}
