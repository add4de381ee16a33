"""The README's code runs, and says what it shows."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_first_example_runs():
    ns: dict = {}
    exec(compile(BLOCKS[0], "README-example", "exec"), ns)
    np.testing.assert_array_equal(ns["f"](ns["data"], np.array([3, -4])), ns["data"][:, [3, 0]])


def test_gradient_example_runs_and_matches_its_comments():
    ns: dict = {}
    lines = BLOCKS[1].splitlines()
    want = {0: [4.0, 0.0, 2.0], 1: [0.0, 0.0, -2.0], 2: [0.0, 2.0, 0.0]}
    k = 0
    for line in lines:
        exec(line, ns)
        if line.startswith("g = "):
            np.testing.assert_array_equal(ns["g"], want[k])
            k += 1
    assert k == 3


def test_first_screen_has_the_two_commands():
    head = README.split("\n## ")[0]
    assert ".venv/bin/xgather-bench" in head and "-m pytest" in head


def test_many_devices_example_runs():
    block = next(b for b in BLOCKS if "xgather.sharded.gather" in b)
    ns: dict = {}
    exec(compile(block, "README-many-devices", "exec"), ns)
    assert ns["rows"].shape == (1024, 256)
    np.testing.assert_array_equal(np.asarray(ns["same"]), np.asarray(ns["rows"]))
    assert ns["same"].sharding.is_equivalent_to(ns["table"].sharding, 2)


def test_onnx_models_example_runs():
    block = next(b for b in BLOCKS if "from_node" in b)
    ns: dict = {}
    exec(compile(block, "README-onnx-models", "exec"), ns)
    data = ns["np"].arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(ns["f"](data, np.array([-1, 0])), [[2.0, 0.0], [5.0, 3.0]])
    np.testing.assert_array_equal(ns["out"], np.ones((2, 2), np.float32))
    assert ns["out"].dtype == np.float32
