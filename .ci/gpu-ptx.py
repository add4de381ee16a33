"""Which loads XLA's GPU gathers compile to: the PTX of W1's gather at the GPU
size, as ``lax.gather`` and as xgather's checked default, summarised per kernel.

A row gather near the copy roof reads with 16-byte vector loads (``ld.global.v4``);
scalar loads would explain a shortfall. Usage: ``python .ci/gpu-ptx.py OUT_DIR``.
"""

import collections
import os
import pathlib
import re
import sys
import tempfile

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
dump = tempfile.mkdtemp(prefix="xla-dump-")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()

import jax  # noqa: E402  (after XLA_FLAGS)

import xgather  # noqa: E402
from xgather_bench import systems  # noqa: E402
from xgather_bench.workloads import WORKLOADS  # noqa: E402

w = WORKLOADS["W1"]
data, idx = w.arrays("gpu")
d, i = systems.jax_inputs(data, idx, jax.devices()[0])
jax.block_until_ready(jax.jit(systems.lax_fn(w))(d, i))
jax.block_until_ready(xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather(d, i, 0)))(d, i))

load = re.compile(r"\bld\.global(?:\.nc)?(?:\.[a-z]+)*?(\.v[248])?\.(?:[fbsu]\d+)")
lines = [f"jax {jax.__version__}, {jax.devices()[0].device_kind}, W1 at the GPU size: "
         f"data {data.shape} {data.dtype}, indices {idx.shape}"]
for ptx in sorted(pathlib.Path(dump).glob("*.ptx")):
    text = ptx.read_text()
    for entry in re.split(r"\.entry\s+", text)[1:]:
        name = entry.split("(", 1)[0].strip()
        counts = collections.Counter(m.group(1) or "scalar" for m in load.finditer(entry))
        if counts:
            lines.append(f"{ptx.name}: {name}: global loads {dict(counts)}")
(out / "ptx.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
