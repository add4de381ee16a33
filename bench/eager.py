"""Eager calls: every op called directly on device data, against ``jnp.take``.

Run as ``xgather-bench eager``. Each op of the library is called as a user
calls it outside ``jit``: on a device array at W8's shapes (a (100, 16) float32
table, 10 int32 lookups, as device or NumPy arrays), after its first call, so
that every call takes the cached path (one lookup, one jitted call). Both modes
are timed: the spec's default and ``promise_in_bounds``; the reference is an
eager ``jnp.take(data, indices, axis=0)`` on the same kind of indices. The
targets (device indices): promise and the default within 1.5x of ``jnp.take``; NumPy
indices have none. Attributes go by keyword (``axis=0``), as users write them.

Beside them, ``jnp.take`` checked by hand (:func:`hand_checked`): one jitted program
returns ``jnp.take`` and ``jnp.any`` of its indices' range test, and the call reads that
flag before it returns, as an eager call that raises at the call must. It is what any
such call costs with no library code around it.

Every system's samples come from the same shuffled rounds (:func:`stats.interleaved`),
and a ratio is the median over rounds of the ratio within a round.
"""

from __future__ import annotations

import json

import numpy as np

from . import stats

SCHEMA = "xgather-bench-eager/1"

ROWS, WIDTH, LOOKUPS = 100, 16, 10  # W8's shapes
BASELINE = "jnp.take"
# The eager-call targets, over BASELINE.
LIMITS = {"promise_in_bounds": 1.5, "default": 1.5}


def ops():
    """``{name: (op, indices kind, attributes by keyword)}``: every frontend op, called as
    users write it (``axis=0``).

    Indices kinds: ``"rows"`` (10,) row numbers; ``"vectors"`` (10, 1) GatherND
    lookup vectors; ``"elements"`` (10, 16) element indices along axis 0.
    """
    import xgather
    return {
        "onnx.gather": (xgather.onnx.gather, "rows", {"axis": 0}),
        "onnx.gather_nd": (xgather.onnx.gather_nd, "vectors", {}),
        "onnx.gather_elements": (xgather.onnx.gather_elements, "elements", {"axis": 0}),
        "openvino.gather": (xgather.openvino.gather, "rows", {"axis": 0}),
        "openvino.gather_nd": (xgather.openvino.gather_nd, "vectors", {}),
        "openvino.gather_elements": (xgather.openvino.gather_elements, "elements", {"axis": 0}),
        "bnns.gather": (xgather.bnns.gather, "rows", {"axis": 0}),
        "bnns.gather_nd": (xgather.bnns.gather_nd, "vectors", {}),
        "bnns.gather_along_axis": (xgather.bnns.gather_along_axis, "elements", {"axis": 0}),
        "labview.gather": (xgather.labview.gather, "rows", {"axis": 0}),
    }


def inputs(seed: int = 0):
    """NumPy data, indices of each kind, and what each kind gathers (the reference)."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((ROWS, WIDTH), dtype=np.float32)
    rows = rng.integers(0, ROWS, LOOKUPS).astype(np.int32)
    elements = rng.integers(0, ROWS, (LOOKUPS, WIDTH)).astype(np.int32)
    idx = {"rows": rows, "vectors": rows[:, None], "elements": elements}
    want = {"rows": data[rows], "vectors": data[rows],
            "elements": np.take_along_axis(data, elements, axis=0)}
    return data, idx, want


HAND = "jnp.take checked by hand"


def hand_checked():
    """``(data, rows) -> jnp.take(data, rows, axis=0)``, raising
    :class:`systems.OutOfRangeFlag` where a row lies outside the ONNX range ``[-n, n-1]``:
    the flag computed beside the gather in one jitted program, and read at the call."""
    import jax
    import jax.numpy as jnp

    from .systems import OutOfRangeFlag

    @jax.jit
    def program(data, rows):
        n = data.shape[0]
        return jnp.any((rows < -n) | (rows >= n)), jnp.take(data, rows, axis=0)

    def call(data, rows):
        bad, out = program(data, rows)
        if np.asarray(bad):
            raise OutOfRangeFlag(f"{HAND}: a row outside [-{data.shape[0]}, "
                                 f"{data.shape[0] - 1}]")
        return out
    return call


def _timed(op, data, indices, kw):
    """``op(data, indices, **kw)``, waited for: one timed call."""
    import jax

    def fn():
        return jax.block_until_ready(op(data, indices, **kw))
    return fn


def run(repeats: int = 25, calls: int = 200) -> dict:
    """The eager calls' record: per op, mode and kind of indices, samples (seconds per
    call) and the paired ratio to :data:`BASELINE` on the same kind of indices.

    Indices are device arrays (the limits are for these) or NumPy arrays (no
    limit given; the table shows them beside). The data is a device array in both.
    """
    import jax
    import jax.numpy as jnp

    data, idx, want = inputs()
    d = jax.device_put(data)
    given = {"device": {k: jax.device_put(v) for k, v in idx.items()}, "numpy": idx}
    fns = {}
    for where, i in given.items():
        def take(i=i):
            return jax.block_until_ready(jnp.take(d, i["rows"], axis=0))
        np.testing.assert_array_equal(np.asarray(take()), want["rows"])
        fns[f"{BASELINE} [{where}]"] = take
        hand = _timed(hand_checked(), d, i["rows"], {})
        np.testing.assert_array_equal(np.asarray(hand()), want["rows"])
        fns[f"{HAND} [{where}]"] = hand
        for name, (op, kind, attrs) in ops().items():
            for mode in LIMITS:
                kw = {"mode": "promise_in_bounds"} if mode == "promise_in_bounds" else {}
                fn = _timed(op, d, i[kind], {**attrs, **kw})
                # the first call traces and compiles; the result is checked before timing
                np.testing.assert_array_equal(np.asarray(fn()), want[kind],
                                              err_msg=f"{name} {mode} {where}")
                fns[f"{name} [{mode}] [{where}]"] = fn
    samples = stats.interleaved(fns, repeats, dict.fromkeys(fns, calls))
    results, baselines, hand = [], {}, {}
    for where in given:
        base = samples[f"{BASELINE} [{where}]"]
        baselines[where] = {"system": f"{BASELINE}(data, rows, axis=0)", "samples_s": base,
                            "median_s": stats.median(base)}
        s = samples[f"{HAND} [{where}]"]
        hand[where] = {"system": HAND, "samples_s": s, "median_s": stats.median(s),
                       "ratio": stats.paired_ratio(s, base),
                       "spread": stats.paired_spread(s, base)}
        for name in ops():
            for mode, limit in LIMITS.items():
                s = samples[f"{name} [{mode}] [{where}]"]
                results.append({"op": name, "mode": mode, "indices": where, "samples_s": s,
                                "median_s": stats.median(s),
                                "ratio": stats.paired_ratio(s, base),
                                "spread": stats.paired_spread(s, base),
                                "limit": limit if where == "device" else None})
    return {"shapes": {"data": [ROWS, WIDTH], "rows": [LOOKUPS], "vectors": [LOOKUPS, 1],
                       "elements": [LOOKUPS, WIDTH]},
            "baseline": baselines, "hand_checked": hand, "rounds": repeats,
            "calls_per_sample": calls, "results": results}


def table(record: dict) -> str:
    """The record as text: per kind of indices and op, each mode's median and its ratio to
    the baseline on the same kind of indices."""
    lines = [f"eager calls: data {tuple(record['shapes']['data'])} float32 on the device, "
             f"{record['shapes']['rows'][0]} lookups, shapes cached; {record['rounds']} "
             f"shuffled rounds of {record['calls_per_sample']} calls"]
    for where, b in record["baseline"].items():
        lines += ["", f"{where} indices; baseline {b['system']}: {b['median_s'] * 1e6:.1f} us "
                      "a call",
                  f"{'op':<26} {'mode':<18} {'us/call':>8} {'/take':>6} {'spread':>7} "
                  f"{'limit':>6}"]
        h = record.get("hand_checked", {}).get(where)
        if h is not None:  # (records before it have none)
            lines.append(f"{HAND + ' (rows)':<45} {h['median_s'] * 1e6:8.1f} "
                         f"{h['ratio']:6.2f} {100 * h['spread']:6.1f}%")
        for r in record["results"]:
            if r["indices"] != where:
                continue
            limit = "" if r["limit"] is None else f"{r['limit']:6.1f}"
            over = "  over" if r["limit"] is not None and r["ratio"] > r["limit"] else ""
            lines.append(f"{r['op']:<26} {r['mode']:<18} {r['median_s'] * 1e6:8.1f} "
                         f"{r['ratio']:6.2f} {100 * r['spread']:6.1f}% {limit:>6}{over}")
    lines.append("/take: median over rounds of the call's time over jnp.take's on the same kind "
                 "of indices in the same round; limit: the eager-call target (device indices)")
    return "\n".join(lines)


def save(record: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
