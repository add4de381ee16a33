"""Sharded gathers on 8 fake CPU devices, in a fresh process (the flag must precede JAX)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.subprocess
def test_on_eight_devices():
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                                       " --xla_force_host_platform_device_count=8").strip()}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-W", "error", "-W", "ignore:os.fork:RuntimeWarning",
         str(ROOT / "tests" / "multidevice")], capture_output=True, text=True, env=env,
        timeout=900, cwd=ROOT)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail
