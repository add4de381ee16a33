"""The LabVIEW Gather block: ONNX Gather-13 forward, lda coeff / training? backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import xgather
from tests import reference as ref
from tests.helpers import assert_same, check_everywhere

lv = xgather.labview


# The table of labview-deep-learning-gather.txt (P, Q, R, S = 3, 4, 2, 5).
@pytest.mark.parametrize("dshape, ishape, axis, oshape", [
    ((3, 4), (), 0, (4,)), ((3, 4, 2), (), 1, (3, 2)),
    ((3, 4), (2, 5), 0, (2, 5, 4)), ((3, 4), (2, 5), 1, (3, 2, 5)),
])
def test_spec_table(dshape, ishape, axis, oshape):
    rng = np.random.default_rng(0)
    data = rng.standard_normal(dshape).astype(np.float32)
    idx = rng.integers(-dshape[axis], dshape[axis], ishape).astype(np.int64)
    check_everywhere(lambda d, i: lv.gather(d, i, axis), data, idx,
                     lambda d, i: ref.gather(d, i, axis))
    assert lv.gather(data, idx, axis).shape == oshape


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("coeff", [1.0, 0.5, -2.0])
@pytest.mark.parametrize("axis", [0, 1])
def test_gradient_is_scaled_scatter_add(training, coeff, axis):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[0, -1, 0], [2, 2, -3]])  # duplicates and negatives
    cot = rng.standard_normal(ref.gather(data, idx, axis).shape).astype(np.float32)
    want = ref.scatter_add_take(data.shape, idx, cot, axis, scale=coeff if training else 0.0)

    def f(d):
        return lv.gather(d, idx, axis, training=training, lda_coeff=coeff)

    _, vjp = jax.vjp(f, data)
    np.testing.assert_allclose(vjp(cot)[0], want, rtol=1e-6)
    # Reverse mode agrees with forward mode (jacfwd) and under jit.
    jac_f = jax.jacfwd(f)(data)
    np.testing.assert_allclose(np.tensordot(cot, jac_f, cot.ndim), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda d: (f(d) * cot).sum()))(data), want,
                               rtol=1e-6)


def test_forward_value_ignores_the_coefficient():
    data = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    for training, coeff in [(True, -2.0), (False, 0.5)]:
        assert_same(lv.gather(data, [2, -3], training=training, lda_coeff=coeff),
                    ref.gather(data, np.array([2, -3])))


def test_check_grads_order_2():
    data = jnp.asarray(np.random.default_rng(2).standard_normal((5, 3)), jnp.float32)
    idx = np.array([[4, 0], [-1, 2]])
    check_grads(lambda d: jnp.sin(lv.gather(d, idx, 0)), (data,), order=2, modes=("fwd", "rev"),
                atol=1e-2, rtol=1e-2)
    h = jax.hessian(lambda d: (lv.gather(d, idx % 3, 1, lda_coeff=0.5) ** 2).sum())(data)
    # Both derivatives carry the coefficient: H = 2 * coeff**2 * (times each column is read).
    counts = np.bincount((idx % 3).ravel(), minlength=3)
    want = np.einsum("ik,jl->ijkl", np.eye(5), np.diag(2 * 0.25 * counts))
    np.testing.assert_allclose(h, want, rtol=1e-6)


def test_name_labels_the_lowered_program_and_explain():
    data, idx = np.zeros((3, 2), np.float32), np.array([1])
    f = jax.jit(lambda d: lv.gather(d, idx, name="embed", specified_outputs_name=["rows"],
                                    mode="clip"))
    text = f.lower(data).as_text(debug_info=True)
    assert "labview.Gather[embed]->rows" in text
    plan = xgather.explain(lv.gather, data, idx, name="embed", specified_outputs_name=["rows"])
    assert plan.op == "labview.Gather[embed]->rows"
    with pytest.raises(xgather.OutOfBoundsError, match=r"^labview\.Gather\[embed\]: index 3"):
        lv.gather(data, [3], name="embed")


def test_checked_grad_raises_on_bad_index():
    g = xgather.checked(jax.jit(jax.grad(lambda d, i: lv.gather(d, i, lda_coeff=2.0).sum())),
                        sync=True)
    np.testing.assert_allclose(g(jnp.ones(3), jnp.array([0, 0])), [4.0, 0.0, 0.0])
    with pytest.raises(xgather.OutOfBoundsError, match="index 3 at indices"):
        g(jnp.ones(3), jnp.array([0, 3]))


def test_bad_inputs():
    with pytest.raises(xgather.XGatherTypeError, match=r"^labview\.Gather: indices must be int32 "
                                                        r"or int64; got float32"):
        lv.gather(np.zeros(3), np.zeros(2, np.float32))
    with pytest.raises(xgather.XGatherError, match=r"labview\.Gather\[n\]: axis must be in "
                                                    r"\[-1, 0\]"):
        lv.gather(np.zeros(3), [0], axis=1, name="n")
