"""xgather.checked around sharded.gather on meshes of 4 of the 8 devices, Explicit and Auto.

jax.make_mesh without axis_types gives Explicit axes (jax 0.10): the README's mesh.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import xgather

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")


def make_mesh(kind):
    devices = jax.devices()[:4]
    if kind == "plain":
        mesh = jax.make_mesh((4,), ("x",), devices=devices)
        assert mesh.axis_types == (AxisType.Explicit,)
        return mesh
    return jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,), devices=devices)


@pytest.mark.parametrize("batch", [None, "x"])
@pytest.mark.parametrize("jit", [False, True], ids=["checked", "checked-jit"])
@pytest.mark.parametrize("kind", ["plain", "auto"])
def test_checked_reports_the_bad_index(kind, jit, batch):
    mesh = make_mesh(kind)
    table = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    t = jax.device_put(table, NamedSharding(mesh, P("x")))

    def fn(t, i):
        return xgather.sharded.gather(t, i, mesh, "x", batch)

    f = xgather.checked(sync=True)(jax.jit(fn) if jit else fn)
    for idx in ([0, 9, 0, 0], [15, -16, -1, 4], [3, -2, 7, 0]):  # in range: as NumPy reads them
        idx = np.array(idx, np.int32)
        np.testing.assert_array_equal(np.asarray(f(t, idx)), table[idx])
    for idx in ([0, 99, 0, 0], [1, 2, -17, 16], [3, -1, 5, -40]):
        idx = np.array(idx, np.int32)
        out = (idx < -16) | (idx > 15)  # NumPy's range for 16 rows
        pos = int(np.argmax(out))
        with pytest.raises(xgather.OutOfBoundsError,
                           match=rf"^sharded\.Gather: index {idx[pos]} at indices\[{pos}\] is out "
                                 rf"of range \[-16, 15\] for data axis 0 of size 16 "
                                 rf"\({out.sum()} out-of-range value\(s\) in indices\)"):
            f(t, idx)
    # in range again afterwards (the fast program, maybe replaced by the exact one)
    idx = np.array([-3, 2, 14, -16], np.int32)
    np.testing.assert_array_equal(np.asarray(f(t, idx)), table[idx])


@pytest.mark.parametrize("kind", ["plain", "auto"])
def test_checked_with_device_indices_and_a_2d_index_array(kind):
    mesh = make_mesh(kind)
    table = np.random.default_rng(1).standard_normal((8, 2)).astype(np.float32)
    t = jax.device_put(table, NamedSharding(mesh, P("x")))
    f = xgather.checked(sync=True)(lambda t, i: xgather.sharded.gather(t, i, mesh, "x", "x"))
    idx = np.array([[0, -1], [7, 3], [-8, 2], [1, 1]], np.int32)
    i = jax.device_put(idx, NamedSharding(mesh, P("x")))
    np.testing.assert_array_equal(np.asarray(f(t, i)), table[idx])
    idx[2, 1] = 8
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"^sharded\.Gather: index 8 at indices\[2, 1\] is out of range "
                             r"\[-8, 7\] for data axis 0 of size 8"):
        f(t, jax.device_put(idx, NamedSharding(mesh, P("x"))))


@pytest.mark.parametrize("kind", ["plain", "auto"])
def test_checked_around_a_shard_map_names_the_shard(kind):
    mesh = make_mesh(kind)
    table = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    t = jax.device_put(table, NamedSharding(mesh, P()))
    f = xgather.checked(jax.jit(jax.shard_map(lambda t, i: xgather.onnx.gather(t, i), mesh=mesh,
                                              in_specs=(P(), P("x")), out_specs=P("x"))),
                        sync=True)
    idx = np.array([0, 5, -1, 63, 10, -64, 3, 7], np.int32)
    i = jax.device_put(idx, NamedSharding(mesh, P("x")))
    np.testing.assert_array_equal(np.asarray(f(t, i)), table[idx])
    idx[6] = 64  # the 4th shard's first index
    i = jax.device_put(idx, NamedSharding(mesh, P("x")))
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"^onnx\.Gather-13: index 64 at indices\[0\] is out of range "
                             r"\[-64, 63\] .* in the shard at mapped index 3 of a shard_map, "
                             r"where the position is within that shard's indices"):
        f(t, i)
