"""Run only on 8 devices (tests/test_sharded.py starts it with 8 fake CPU devices)."""

from __future__ import annotations

import re

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import xgather
from tests import reference as ref

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")
RNG = np.random.default_rng(0)


def mesh1(kind=AxisType.Auto):
    return jax.make_mesh((8,), ("x",), axis_types=(kind,))


def mesh2():
    return jax.make_mesh((4, 2), ("rows", "batch"), axis_types=(AxisType.Auto,) * 2)


def put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def collectives(hlo: str) -> list[tuple[str, str]]:
    """(kind, result shape) of every collective in a compiled HLO module."""
    pat = r"= (\w+\[[\d,]*\])\S* (all-gather|all-reduce|reduce-scatter|all-to-all|" \
          r"collective-permute)(?:-start)?\("
    return [(k, s) for s, k in re.findall(pat, hlo)]


# -- the plain ops under jit with sharded inputs -----------------------------------------------

OPS = [
    ("onnx.gather-axis0", lambda d, i, **kw: xgather.onnx.gather(d, i, 0, **kw),
     lambda d, i: ref.gather(d, i, 0), (64, 16), lambda: RNG.integers(-64, 64, (16,))),
    ("onnx.gather-axis1", lambda d, i, **kw: xgather.onnx.gather(d, i, 1, **kw),
     lambda d, i: ref.gather(d, i, 1), (64, 16), lambda: RNG.integers(-16, 16, (16,))),
    ("onnx.gather_nd", lambda d, i, **kw: xgather.onnx.gather_nd(d, i, **kw),
     lambda d, i: ref.gather_nd(d, i), (64, 16),
     lambda: np.stack([RNG.integers(0, 64, 16), RNG.integers(0, 16, 16)], -1)),
    ("onnx.gather_nd-b1", lambda d, i, **kw: xgather.onnx.gather_nd(d, i, 1, **kw),
     lambda d, i: ref.gather_nd(d, i, 1), (16, 8, 4), lambda: RNG.integers(0, 8, (16, 3, 1))),
    ("onnx.gather_elements", lambda d, i, **kw: xgather.onnx.gather_elements(d, i, 1, **kw),
     lambda d, i: ref.gather_elements(d, i, 1), (16, 8), lambda: RNG.integers(-8, 8, (16, 5))),
    ("openvino.gather-b1", lambda d, i, **kw: xgather.openvino.gather(d, i, 1, 1, **kw),
     lambda d, i: ref.gather(d, i, 1, 1, oob="fill"), (16, 8, 4),
     lambda: RNG.integers(-9, 9, (16, 5))),
    ("openvino.gather_nd5",
     lambda d, i, **kw: xgather.openvino.gather_nd(d, i, 1, version=5, **kw),
     lambda d, i: ref.gather_nd(d, i, 1), (16, 8, 4), lambda: RNG.integers(0, 8, (16, 3, 1))),
    ("openvino.gather_elements",
     lambda d, i, **kw: xgather.openvino.gather_elements(d, i, 0, **kw),
     lambda d, i: ref.gather_elements(d, i, 0), (16, 8), lambda: RNG.integers(0, 16, (8, 8))),
    ("bnns.gather_nd", lambda d, i, **kw: xgather.bnns.gather_nd(d, i, **kw),
     lambda d, i: ref.gather_nd(d, i, negative=False), (64, 16),
     lambda: RNG.integers(0, 16, (16, 1))),
    ("labview.gather", lambda d, i, **kw: xgather.labview.gather(d, i, 0, **kw),
     lambda d, i: ref.gather(d, i, 0), (64, 16), lambda: RNG.integers(-64, 64, (16, 2))),
]


@pytest.mark.parametrize("name, op, gref, dshape, make_idx", OPS, ids=[o[0] for o in OPS])
@pytest.mark.parametrize("dspec", [P("x"), P(None, "x"), P()], ids=["rows", "cols", "repl"])
def test_plain_ops_accept_sharded_inputs(name, op, gref, dshape, make_idx, dspec):
    mesh = mesh1()
    data = RNG.standard_normal(dshape).astype(np.float32)
    idx = make_idx().astype(np.int32)
    if name == "openvino.gather_elements":
        idx = idx[:, :dshape[1]]
    want = gref(data, idx)
    d = put(data, mesh, dspec)
    i = put(idx, mesh, P("x") if idx.shape[0] % 8 == 0 else P())
    f = xgather.checked(sync=True)(jax.jit(op, in_shardings=(d.sharding, i.sharding),
                                out_shardings=NamedSharding(mesh, P())))
    np.testing.assert_array_equal(np.asarray(f(d, i)), want)


# Where JAX cannot infer a gather's result sharding on Explicit axes (jnp.take fails alike),
# an xgather error says so and names the remedies; where it can (gathers along an axis that
# is not sharded), the op runs.
EXPLICIT = {"onnx.gather-axis1": None,
            "onnx.gather_nd-b1": "batch dims of data and indices must be sharded alike",
            "onnx.gather_elements": None,
            "openvino.gather-b1": "batch dims of data and indices must be sharded alike",
            "openvino.gather_nd5": "batch dims of data and indices must be sharded alike"}


@pytest.mark.parametrize("name, op, gref, dshape, make_idx", OPS, ids=[o[0] for o in OPS])
def test_explicit_mesh_axes_ask_for_a_result_sharding(name, op, gref, dshape, make_idx):
    mesh = jax.make_mesh((8,), ("x",))  # jax.make_mesh's default: Explicit axes
    assert mesh.axis_types == (AxisType.Explicit,)
    data = RNG.standard_normal(dshape).astype(np.float32)
    idx = make_idx().astype(np.int32)
    if name == "openvino.gather_elements":
        idx = idx[:, :dshape[1]]
    d, i = put(data, mesh, P("x")), put(idx, mesh, P())
    rule = EXPLICIT.get(name, "inputs sharded over a mesh's Explicit axes .*AxisType\\.Auto")
    for call in (lambda: xgather.checked(sync=True)(jax.jit(op))(d, i), lambda: op(d, i)):
        if rule is None:
            np.testing.assert_array_equal(np.asarray(call()), gref(data, idx))
            continue
        with pytest.raises(xgather.XGatherTypeError, match=rf"{rule}.*got data P\('x'"):
            call()
    d, i = put(data, mesh, P()), put(idx, mesh, P())
    np.testing.assert_array_equal(np.asarray(xgather.checked(sync=True)(jax.jit(op))(d, i)),
                                  gref(data, idx))


def _inputs(name, dshape, make_idx, mesh):
    """Data sharded by rows and indices by their first dim where 8 divides it (else
    replicated), on ``mesh``; with the NumPy arrays."""
    data = RNG.standard_normal(dshape).astype(np.float32)
    idx = make_idx().astype(np.int32)
    if name == "openvino.gather_elements":
        idx = idx[:, :dshape[1]]
    ispec = P("x") if idx.shape[0] % 8 == 0 else P()
    return data, idx, put(data, mesh, P("x")), put(idx, mesh, ispec)


def _unchecked(name):
    """A mode that needs no checkify and gives the reference's result on OPS's indices:
    OpenVINO Gather's own (zeros out of range), else clip (the indices are in range)."""
    return None if name == "openvino.gather-b1" else "clip"


@pytest.mark.parametrize("name, op, gref, dshape, make_idx", OPS, ids=[o[0] for o in OPS])
@pytest.mark.parametrize("first", ["x", None], ids=["split", "replicated"])
def test_out_sharding_runs_every_op_on_explicit_axes(name, op, gref, dshape, make_idx, first):
    # JAX's remedy (jnp.ndarray.at[...].get(out_sharding=)) taken by every op: inputs
    # sharded by rows on Explicit axes, which alone raise (above), now run, eagerly and
    # under xgather.checked, and the result is placed as asked.
    mesh = jax.make_mesh((8,), ("x",))
    data, idx, d, i = _inputs(name, dshape, make_idx, mesh)
    want = gref(data, idx)
    spec = P(first) if want.shape[0] % 8 == 0 else P()
    where = NamedSharding(mesh, spec)
    for call in (lambda: op(d, i, out_sharding=where),
                 lambda: xgather.checked(jax.jit(lambda d, i: op(d, i, out_sharding=where)),
                                         sync=True)(d, i)):
        out = call()
        np.testing.assert_array_equal(np.asarray(out), want)
        assert out.sharding.mesh.axis_types == (AxisType.Explicit,)
        assert out.sharding.is_equivalent_to(where, out.ndim), out.sharding
    with jax.set_mesh(mesh):  # a PartitionSpec of the mesh in context
        out = jax.jit(lambda d, i: op(d, i, mode=_unchecked(name), out_sharding=spec))(d, i)
    np.testing.assert_array_equal(np.asarray(out), want)


@pytest.mark.parametrize("name, op, gref, dshape, make_idx",
                         [o for o in OPS if o[0] in ("onnx.gather-axis0", "onnx.gather_elements",
                                                     "labview.gather", "openvino.gather-b1")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_out_sharding_gradients_on_explicit_axes(name, op, gref, dshape, make_idx):
    # The cotangent's scatter-add runs where the gather did: against a NumPy scatter-add
    # of the same cotangent through the reference's positions.
    mesh = jax.make_mesh((8,), ("x",))
    data, idx, d, i = _inputs(name, dshape, make_idx, mesh)
    where = NamedSharding(mesh, P())
    grad = jax.jit(jax.grad(lambda d, i: (op(d, i, mode=_unchecked(name),
                                               out_sharding=where) ** 2).sum()))
    got = np.asarray(grad(d, i))
    positions = gref(np.arange(data.size, dtype=np.int64).reshape(data.shape), idx)
    values = gref(data, idx)
    want = np.zeros(data.size, np.float64)
    keep = positions.ravel() >= 0 if name != "openvino.gather-b1" else \
        np.asarray(ref.gather(np.ones(data.shape), idx, 1, 1, oob="fill")).ravel() > 0
    np.add.at(want, positions.ravel()[keep], 2.0 * values.ravel()[keep].astype(np.float64))
    np.testing.assert_allclose(got.ravel(), want, rtol=1e-6)


def test_bound_errors_from_indices_sharded_on_explicit_axes():
    # The report reads single values of the indices, which JAX refuses to index where they
    # are sharded over Explicit axes: a replicated copy is read.
    mesh = jax.make_mesh((8,), ("x",))
    data = RNG.standard_normal((64, 16)).astype(np.float32)
    idx = np.arange(16, dtype=np.int32)
    idx[13] = 99
    i = put(idx, mesh, P("x"))
    where = NamedSharding(mesh, P("x"))
    for dspec in (P("x"), P()):
        f = xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather(d, i, out_sharding=where)),
                            sync=True)
        d = put(data, mesh, dspec)
        with pytest.raises(xgather.OutOfBoundsError,
                           match=r"index 99 at indices\[13\] is out of range \[-64, 63\]"):
            f(d, i)
        ok = idx % 16
        np.testing.assert_array_equal(np.asarray(f(d, put(ok, mesh, P("x")))),
                                      ref.gather(data, ok, 0))


def test_out_sharding_on_auto_axes_constrains_the_result():
    mesh = mesh1()
    data = RNG.standard_normal((64, 16)).astype(np.float32)
    idx = RNG.integers(-64, 64, 16).astype(np.int32)
    for spec in (P(), P("x"), P(None, "x")):
        f = jax.jit(lambda d, i, spec=spec: xgather.onnx.gather(
            d, i, mode="clip", out_sharding=NamedSharding(mesh, spec)))
        out = f(put(data, mesh, P("x")), put(idx, mesh, P("x")))
        np.testing.assert_array_equal(np.asarray(out), ref.gather(data, idx, 0))
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2)


def test_out_sharding_mistakes_are_named():
    mesh = jax.make_mesh((8,), ("x",))
    d = put(np.zeros((64, 4), np.float32), mesh, P("x"))
    i = put(np.zeros(8, np.int32), mesh, P("x"))
    with jax.set_mesh(mesh):  # eagerly too; the mesh of a PartitionSpec is the context's,
        out = xgather.onnx.gather(d, i, out_sharding=P("x"))  # so no cached call outlives it
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)
    for where, message in [
            (P("x"), r"as a PartitionSpec needs a mesh in context \(with jax\.set_mesh"),
            (NamedSharding(mesh, P("x", None, None)),
             r"spec has more entries than the result has dims; got P\('x', None, None\) for a "
             r"result of shape \(8, 4\)"),
            (NamedSharding(mesh, P(None, "x")),
             r"split each result dim into equal parts; got P\(None, 'x'\): dim 1 of size 4 "
             r"into 8 parts"),
            ("x", r"must be a jax\.sharding\.NamedSharding or PartitionSpec; got str")]:
        with pytest.raises(xgather.XGatherError,
                           match=r"onnx\.Gather-13: out_sharding.*" + message):
            xgather.onnx.gather(d, i, out_sharding=where)
    with jax.set_mesh(mesh), pytest.raises(xgather.XGatherError,
                                           match=r"names a mesh axis twice; got P\('x', 'x'\)"):
        xgather.onnx.gather(d, i, out_sharding=P("x", "x"))
    other = jax.make_mesh((4, 2), ("a", "b"))
    with jax.set_mesh(other), pytest.raises(xgather.XGatherError,
                                            match=r"names axes the mesh does not have; got "
                                                  r"P\('x',\) on a mesh with axes \('a', 'b'\)"):
        xgather.onnx.gather(np.zeros((64, 4), np.float32), np.zeros(8, np.int32),
                            out_sharding=P("x"))


# -- the row-sharded lookup --------------------------------------------------------------------

@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("batch", [None, "x"])
def test_sharded_lookup_is_exact(kind, batch):
    mesh = mesh1(kind)
    data = RNG.standard_normal((64, 12)).astype(np.float32)
    idx = RNG.integers(-64, 64, (32, 3)).astype(np.int32)
    out = xgather.sharded.gather(put(data, mesh, P("x")), idx, mesh, "x", batch)
    np.testing.assert_array_equal(np.asarray(out), ref.gather(data, idx, 0))
    spec = tuple(out.sharding.spec)
    assert spec[:1] == (batch,) if batch else all(a is None for a in spec)


@pytest.mark.parametrize("batch", [None, "x"])
def test_sharded_lookup_returns_every_value_bit_for_bit(batch):
    # Each row has one owner and the others add zeros: a float sum would turn -0.0 into
    # +0.0 and may flush subnormals, and a bool sum gives ints. Against NumPy's indexing.
    mesh = mesh1(AxisType.Explicit)
    idx = RNG.permutation(64)[:16].astype(np.int32)
    f32 = RNG.standard_normal((64, 3)).astype(np.float32)
    f32[idx[:4], 0] = [-0.0, 1e-45, -1e-45, np.nan]
    f32.view(np.uint32)[idx[4], 1] = 0x7FC0_1234  # a NaN with a payload
    cases = [f32, f32.astype(ml_dtypes.bfloat16), (f32 > 0),
             RNG.integers(-128, 128, (64, 3)).astype(np.int8),
             (f32 + 1j * np.where(f32 > 0, -0.0, f32)).astype(np.complex64)]
    for data in cases:
        out = np.asarray(xgather.sharded.gather(put(data, mesh, P("x")), idx, mesh, "x", batch,
                                                mode="promise_in_bounds"))
        assert out.dtype == data.dtype
        want = data[idx]
        if want.dtype.kind in "fcV":  # bits, not values: -0.0 and NaN payloads count
            width = {8: np.uint64, 4: np.uint32, 2: np.uint16}[want.dtype.itemsize]
            want, out = want.view(width), out.view(width)
        np.testing.assert_array_equal(out, want)


def test_sharded_lookup_on_a_2d_mesh_and_modes():
    mesh = mesh2()
    data = RNG.standard_normal((64, 4, 3)).astype(np.float32)
    idx = np.array([0, 63, -64, -1, 70, -70, 5, 5], np.int32)
    for mode in ("clip", "fill"):
        out = xgather.sharded.gather(data, idx, mesh, "rows", "batch", mode=mode, fill_value=7.0)
        np.testing.assert_array_equal(np.asarray(out), ref.gather(data, idx, 0, oob=mode, fill=7.0))


def test_sharded_bound_errors_report_the_global_index():
    mesh = mesh1()
    data = put(np.zeros((64, 2), np.float32), mesh, P("x"))
    idx = np.zeros(16, np.int32)
    idx[13] = 64
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"^sharded\.Gather: index 64 at indices\[13\] is out of range "
                             r"\[-64, 63\] for data axis 0 of size 64"):
        xgather.sharded.gather(data, idx, mesh, "x", "x")
    f = xgather.checked(jax.jit(lambda d, i: xgather.sharded.gather(d, i, mesh, "x", "x")),
                        sync=True)
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 64 at indices\[13\]"):
        f(data, put(idx, mesh, P("x")))


def test_flags_and_eager_checks_on_sharded_arrays():
    """A flag on eight devices has no single buffer to read: it is copied to the host
    (xgather._check.flag_set), and the eager check of sharded device indices reports."""
    from xgather._check import flag_set
    mesh = mesh1()
    for value in (True, False):
        flag = put(np.array(value), mesh, P())
        assert len(flag.addressable_shards) == 8 and flag_set(flag) is value
    data = RNG.standard_normal((64, 3)).astype(np.float32)
    idx = RNG.integers(-64, 64, 16).astype(np.int32)
    d, i = put(data, mesh, P("x")), put(idx, mesh, P("x"))
    np.testing.assert_array_equal(np.asarray(xgather.onnx.gather(d, i)), ref.gather(data, idx, 0))
    idx[11] = -65
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"^onnx\.Gather-13: index -65 at indices\[11\] is out of range"):
        xgather.onnx.gather(d, put(idx, mesh, P("x")))


@pytest.mark.parametrize("kind, rows", [(AxisType.Auto, 16), (AxisType.Explicit, 24)])
def test_numpy_data_under_set_mesh_is_placed_as_jnp_asarray_places_it(kind, rows,
                                                                     backend_compiles):
    """Eager calls send NumPy data to the device with jax.device_put (one device), also
    under jax.set_mesh: the program compiled for them (the only one) places the result as
    for data that jnp.asarray replicated on the mesh."""
    mesh = mesh1(kind)
    data = RNG.standard_normal((rows, 2)).astype(np.float32)  # a shape per case: compiled anew
    for idx in (np.array([3, -1, 0], np.int32), put(np.array([5, -16], np.int32), mesh, P())):
        with jax.set_mesh(mesh):
            backend_compiles.clear()
            got = xgather.onnx.gather(data, idx)
            if isinstance(idx, np.ndarray):
                assert len(backend_compiles) == 1  # the gather; no copy of the data
            placed = xgather.onnx.gather(jax.numpy.asarray(data), idx)
        np.testing.assert_array_equal(np.asarray(got), ref.gather(data, np.asarray(idx), 0))
        assert got.sharding == placed.sharding and got.committed == placed.committed
        assert got.sharding.mesh.shape == mesh.shape, got.sharding


def test_no_device_holds_the_table():
    mesh = mesh1()
    data = put(np.zeros((1024, 64), np.float32), mesh, P("x"))
    idx = put(np.zeros(256, np.int32), mesh, P("x"))
    f = jax.jit(lambda d, i: xgather.sharded.gather(d, i, mesh, "x", "x", mode="clip"))
    hlo = f.lower(data, idx).compile().as_text()
    kinds = collectives(hlo)
    assert ("all-gather", "s32[256]") in kinds  # the indices, not the table
    assert not any(k == "all-gather" and s.startswith(("f32", "u32")) for k, s in kinds), kinds
    assert ("reduce-scatter", "u32[32,64]") in kinds  # the float32 rows, summed as their bits
    # The gradient's scatter-add stays sharded: no all-gather of the table either.
    g = jax.jit(jax.grad(lambda d, i: (xgather.sharded.gather(d, i, mesh, "x", "x",
                                                                mode="clip") ** 2).sum()))
    gk = collectives(g.lower(data, idx).compile().as_text())
    assert not any(k == "all-gather" and s.startswith(("f32[1024", "u32[1024")) for k, s in gk), gk


def test_gradient_through_the_sharded_path():
    mesh = mesh1()
    data = RNG.standard_normal((64, 5)).astype(np.float32)
    idx = RNG.integers(-64, 64, (24,)).astype(np.int32)
    idx[:4] = 3  # duplicates accumulate
    cot = RNG.standard_normal((24, 5)).astype(np.float32)
    d = put(data, mesh, P("x"))

    def f(x):
        return (xgather.sharded.gather(x, idx, mesh, "x", "x") * cot).sum()

    g = jax.jit(jax.grad(f))(d)
    np.testing.assert_allclose(np.asarray(g), ref.vjp_data(ref.gather, data.shape, cot, idx),
                               rtol=1e-6)
    assert g.sharding.spec[:1] == ("x",)


def test_sharded_bad_inputs():
    mesh = mesh1()
    with pytest.raises(xgather.XGatherError, match=r"data\.shape\[0\] must be a multiple of the "
                                                    r"8 devices on mesh axis 'x'; got \(60,\)"):
        xgather.sharded.gather(np.zeros((60, 2)), [0], mesh, "x")
    with pytest.raises(xgather.XGatherError, match=r"rows must name an axis of the mesh"):
        xgather.sharded.gather(np.zeros((64, 2)), [0], mesh, "y")
    with pytest.raises(xgather.XGatherTypeError, match=r"indices must be int32 or int64"):
        xgather.sharded.gather(np.zeros((64, 2)), np.zeros(8, np.float32), mesh, "x")


