"""xgather.sharded.gather across two JAX processes on this machine.

Two Pythons (tests/distributed_worker.py) join one ``jax.distributed`` run on loopback, with
gloo as the CPU collectives and two CPU devices each: the table is sharded by rows over the
global mesh of all four devices, so every gather reads rows that the other process holds.
Each process reports its results (gathered from both, and per addressable shard) and the
errors it raised; they are compared here with NumPy.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # both processes together; they take a few seconds
GRACE_S = 30  # how long one may outlive the other (a failed process leaves it waiting)
LOCAL_DEVICES = 2
ROWS = 16  # over 4 devices: rows 0-7 on process 0, rows 8-15 on process 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    table = rng.standard_normal((ROWS, 3)).astype(np.float32)
    # Values a float sum over devices would not return as they were.
    table[2, 0], table[9, 1], table[13, 2] = -0.0, np.float32(1e-45), np.inf
    table[11] = np.array([0x7FC00001, 0xFFC12345, 0x7F800001], np.uint32).view(np.float32)
    good = np.array([[0, 15], [-16, 9], [11, -1], [2, 13], [8, 7], [-5, 11], [3, -8], [12, 4]],
                    np.int32)  # (8, 2): two rows of indices per device when sharded
    bad = good.copy()
    bad[6, 1] = 16  # on process 1's devices (rows 4-7 of the indices) ...
    bad[1, 0] = -17  # ... and the first one, on process 0's
    bad[7, 0] = -40
    return {"table": table, "good": good, "bad": bad}


def run_two_processes(tmp_path: Path, kind: str) -> list[dict]:
    """Start both workers, wait for both (killing both on a timeout, and the survivor once
    the other has failed), and return what each wrote."""
    given = tmp_path / "inputs.npz"
    np.savez(given, **inputs())
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                         f" --xla_force_host_platform_device_count={LOCAL_DEVICES}").strip()}
    port = free_port()
    procs, logs = [], []
    start, first_exit, why = time.monotonic(), None, ""
    try:
        for k in range(2):
            logs.append(open(tmp_path / f"output{k}.txt", "w+"))  # closed below
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.distributed_worker", str(given),
                 str(tmp_path / f"out{k}.json"), str(k), str(port), kind],
                cwd=ROOT, env=env, stdout=logs[k], stderr=subprocess.STDOUT))
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if first_exit is None and any(p.poll() is not None for p in procs):
                first_exit = now
            if now - start > TIMEOUT_S:
                why = f"timed out after {TIMEOUT_S} s"
                break
            if first_exit is not None and now - first_exit > GRACE_S:
                why = f"one process still running {GRACE_S} s after the other exited"
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        tails = []
        for k, log in enumerate(logs):
            log.seek(0)
            rc = procs[k].returncode if k < len(procs) else "not started"
            tails.append(f"--- process {k} (rc={rc}), output tail:\n"
                         f"{log.read()[-3000:]}")
            log.close()
    report = "\n".join([why, *tails])
    assert not why and all(p.returncode == 0 for p in procs), report
    return [json.loads((tmp_path / f"out{k}.json").read_text()) for k in range(2)]


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def bound_error(idx: np.ndarray) -> str:
    """The message for the first out-of-range entry of ``idx``, found by NumPy."""
    out = (idx < -ROWS) | (idx >= ROWS)
    pos = np.unravel_index(np.argmax(out), idx.shape)
    where = ", ".join(str(p) for p in pos)
    return (rf"^sharded\.Gather: index {idx[pos]} at indices\[{where}\] is out of range "
            rf"\[-{ROWS}, {ROWS - 1}\] for data axis 0 of size {ROWS} "
            rf"\({out.sum()} out-of-range value\(s\) in indices\)")


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_two_processes_gather_exactly_and_both_raise_on_a_bad_index(tmp_path, kind):
    seen = run_two_processes(tmp_path, kind)
    given = inputs()
    table = given["table"]
    good, bad = given["good"], given["bad"]
    in_range = (bad >= -ROWS) & (bad < ROWS)
    wrapped = np.where(in_range & (bad < 0), bad + ROWS, bad)
    want = {"good": table[good],  # NumPy reads negatives from the end, as Gather-13 does
            "filled": np.where(in_range[..., None], table[np.where(in_range, bad, 0)],
                               np.float32(-2.5)),
            # "clip": in-range negatives count from the end, the rest is clamped
            "clipped": table[np.clip(wrapped, 0, ROWS - 1)]}
    rows = {0: set(), 1: set()}
    for k, s in enumerate(seen):
        assert s["process_index"] == k and s["process_count"] == 2
        assert s["device_count"] == 2 * LOCAL_DEVICES
        assert s["local_device_count"] == LOCAL_DEVICES
        assert s["collectives"] == "gloo"
        # each process holds half of the table's rows, a block on each of its devices
        per = ROWS // (2 * LOCAL_DEVICES)
        assert sorted(tuple(ix[0]) for ix in s["data_shards"]) == \
            [(per * (LOCAL_DEVICES * k + d), per * (LOCAL_DEVICES * k + d + 1))
             for d in range(LOCAL_DEVICES)], s["data_shards"]
        c = s["cases"]
        for name, which in [("eager numpy, replicated", "good"),
                            ("eager numpy, batch=x", "good"),
                            ("eager, device indices sharded, batch=x", "good"),
                            ("checked, device indices sharded, batch=x", "good"),
                            ("checked, device indices replicated", "good"),
                            ("jit, fill mode, batch=x", "filled"),
                            ("eager, clip mode, device indices sharded, batch=x", "clipped"),
                            ("after a failure: checked, device indices sharded, batch=x",
                             "good")]:
            got = c[name]
            assert "error" not in got, (k, name, got)
            expect = bits(want[which])
            assert got["shape"] == list(expect.shape[:-1]) + [3], (k, name)
            np.testing.assert_array_equal(np.array(got["global"], np.uint32), expect,
                                          err_msg=f"process {k}: {name}")
            for shard in got["shards"]:  # this process's part, where it lies in the result
                ix = tuple(slice(a, b) for a, b in shard["index"])
                np.testing.assert_array_equal(np.array(shard["bits"], np.uint32), expect[ix],
                                              err_msg=f"process {k}: {name}, shard {ix}")
                if name.endswith("batch=x"):
                    rows[k].add((ix[0].start, ix[0].stop))
        for name in ["bad: eager numpy, batch=x",
                     "bad: eager, device indices sharded, batch=x",
                     "bad: checked, device indices sharded, batch=x",
                     "bad: checked (raise_if_error), device indices replicated"]:
            got = c[name]
            assert got.get("error") == "OutOfBoundsError", \
                (k, name, got.get("error", "raised nothing"), got.get("message"))
            assert re.match(bound_error(bad), got["message"]), (k, name, got["message"])
    # results split by the indices' rows: each process holds the rows of its own devices
    assert rows == {0: {(0, 2), (2, 4)}, 1: {(4, 6), (6, 8)}}, rows
