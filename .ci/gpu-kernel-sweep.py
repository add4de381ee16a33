"""The Pallas row kernel's block sizes and warps against lax.gather and the copy roof, on
the GPU sizes of the row workloads (issue 13, point 5). Usage:
``python .ci/gpu-kernel-sweep.py OUT_DIR``; writes ``OUT_DIR/kernel-sweep.txt``.

Each line: the median time of 15 interleaved rounds, and GB/s of the bytes the gather
must move (output read and written once, indices read), as a share of ``x + 1``'s on
the same device (the bench's JAX copy roof).
"""

import functools
import os
import pathlib
import sys

import jax
import numpy as np

import xgather
from xgather import _kernel
from xgather_bench import roof, stats, systems
from xgather_bench.workloads import WORKLOADS

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
SIZE = os.environ.get("SWEEP_SIZE", "gpu")  # "tiny" tries the script on a CPU
INTERPRET = jax.default_backend() != "gpu"
device = jax.devices()[0]
nbytes = 1 << 30 if SIZE == "gpu" else 1 << 20
copy = roof.jax_copy_gbps(device, nbytes)
lines = [f"jax {jax.__version__}, {device.device_kind}; x + 1 over {nbytes >> 20} MiB: "
         f"{copy:.0f} GB/s"]
TUNINGS = [(4096, 1024, 4), (2048, 1024, 4), (8192, 1024, 8), (16384, 1024, 8),
           (4096, 128, 4), (1024, 1024, 4), (32768, 1024, 16)]
PROMISE = {"mode": "promise_in_bounds", "negative_indices": False}


def sweep(key):
    """The lines of one workload: lax.gather and every tuning, timed interleaved."""
    w = WORKLOADS[key]
    data, idx = w.arrays(SIZE)
    if SIZE != "gpu":  # rows the kernel takes
        data = np.resize(data, data.shape[:-1] + (64,))
    d, i = systems.jax_inputs(data, idx, device)
    op, attrs, options = systems.xgather_op(w)
    plan = xgather.explain(op, data, idx, *attrs, **options, **PROMISE)
    view = _kernel.rows_view(plan)
    assert isinstance(view, _kernel.Rows), (key, view)
    fns = {"lax.gather": jax.jit(systems.lax_fn(w))}
    for t in TUNINGS:
        fns[f"pallas {t}"] = jax.jit(functools.partial(
            _kernel.row_gather, plan, view, "promise_in_bounds", None,
            interpret=INTERPRET, tuning=t))
    want = np.asarray(fns["lax.gather"](d, i))
    out, runners = [], {}
    for name, f in fns.items():
        try:
            got = np.asarray(f(d, i))
        except Exception as e:  # a tuning Triton rejects: say so, go on
            out.append(f"{key} {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if not np.array_equal(got, want):
            out.append(f"{key} {name}: WRONG RESULT")
            continue
        runners[name] = functools.partial(lambda f: jax.block_until_ready(f(d, i)), f)
    reps = stats.common_reps(runners, "lax.gather", 0.02)
    times = stats.interleaved(runners, 15 if SIZE == "gpu" else 2, reps)
    moved = 2 * want.size * want.itemsize + i.size * np.dtype(i.dtype).itemsize
    for name, ts in times.items():
        t = stats.median(ts)
        out.append(f"{key} {name}: {t * 1e6:9.1f} us  {moved / t / 1e9:7.0f} GB/s  "
                   f"{moved / t / 1e9 / copy:5.0%} of the copy")
    return out


for key in ("W1", "W2", "W5", "W6"):
    lines += sweep(key)
(out / "kernel-sweep.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
