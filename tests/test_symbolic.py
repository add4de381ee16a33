"""Export with a batch of any size: symbolic dimensions (``jax.export.symbolic_shape``)
through jax2onnx and through ``jax.export``, each model run at two batch sizes and
compared with the NumPy loops; a clear error where a dimension must be a number."""

import functools

import jax
import numpy as np
import pytest
from jax import export

import xgather
from tests import reference as ref

B, = export.symbolic_shape("B")
S = jax.ShapeDtypeStruct


def _b(shape, b):
    return tuple(b if n is B else n for n in shape)


# name: (op, attributes, data shape, indices shape, the axis size s, the loops)
CASES = {
    "gather-indices": (xgather.onnx.gather, dict(axis=0), (10, 4), (B,), 10,
                       lambda d, i, m: ref.gather(d, i, 0, oob=m)),
    "gather-2d-indices": (xgather.onnx.gather, dict(axis=1), (3, 7), (B, 2), 7,
                          lambda d, i, m: ref.gather(d, i, 1, oob=m)),
    "gather-data-batch": (xgather.onnx.gather, dict(axis=1), (B, 6), (3,), 6,
                          lambda d, i, m: ref.gather(d, i, 1, oob=m)),
    "gather_nd": (xgather.onnx.gather_nd, {}, (6, 5, 4), (B, 2), 5,
                  lambda d, i, m: ref.gather_nd(d, i, oob=m)),
    "gather_nd-batch_dims": (xgather.onnx.gather_nd, dict(batch_dims=1), (B, 5, 4), (B, 3, 1), 5,
                             lambda d, i, m: ref.gather_nd(d, i, 1, oob=m)),
    "gather_elements": (xgather.onnx.gather_elements, dict(axis=1), (B, 10), (B, 3), 10,
                        lambda d, i, m: ref.gather_elements(d, i, 1, oob=m)),
    "openvino-gather-batch": (xgather.openvino.gather, dict(axis=1, batch_dims=1), (B, 6, 2),
                              (B, 4), 6, lambda d, i, m: ref.gather(d, i, 1, 1, oob=m)),
}
MODES = ["clip", "fill", "promise_in_bounds"]


def _draw(case, b, mode, rng):
    op, attrs, dshape, ishape, s, loops = CASES[case]
    data = rng.standard_normal(_b(dshape, b)).astype(np.float32)
    lo, hi = (-s, s) if mode in ("error", "promise_in_bounds") else (-s - 3, s + 3)
    return data, rng.integers(lo, hi, _b(ishape, b)).astype(np.int32)


def _fn(case, mode):
    op, attrs = CASES[case][:2]
    return functools.partial(op, **attrs, mode=mode)


def _specs(case):
    _, _, dshape, ishape = CASES[case][:4]
    return [S(dshape, np.float32), S(ishape, np.int32)]


@pytest.mark.parametrize("mode", ["error", *MODES])
@pytest.mark.parametrize("case", sorted(CASES))
def test_jax2onnx_exports_a_free_batch(case, mode):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("jax2onnx")
    if mode == "error" and case.startswith("openvino"):
        mode = None  # OpenVINO Gather's default: zeros
    model = xgather.export.to_onnx(_fn(case, mode), _specs(case), opset=21)
    declared = [[d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim]
                for x in model.graph.input]
    assert any("B" in dims for dims in declared), declared
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    names = [x.name for x in sess.get_inputs()]
    rng = np.random.default_rng(11)
    loops = CASES[case][-1]
    oob = {"error": "error", None: "fill", "promise_in_bounds": "error"}.get(mode, mode)
    for b in (2, 5):
        data, idx = _draw(case, b, mode or "fill", rng)
        got = sess.run(None, dict(zip(names, (data, idx), strict=True)))[0]
        np.testing.assert_array_equal(got, loops(data, idx, oob))
    if mode == "error":  # onnxruntime's own check, at any batch
        data, idx = _draw(case, 3, "error", rng)
        idx.reshape(-1)[-1] = 99
        with pytest.raises(Exception, match="99|[Oo]ut of (bounds|range)"):
            sess.run(None, dict(zip(names, (data, idx), strict=True)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_jax_export_serves_any_batch(case, mode):
    exported = export.export(jax.jit(_fn(case, mode)))(*_specs(case))
    exported = export.deserialize(exported.serialize())  # as it is shipped
    rng = np.random.default_rng(12)
    loops = CASES[case][-1]
    for b in (2, 5):
        data, idx = _draw(case, b, mode, rng)
        np.testing.assert_array_equal(np.asarray(exported.call(data, idx)),
                                      loops(data, idx, "error" if mode == "promise_in_bounds"
                                            else mode))


def test_plans_keep_the_symbolic_dims():
    plan = xgather.explain(xgather.onnx.gather_elements, S((B, 10), np.float32),
                           S((B, 3), np.int32), 1)
    assert plan.out_shape == (B, 3) and plan.bounds == (10,)
    assert "data(B, 10) indices(B, 3) -> out(B, 3)" in str(plan)
    assert plan.wrap_pass == "fused" and not plan.small


@pytest.mark.parametrize("call, message", [
    (lambda: xgather.explain(xgather.onnx.gather, S((B, 4), np.float32), S((3,), np.int32), 0),
     r"^onnx\.Gather-13: data\.shape\[0\] must be a known size, not a symbolic dimension "
     r"\(the indices address this axis.*got data\.shape\[0\]=B"),
    (lambda: xgather.explain(xgather.onnx.gather_nd, S((6, 5), np.float32), S((3, B), np.int32)),
     r"^onnx\.GatherND-13: indices\.shape\[1\] must be a known size, not a symbolic dimension "
     r"\(it holds the length of the index tuples\)"),
    (lambda: xgather.explain(xgather.onnx.gather_nd, S((B, 5), np.float32), S((3, 1), np.int32)),
     r"data\.shape\[0\] must be a known size"),
    (lambda: xgather.explain(xgather.onnx.gather_elements, S((B, 10), np.float32),
                             S((4, 3), np.int32), 1),
     r"indices\.shape\[0\] and data\.shape\[0\] off the gather axis must be the same "
     r"dimension where either is symbolic; got 4 vs B"),
])
def test_a_symbolic_dim_where_a_number_is_needed_is_named(call, message):
    with pytest.raises(xgather.XGatherError, match=message):
        call()


def test_the_default_mode_under_jax_export_says_what_to_do():
    with pytest.raises(xgather.XGatherError, match=r"xgather\.checked|mode=\"clip\""):
        export.export(jax.jit(xgather.onnx.gather))(S((10, 4), np.float32), S((B,), np.int32))
