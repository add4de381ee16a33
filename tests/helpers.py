"""Run one op eagerly, under jit and under vmap, and compare with a reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

import xgather


def spec_path(name: str) -> Path:
    """The spec text ``name`` of ``shared/specs``: beside the checkout (as CI has it) or
    inside it (where only the checkout travels, as to the GPU machine: ``.ci/gpu``)."""
    root = Path(__file__).resolve().parents[1]
    for shared in (root.parent / "shared", root / "shared"):
        if (shared / "specs" / name).is_file():
            return shared / "specs" / name
    raise FileNotFoundError(f"{name}: not in {root.parent / 'shared' / 'specs'} nor in "
                            f"{root / 'shared' / 'specs'}; the spec tests read the texts there")


def assert_same(got, want):
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def check_everywhere(f, data, indices, ref, tuples=False):
    """``f(data, indices)`` eagerly, jitted (checked), and vmapped over a stacked pair.

    ``ref(data, indices)`` is the NumPy reference; it sees each vmapped item on its own.
    ``tuples``: the last axis of ``indices`` holds index tuples (kept in order).
    """
    data, indices = np.asarray(data), np.asarray(indices)
    want = ref(data, indices)
    assert_same(f(data, indices), want)
    assert_same(xgather.checked(jax.jit(f))(data, indices), want)
    data2 = (data[::-1] if data.ndim and data.shape[0] else data).copy()
    axes = tuple(range(indices.ndim - 1 if tuples else indices.ndim))
    indices2 = np.flip(indices, axes).copy()
    got = np.asarray(xgather.checked(jax.vmap(f))(np.stack([data, data2]),
                                                   np.stack([indices, indices2])))
    assert_same(got[0], want)
    assert_same(got[1], ref(data2, indices2))


#: ONNX's own node tests whose graphs are a single gather.
GATHER_NODE_TESTS = {
    "test_gather_0", "test_gather_1", "test_gather_2d_indices", "test_gather_negative_indices",
    "test_gather_elements_0", "test_gather_elements_1", "test_gather_elements_negative_indices",
    "test_gathernd_example_float32", "test_gathernd_example_int32",
    "test_gathernd_example_int32_batch_dim1",
}


def gather_node_test_case(backend, module_name: str):
    """ONNX's gather node tests, built in memory for ``backend``, as one TestCase class.

    Only the :data:`GATHER_NODE_TESTS` cases are kept (the runner would report
    thousands of skips otherwise).
    """
    import importlib
    import warnings

    import onnx.backend.test
    import onnx.backend.test.loader as loader

    def gather_cases_only():
        # onnx builds its node cases by running every op's export functions, all of
        # them at once (about 12 s, in every test process); the gather modules are enough.
        for name in ("gather", "gatherelements", "gathernd"):
            importlib.import_module(f"onnx.backend.test.case.node.{name}")
        from onnx.backend.test.case.node import _NodeTestCases
        return _NodeTestCases

    everything = getattr(loader, "load_node_model_tests", None)
    # onnx's own casts warn while it builds the cases (not ours to fix).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if everything is not None:
            loader.load_node_model_tests = gather_cases_only
        try:
            backend_test = onnx.backend.test.BackendTest(backend, module_name)
        finally:
            if everything is not None:
                loader.load_node_model_tests = everything
    for name in sorted(GATHER_NODE_TESTS):
        backend_test.include(rf"^{name}_cpu$")
    case = backend_test.test_cases["OnnxBackendNodeModelTest"]
    for name in [n for n in vars(case) if n.startswith("test_")]:
        if name.removesuffix("_cpu") not in GATHER_NODE_TESTS or not name.endswith("_cpu"):
            delattr(case, name)
    return case


def pytest_env(**extra: str) -> dict[str, str]:
    """The environment for a pytest that a test starts: this one's and ``extra``, less the
    variables of a pytest-xdist worker, which that pytest is not (pytest-benchmark 5.2
    reads ``PYTEST_XDIST_WORKER`` as xdist being active there, and warns)."""
    return {**{name: value for name, value in os.environ.items()
               if not name.startswith("PYTEST_XDIST_")}, **extra}


def rerun_with_x64(test_file: str, select: str) -> None:
    """Run the tests of ``test_file`` that ``-k select`` picks in a fresh Python with
    ``JAX_ENABLE_X64=1`` (the flag must be set before JAX starts); assert they pass."""
    env = pytest_env(JAX_ENABLE_X64="1", PYTHONWARNINGS="")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=-p tests.plugin_guard", test_file, "-k", select],
                          capture_output=True, text=True, env=env, timeout=600,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:]
