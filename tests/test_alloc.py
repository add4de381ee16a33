"""The bench's keep_large_allocations (bench/_alloc.py): page faults per call of a gather
whose output is over 64 MiB.

Each case runs in a fresh interpreter, since the malloc settings are process-wide
and only reach threads that have not yet allocated. The measure is the kernel's
minor-fault count (getrusage, median over calls), not time: a 100 MiB output that is mapped afresh
faults once per 4 KiB page (25,600), one that is reused faults not at all.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None
                       or os.confstr("CS_GNU_LIBC_VERSION") is None,
                       reason="mallopt and getrusage minor faults are glibc/Linux facts"),
]

PAGES = 50_000 * 512 * 4 // 4096  # the (50000, 512) float32 gradient, in pages

SCRIPT = r"""
import json, resource, sys, warnings
import numpy as np
warnings.simplefilter("always")
import jax
import xgather
from xgather_bench import _alloc as alloc
mode = sys.argv[1]
caught = []
with warnings.catch_warnings(record=True) as caught:
    if mode == "late":  # after XLA's worker threads have allocated (each has its own arena)
        for _ in range(4):
            jax.jit(lambda t: t * 2)(np.ones((50_000, 512), np.float32)).block_until_ready()
    kept = alloc.keep_large_allocations() if mode != "default" else None
rng = np.random.default_rng(0)
table = jax.device_put(rng.standard_normal((50_000, 512), dtype=np.float32))
idx = jax.device_put(rng.integers(0, 50_000, 64).astype(np.int32))
grad = jax.jit(jax.grad(lambda t: (xgather.onnx.gather(t, idx, 0, mode="promise_in_bounds")
                                   ** 2).sum()))
expect = np.zeros((50_000, 512), np.float32)
np.add.at(expect, np.asarray(idx), 2 * np.asarray(table)[np.asarray(idx)])
out = grad(table)
assert np.array_equal(np.asarray(out), expect)
del out
for _ in range(5):
    grad(table).block_until_ready()
faults = []  # per call; the kept heap still grows now and then, so the median
for _ in range(15):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    grad(table).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults = float(np.median(faults))
print(json.dumps({"kept": kept, "faults": faults,
                  "warnings": [str(w.message) for w in caught]}))
"""


def _run(mode: str) -> dict:
    # XLA:CPU's buffers (the subject here) also where the suite runs on a GPU.
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "",
                                            "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_default_process_faults_every_page_of_a_large_output():
    # The condition the opt-in exists for; if glibc stops doing this, the fix is moot.
    got = _run("default")
    assert got["faults"] >= 0.9 * PAGES, got


def test_kept_before_first_computation_reuses_large_outputs():
    got = _run("first")
    assert got["kept"] is True and got["warnings"] == [], got
    assert got["faults"] < 0.02 * PAGES, got


def test_kept_after_backends_started_warns_and_says_why():
    got = _run("late")
    assert got["kept"] is True, got
    assert any("after JAX started its backends" in w and "64 MiB" in w
               for w in got["warnings"]), got
    assert got["faults"] >= 0.9 * PAGES, got
