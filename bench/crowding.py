"""What another library in the same rounds does to a checked gather, and whose part it is.

Run as ``xgather-bench crowding``. W1's lookup (8192 rows of a 50000 x 512 float32
table) runs in shuffled rounds beside one peer library at a time (each of its
thread counts), and once with no peer. Four JAX programs share the rounds:

- ``xgather``: the spec's default, checked (``xgather.checked``);
- ``xgather[promise]``: no check, the reference of every ratio;
- ``lax``: the gather written with ``lax.gather``;
- ``flag + gather``: no xgather code, the least a program that checks does: the
  same gather (negative indices wrapped) and ``jnp.any`` over the same bound test
  beside it, both returned.

A ratio is the median over rounds of the ratio within a round (:func:`stats.paired_ratio`).
Where ``xgather`` and ``flag + gather`` move together, the cost of crowding belongs
to a program that computes a flag beside its gather, not to xgather's form of it.
"""

from __future__ import annotations

import json

import numpy as np

from . import stats, systems
from .workloads import WORKLOADS

SCHEMA = "xgather-bench-crowding/1"
WORKLOAD = "W1"
REFERENCE = "xgather[promise]"
PLAIN = "flag + gather"
JAX_SYSTEMS = ("xgather", REFERENCE, "lax", PLAIN)
PEERS = ("numpy", "onnxruntime", "openvino", "torch")


def plain_runner(d, i):
    """The same gather, negative rows wrapped, and ``jnp.any`` over the spec's bound test."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def f(d, i):
        n = d.shape[0]
        rows = jnp.where(i < 0, i + n, i)
        return jnp.any((i < -n) | (i >= n)), d.at[rows].get(mode="promise_in_bounds")
    return lambda: jax.block_until_ready(f(d, i))


def run(rounds: int, peers: tuple[str, ...] | None = None, size: str = "default") -> dict:
    """``{"rows": [{"peer", "ratios": {system: ratio to promise}, "spreads": ...}]}``:
    one row per peer library installed (and ``None``: no peer), in that order."""
    import jax
    w = WORKLOADS[WORKLOAD]
    data, idx = w.arrays(size)
    device = jax.devices()[0]
    installed = {"numpy": True, **systems.available()}
    chosen = [None, *[p for p in (peers or PEERS) if installed.get(p)]]
    d, i = systems.jax_inputs(data, idx, device)
    rows = []
    for peer in chosen:
        fns = systems.build(w, data, idx, device, installed, {"xgather", "lax", peer} - {None})
        fns[PLAIN] = plain_runner(d, i)
        flag, out = fns[PLAIN]()
        if bool(flag) or not np.array_equal(np.asarray(out), data[idx]):
            raise RuntimeError(f"{PLAIN} gathers other rows than data[indices]: no timing")
        for fn in fns.values():
            fn()
            fn()
        reps = stats.common_reps(fns, "lax", 0.03)
        samples = stats.interleaved(fns, rounds, reps)
        ref = samples[REFERENCE]
        rows.append({"peer": peer, "systems": sorted(fns), "reps": reps,
                     "ratios": {k: stats.paired_ratio(samples[k], ref) for k in JAX_SYSTEMS},
                     "spreads": {k: stats.paired_spread(samples[k], ref) for k in JAX_SYSTEMS},
                     "samples_s": samples})
    return {"workload": WORKLOAD, "shapes": {"data": list(data.shape),
                                             "indices": list(idx.shape)},
            "rounds": rounds, "rows": rows}


def table(record: dict) -> str:
    cols = [k for k in JAX_SYSTEMS if k != REFERENCE]
    lines = [f"{record['workload']} in shuffled rounds beside one peer library, "
             f"{record['rounds']} rounds; ratio to {REFERENCE} (spread)",
             f"{'peer in the rounds':<20}" + "".join(f"{c:>20}" for c in cols)]
    for row in record["rows"]:
        cells = "".join(f"{row['ratios'][c]:>12.2f} ({100 * row['spreads'][c]:3.0f}%)"
                        for c in cols)
        lines.append(f"{row['peer'] or '(none)':<20}{cells}")
    return "\n".join(lines)


def save(record: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
