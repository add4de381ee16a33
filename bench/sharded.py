"""Sharded lookup on N host devices: xgather.sharded vs XLA's partitioner default.

Run as ``xgather-bench sharded [--devices 8]``; the device count is set before
JAX starts (``--xla_force_host_platform_device_count``), so this runs in its
own process.
"""

from __future__ import annotations

import re

import numpy as np

from . import stats

_BYTES = {"f32": 4, "s32": 4, "f16": 2, "bf16": 2, "s64": 8, "f64": 8, "pred": 1, "u32": 4}


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes each kind of collective produces per device, from a compiled HLO module."""
    out: dict[str, int] = {}
    pat = (r"= \(?(\w+)\[([\d,]*)\]\S* (all-gather|all-reduce|reduce-scatter|all-to-all|"
           r"collective-permute)(?:-start)?\(")
    for dtype, dims, kind in re.findall(pat, hlo):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        out[kind] = out.get(kind, 0) + n * _BYTES.get(dtype, 4)
    return out


def run(n_devices: int, rows: int = 65536, width: int = 256, lookups: int = 16384,
        repeats: int = 15) -> str:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import xgather
    assert jax.device_count() >= n_devices, jax.device_count()
    mesh = jax.make_mesh((n_devices,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    data = jax.device_put(rng.standard_normal((rows, width), dtype=np.float32),
                          NamedSharding(mesh, P("x")))
    idx = jax.device_put(rng.integers(0, rows, lookups).astype(np.int32),
                         NamedSharding(mesh, P("x")))
    out_sharding = NamedSharding(mesh, P("x"))
    systems = {
        "xgather.sharded": jax.jit(lambda d, i: xgather.sharded.gather(
            d, i, mesh, "x", "x", mode="promise_in_bounds")),
        "partitioner (xgather.onnx)": jax.jit(
            lambda d, i: xgather.onnx.gather(d, i, mode="promise_in_bounds"),
            out_shardings=out_sharding),
        "partitioner (jnp.take)": jax.jit(lambda d, i: d[i], out_shardings=out_sharding),
    }
    want = np.asarray(data)[np.asarray(idx)]
    lines = [f"sharded lookup: table ({rows}, {width}) f32 split over {n_devices} devices "
             f"({rows * width * 4 / n_devices / 2**20:.1f} MiB each), {lookups} lookups",
             f"{'system':<28} {'median ms':>9} {'spread':>7} {'peak MiB/dev':>12} "
             f"{'collective MiB/dev':>18}  collectives"]
    fns, info = {}, {}
    for name, f in systems.items():
        compiled = f.lower(data, idx).compile()
        np.testing.assert_array_equal(np.asarray(compiled(data, idx)), want)
        mem = compiled.memory_analysis()
        peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                - mem.alias_size_in_bytes) if mem is not None else float("nan")
        coll = collective_bytes(compiled.as_text())
        info[name] = (peak, coll)
        fns[name] = lambda c=compiled: jax.block_until_ready(c(data, idx))
    reps = stats.common_reps(fns, "xgather.sharded", 0.05)
    samples = stats.interleaved(fns, repeats, reps)
    for name in systems:
        peak, coll = info[name]
        lines.append(f"{name:<28} {stats.median(samples[name]) * 1e3:9.3f} "
                     f"{100 * stats.spread(samples[name]):6.1f}% {peak / 2**20:12.1f} "
                     f"{sum(coll.values()) / 2**20:18.2f}  "
                     + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in coll.items()))
    return "\n".join(lines)
