"""The element gathers' two lowerings (XLA batching dims, and one linear index into the
flattened data) give the NumPy loops' results, and each other's, in every mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgather
from tests import reference as ref
from tests.helpers import rerun_with_x64

BOTH = ("batching_dims", "linear")

# name: (op, attributes, data shape, indices shape, the loops, their arguments)
CASES = {
    "elements-axis0": (xgather.onnx.gather_elements, dict(axis=0), (5, 4, 3), (7, 4, 3),
                       ref.gather_elements, dict(axis=0)),
    "elements-inner-smaller": (xgather.onnx.gather_elements, dict(axis=1), (5, 6, 7),
                               (3, 9, 2), ref.gather_elements, dict(axis=1)),
    "elements-last": (xgather.openvino.gather_elements, dict(axis=-1), (4, 6), (4, 11),
                      ref.gather_elements, dict(axis=1)),
    "nd-all-axes": (xgather.onnx.gather_nd, {}, (5, 6, 7), (4, 2, 3), ref.gather_nd, {}),
    "nd-batch": (xgather.onnx.gather_nd, dict(batch_dims=1), (3, 6, 7), (3, 5, 2),
                 ref.gather_nd, dict(batch_dims=1)),
    "nd-batch-2": (xgather.onnx.gather_nd, dict(batch_dims=2), (2, 3, 6), (2, 3, 4, 1),
                   ref.gather_nd, dict(batch_dims=2)),
    "openvino-nd": (xgather.openvino.gather_nd, dict(batch_dims=1), (3, 6, 7), (3, 5, 2),
                    ref.gather_nd, dict(batch_dims=1)),
}


def _draw(case, rng, mode, dtype=np.int32):
    op, attrs, dshape, ishape, loops, args = CASES[case]
    data = rng.standard_normal(dshape).astype(np.float32)
    axes = ([attrs.get("axis", 0) % len(dshape)] if loops is ref.gather_elements else
            list(range(attrs.get("batch_dims", 0), len(dshape))))
    s = min(dshape[a] for a in axes)
    lo, hi = (-s, s) if mode in ("error", "promise_in_bounds") else (-s - 3, s + 3)
    if np.issubdtype(dtype, np.unsignedinteger):
        lo = 0
    idx = rng.integers(lo, hi, ishape).astype(dtype)
    return op, attrs, data, idx, loops, args


def _run(op, attrs, mode, element, data, idx, how):
    with xgather.lowering(element_gather=element):
        plan = xgather.explain(op, data, idx, mode=mode, **attrs)
        assert plan.lowering == ("linear" if element == "linear" else
                                 ("batching_dims" if plan.index_vector is False else "vmap"))
        if how == "eager":
            return np.asarray(op(data, jnp.asarray(idx), mode=mode, **attrs))
        f = jax.jit(lambda d, i: op(d, i, mode=mode, **attrs))
        if mode == "error":
            f = xgather.checked(f, sync=True)
        return np.asarray(f(data, idx))


@pytest.mark.parametrize("how", ["eager", "jit"])
@pytest.mark.parametrize("mode", ["error", "clip", "fill", "promise_in_bounds"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_both_lowerings_match_the_loops(case, mode, how):
    rng = np.random.default_rng(7)
    op, attrs, data, idx, loops, args = _draw(case, rng, mode)
    want = loops(data, idx, **args, oob="error" if mode == "promise_in_bounds" else mode)
    results = [_run(op, attrs, mode, element, data, idx, how) for element in BOTH]
    for got in results:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case, dtype", [
    ("elements-inner-smaller", np.int64), ("nd-batch", np.int64),
    *[("openvino-nd", t) for t in (np.int8, np.int16, np.int64, np.uint8, np.uint16, np.uint32)]])
def test_every_index_dtype(case, dtype):  # OpenVINO's GatherND takes any integer type
    rng = np.random.default_rng(8)
    op, attrs, data, idx, loops, args = _draw(case, rng, "fill", dtype)
    want = loops(data, idx.astype(np.int64), **args, oob="fill", fill=-2)
    for element in BOTH:
        with xgather.lowering(element_gather=element):
            got = op(data, jnp.asarray(idx), mode="fill", fill_value=-2.0, **attrs)
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_out_of_range_index_is_reported_alike(case):
    rng = np.random.default_rng(9)
    op, attrs, data, idx, _, _ = _draw(case, rng, "error")
    idx.reshape(-1)[-1] = 99
    messages = []
    for element in BOTH:
        with xgather.lowering(element_gather=element):
            f = xgather.checked(jax.jit(lambda d, i: op(d, i, **attrs)), sync=True)
            with pytest.raises(xgather.OutOfBoundsError) as err:
                f(data, idx)
        messages.append(str(err.value).split(" (the gather was traced")[0])
    assert messages[0] == messages[1] and "index 99 at indices[" in messages[0]


@pytest.mark.parametrize("mode", ["clip", "fill"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_and_vmap_agree(case, mode):
    rng = np.random.default_rng(10)
    op, attrs, data, idx, _, _ = _draw(case, rng, mode)
    batch = np.stack([idx, idx[::-1] if idx.shape[0] == data.shape[0] else idx])
    results = []
    for element in BOTH:
        with xgather.lowering(element_gather=element):
            def loss(d, i):
                return (op(d, i, mode=mode, **attrs) ** 2).sum()
            grad = jax.jit(jax.grad(loss))(data, idx)
            mapped = jax.vmap(lambda i, d=data: op(d, i, mode=mode, **attrs))(batch)
        results.append((np.asarray(grad), np.asarray(mapped)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    # The gradient is the scatter-add of 2 * out at the positions read (the loops on an iota).
    iota = np.arange(data.size, dtype=np.int64).reshape(data.shape)
    _, _, _, _, loops, args = CASES[case]
    pos = loops(iota, idx, **args, oob=mode, fill=-1).reshape(-1)
    out = np.where(pos >= 0, data.reshape(-1)[np.maximum(pos, 0)], 0)
    expected = np.zeros(data.size, np.float32)
    np.add.at(expected, pos[pos >= 0], 2 * out[pos >= 0])
    np.testing.assert_allclose(results[0][0], expected.reshape(data.shape), rtol=1e-6)


def test_the_linear_lowering_is_left_where_positions_would_not_fit_an_int32():
    big = jax.ShapeDtypeStruct((2**16, 2**15 + 1), np.float32)  # 2**31 + 2**16 elements
    with xgather.lowering(element_gather="linear"):
        plan = xgather.explain(xgather.onnx.gather_elements, big,
                               jax.ShapeDtypeStruct((4, 3), np.int32), 1)
        small = xgather.explain(xgather.onnx.gather_elements, np.zeros((4, 5), np.float32),
                                np.zeros((4, 3), np.int32), 1)
    assert plan.lowering == "batching_dims" and small.lowering == "linear"
    assert "lowering: linear" in str(small)


def test_empty_indices_and_empty_axes():
    data = np.zeros((3, 0, 2), np.float32)
    for element in BOTH:
        with xgather.lowering(element_gather=element):
            out = xgather.onnx.gather_elements(data, np.zeros((3, 0, 2), np.int64), 1)
            assert out.shape == (3, 0, 2)
            filled = xgather.onnx.gather_nd(data, np.zeros((3, 3), np.int64), mode="fill",
                                            fill_value=5.0)
            np.testing.assert_array_equal(np.asarray(filled), np.full((3,), 5.0, np.float32))


@pytest.mark.subprocess
@pytest.mark.skipif(bool(jax.config.jax_enable_x64), reason="already the x64 run")
def test_with_x64_on():
    # 64-bit indices stay 64-bit there, and the linear positions with them.
    rerun_with_x64(__file__, "not x64_on")
