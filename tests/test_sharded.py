"""Sharded gathers on 8 fake CPU devices, in a fresh process (the flag must precede JAX);
the argument and dtype rules on one device, here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import xgather
from tests.helpers import pytest_env, rerun_with_x64

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.subprocess
def test_on_eight_devices():
    # Eight fake CPU devices, also where the suite runs on a GPU (JAX_PLATFORMS=cuda).
    env = pytest_env(JAX_PLATFORMS="cpu",
                     XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                " --xla_force_host_platform_device_count=8").strip())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=-p tests.plugin_guard",
         "-W", "error", "-W", "ignore:os.fork:RuntimeWarning",
         str(ROOT / "tests" / "multidevice")], capture_output=True, text=True, env=env,
        timeout=900, cwd=ROOT)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail


# -- one device, in this process ---------------------------------------------------------------

X64 = bool(jax.config.jax_enable_x64)
WIDE = [np.array([2**40 + 5, -(2**40) - 3, 7, 2**62], np.int64),
        np.array([2**53 + 1, 2**40 + 5, 3, 2**64 - 1], np.uint64),
        np.array([1 + 2.0**-40, 1e300, -1e-300, 3.0], np.float64),
        np.array([1 + 2.0**-40 + 1e300j, 2, 3, 4], np.complex128)]


def one_device_mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))


@pytest.mark.parametrize("data", WIDE, ids=lambda d: d.dtype.name)
def test_sixty_four_bit_data_is_exact_or_an_error(data):
    """With x64 off, 64-bit NumPy data would be cut to 32 bits on the devices (this path has
    no host path): an error at trace time. With x64 on, the gather is exact."""
    mesh = one_device_mesh()
    table = np.stack([data, data[::-1]], axis=1)  # (4, 2)
    idx = np.array([0, 3, -4, 1, 0], np.int32)
    calls = [lambda: xgather.sharded.gather(table, idx, mesh, "x"),
             lambda: jax.jit(lambda i: xgather.sharded.gather(table, i, mesh, "x",
                                                              mode="clip"))(idx)]
    for call in calls:
        if X64:
            out = call()
            assert out.dtype == table.dtype
            np.testing.assert_array_equal(np.asarray(out), table[idx])
        else:
            with pytest.raises(xgather.XGatherTypeError,
                               match=rf"^sharded\.Gather: 64-bit data needs jax_enable_x64 on "
                                     rf"this path .*with x64 off JAX would cut it to 32 bits.*; "
                                     rf"got {data.dtype.name} \[data\.shape=\(4, 2\), "
                                     rf"indices\.shape=\(5,\)\]"):
                call()


@pytest.mark.subprocess
@pytest.mark.skipif(X64, reason="already the x64 run")
def test_sixty_four_bit_data_with_x64_on():
    rerun_with_x64(__file__, "exact_or_an_error")


def test_string_data_is_an_error():
    mesh = one_device_mesh()
    for table in (np.array([["a", "b"], ["c", "d"]]), np.array([[b"a"], [b"b"]]),
                  np.array([["a"], [None]], object)):
        with pytest.raises(xgather.XGatherTypeError,
                           match=r"^sharded\.Gather: string data cannot be sharded over devices "
                                 r".*; got string \[data\.shape=\(2, \d\)"):
            xgather.sharded.gather(table, np.array([1, 0], np.int32), mesh, "x")


def test_float32_data_matches_numpy():
    mesh = one_device_mesh()
    table = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    idx = np.array([7, -8, 0, 3, -1], np.int32)
    np.testing.assert_array_equal(np.asarray(xgather.sharded.gather(table, idx, mesh, "x")),
                                  table[idx])


def test_eager_calls_of_one_signature_compile_once():
    """An eager call compiles its program once per shapes and options (it compiled again
    at every call, about 0.1 s each): JAX logs no compilation for the later ones."""
    import logging
    mesh = one_device_mesh()
    # shapes of this test's own, so that its first call compiles
    table = np.random.default_rng(1).standard_normal((8, 7)).astype(np.float32)
    idx = [np.array([k, -1 - k, 3], np.int32) for k in range(4)]
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)
    logger, keep = logging.getLogger("jax"), Keep(logging.DEBUG)
    logger.addHandler(keep)
    try:
        with jax.log_compiles(True):
            counts = []
            for i in idx:
                before = len([r for r in records if "ompil" in r.getMessage()])
                out = xgather.sharded.gather(table, i, mesh, "x")
                np.testing.assert_array_equal(np.asarray(out), table[i])
                counts.append(len([r for r in records if "ompil" in r.getMessage()]) - before)
    finally:
        logger.removeHandler(keep)
    assert counts[0] > 0 and counts[1:] == [0, 0, 0], counts


def test_bad_mesh_and_axis_arguments():
    mesh = one_device_mesh()
    table, idx = np.zeros((4, 2), np.float32), np.zeros(3, np.int32)
    for bad in (None, "x", mesh.abstract_mesh):
        with pytest.raises(xgather.XGatherError,
                           match=rf"^sharded\.Gather: mesh must be a jax\.sharding\.Mesh; got "
                                 rf"{type(bad).__qualname__} \[data\.shape=\(4, 2\)"):
            xgather.sharded.gather(table, idx, bad, "x")
    with pytest.raises(xgather.XGatherError,
                       match=r"^sharded\.Gather: rows must name an axis of the mesh \{'x': 1\}; "
                             r"got \['x'\] \[data"):
        xgather.sharded.gather(table, idx, mesh, ["x"])
    with pytest.raises(xgather.XGatherError,
                       match=r"^sharded\.Gather: batch must name an axis of the mesh \{'x': 1\} "
                             r"or be None; got \['x'\] \[data"):
        xgather.sharded.gather(table, idx, mesh, "x", ["x"])


def test_fill_values_follow_the_data_type():
    mesh = one_device_mesh()
    table = np.arange(8, dtype=np.int32).reshape(4, 2)
    idx = np.array([1, 9], np.int32)
    for bad, pattern in [(np.array([1.0, 2.0]), r"fill_value must be a scalar"),
                         (1.7, r"fill_value must be a value int32 holds exactly; got 1\.7"),
                         ("x", r"fill_value for int32 data must be a number")]:
        with pytest.raises(xgather.XGatherError, match=r"^sharded\.Gather: " + pattern):
            xgather.sharded.gather(table, idx, mesh, "x", mode="fill", fill_value=bad)
    out = xgather.sharded.gather(table, idx, mesh, "x", mode="fill", fill_value=-3)
    np.testing.assert_array_equal(np.asarray(out), [[2, 3], [-3, -3]])


def test_a_check_before_a_sharded_gather_is_the_documented_limit():
    """README, Many devices: jax 0.10.2's checkify cannot carry an earlier check through the
    shard_map; the sharded gather first works, and that error is what the README names."""
    mesh = one_device_mesh()
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    idx = np.array([3, 0, -1], np.int32)

    def first(t, i):
        return xgather.sharded.gather(t, i, mesh, "x") + xgather.onnx.gather(t, i)

    np.testing.assert_array_equal(np.asarray(xgather.checked(first)(table, idx)),
                                  2 * table[idx])

    def after(t, i):
        return xgather.onnx.gather(t, i) + xgather.sharded.gather(t, i, mesh, "x")

    try:
        out = xgather.checked(after)(table, idx)
    except TypeError as e:  # the limit, as documented
        assert "select cases must have the same shapes" in str(e)
    else:  # a JAX that lifted the limit: then the result must be right
        np.testing.assert_array_equal(np.asarray(out), 2 * table[idx])


def test_bfloat16_gradient_sums_in_float32():
    # 400 lookups of 3 rows: the sum rounds once to bfloat16, as on the single-device ops.
    mesh = one_device_mesh()
    rng = np.random.default_rng(1)
    idx = rng.integers(-3, 3, 400).astype(np.int32)
    cot = rng.integers(64, 129, (400, 4)) / 16  # same signs, multiples of 1/16: exact in float32
    exact = np.zeros((3, 4))
    np.add.at(exact, np.where(idx < 0, idx + 3, idx), cot)
    grad = jax.grad(lambda d: (xgather.sharded.gather(d, idx, mesh, "x").astype(np.float32)
                               * cot).sum())(jax.numpy.zeros((3, 4), jax.numpy.bfloat16))
    assert grad.dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(np.asarray(grad), exact.astype(jax.numpy.bfloat16))
