"""The annotations are part of the API (xgather ships py.typed): mypy on xgather itself,
and on a user's code, where the ops keep their signatures through their decorators."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the test and dev extras")
ROOT = Path(__file__).resolve().parents[1]

USER = """
import numpy as np
import xgather

data = np.zeros((3, 4), np.float32)
ok = xgather.onnx.gather(data, [[0, -1]], axis=0)          # lists are indices too
ok2 = xgather.openvino.gather(data, np.array([7]), 0, version=8, mode="fill")
bad_mode = xgather.onnx.gather_nd(data, [[0, 1]], mode="clamp")
bad_kw = xgather.labview.gather(data, [0], lda=0.5)
as_int: int = xgather.bnns.gather_nd(data, [[0]])
"""


@pytest.mark.subprocess
def test_mypy_passes_and_checks_calls_into_the_ops(tmp_path):
    user = tmp_path / "user.py"
    user.write_text(USER)
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                          "--cache-dir", str(tmp_path / "cache"), "xgather", str(user)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    errors = [ln for ln in run.stdout.splitlines() if ": error:" in ln]
    assert all(ln.startswith(str(user)) for ln in errors), run.stdout  # xgather: none
    lines = {int(ln.split(":")[1]) for ln in errors}
    source = USER.splitlines()
    flagged = {source[n - 1].split(" =")[0].split(":")[0] for n in lines}
    assert flagged == {"bad_mode", "bad_kw", "as_int"}, run.stdout
