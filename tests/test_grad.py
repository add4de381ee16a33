"""Gradients of every op w.r.t. data: the scatter-add rule, all transformations, all modes."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import xgather
from tests import reference as ref

RNG = np.random.default_rng(42)


def _idx(shape, s, negative=True):
    return RNG.integers(-s if negative else 0, s, shape)


def cases():
    """(id, op(d, i), reference gather, its args, data shape, indices)."""
    out = []
    for r in range(1, 6):
        shape = (3, 2, 4, 2, 3)[:r]
        axis = r - 1 if r % 2 else 0
        idx = _idx((5,), shape[axis])
        idx[:2] = idx[0]  # duplicates
        out.append((f"onnx-gather-r{r}", functools.partial(xgather.onnx.gather, axis=axis),
                    ref.gather, dict(axis=axis), shape, idx))
        k = max(1, r // 2)
        tup = np.stack([_idx((4,), shape[j]) for j in range(k)], -1)
        tup[1] = tup[0]
        out.append((f"onnx-gather-nd-r{r}-k{k}", xgather.onnx.gather_nd, ref.gather_nd, {},
                    shape, tup))
        eshape = tuple(n + 2 if i == axis else n for i, n in enumerate(shape))
        out.append((f"onnx-gather-elements-r{r}",
                    functools.partial(xgather.onnx.gather_elements, axis=axis),
                    ref.gather_elements, dict(axis=axis), shape, _idx(eshape, shape[axis])))
    shape = (2, 3, 4)
    tup = np.stack([_idx((2, 5), shape[1]), _idx((2, 5), shape[2])], -1)
    out.append(("onnx-gather-nd-b1", functools.partial(xgather.onnx.gather_nd, batch_dims=1),
                ref.gather_nd, dict(batch_dims=1), shape, tup))
    bidx = _idx((2, 3, 6), 4)
    for v in (7, 8):
        out.append((f"openvino-gather{v}-b2",
                    functools.partial(xgather.openvino.gather, axis=2, batch_dims=-1, version=v),
                    ref.gather, dict(axis=2, batch_dims=2), shape, bidx))
    for v in (5, 8):
        out.append((f"openvino-gather-nd{v}-b1",
                    functools.partial(xgather.openvino.gather_nd, batch_dims=1, version=v),
                    (lambda d, i, v=v, **kw: ref.gather_nd(d, i, 1, **kw)), {}, shape, tup))
    out.append(("openvino-gather-elements",
                functools.partial(xgather.openvino.gather_elements, axis=1),
                ref.gather_elements, dict(axis=1), shape, _idx((2, 7, 4), 3)))
    pos = np.abs(tup) % 3
    out.append(("bnns-gather-nd-b1", functools.partial(xgather.bnns.gather_nd,
                                                       batch_dimension_count=1),
                ref.gather_nd, dict(batch_dims=1, negative=False), shape, pos))
    out.append(("bnns-gather-b1", functools.partial(xgather.bnns.gather, axis=2,
                                                    batch_dimension_count=1),
                ref.gather, dict(axis=2, batch_dims=1, negative=False), shape,
                _idx((2, 3), 4, negative=False)))
    out.append(("bnns-gather-along-axis", functools.partial(xgather.bnns.gather_along_axis,
                                                            axis=0),
                ref.gather_elements, dict(axis=0, negative=False), shape,
                _idx((4, 3, 4), 2, negative=False)))
    out.append(("labview-gather", functools.partial(xgather.labview.gather, axis=1),
                ref.gather, dict(axis=1), shape, _idx((3, 3), 3)))
    return [pytest.param(*c[1:], id=c[0]) for c in out]


CASES = cases()
# Second-order checks (slow: finite differences of derivatives, each compiled) and float16
# beside bfloat16 take every op but ONNX's odd ranks, which share the even ranks' rule.
SECOND = [c for c in CASES if not any(c.id.startswith(f"onnx-gather{kind}r{r}")
                                      for kind in ("-", "-nd-", "-elements-") for r in (1, 3, 5))]


@pytest.mark.parametrize("op, gref, kw, shape, idx", CASES)
def test_vjp_is_scatter_add(op, gref, kw, shape, idx):
    data = RNG.standard_normal(shape).astype(np.float32)
    out = np.asarray(op(data, idx))
    cot = RNG.standard_normal(out.shape).astype(np.float32)
    want = ref.vjp_data(gref, shape, cot, idx, **kw)
    _, vjp = jax.vjp(lambda d: op(d, idx), data)
    np.testing.assert_allclose(vjp(cot)[0], want, rtol=1e-5, atol=1e-6)
    # Under jit, with traced indices, and vmapped over a batch of cotangents.
    g = xgather.checked(sync=True)(jax.jit(lambda d, i, c: jax.vjp(lambda x: op(x, i), d)[1](c)[0]))
    np.testing.assert_allclose(g(data, idx, cot), want, rtol=1e-5, atol=1e-6)
    vg = jax.vmap(lambda c: vjp(c)[0])(np.stack([cot, 2 * cot]))
    np.testing.assert_allclose(vg[1], 2 * want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, gref, kw, shape, idx", SECOND)
def test_check_grads_order_2(op, gref, kw, shape, idx):
    data = jnp.asarray(RNG.standard_normal(shape), jnp.float32)
    check_grads(lambda d: jnp.tanh(op(d, idx)), (data,), order=2, modes=("fwd", "rev"),
                atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("op, gref, kw, shape, idx", CASES[:6])
def test_every_transformation(op, gref, kw, shape, idx):
    data = jnp.asarray(RNG.standard_normal(shape), jnp.float32)

    def f(d):
        return op(d, idx)

    n_out = int(np.prod(f(data).shape))
    jf = jax.jacfwd(f)(data)
    jr = jax.jacrev(f)(data)
    np.testing.assert_allclose(jf, jr)
    want = np.stack([ref.vjp_data(gref, shape, e.reshape(f(data).shape), idx, **kw)
                     for e in np.eye(n_out, dtype=np.float32)]).reshape(jr.shape)
    np.testing.assert_allclose(jr, want)
    tangent = RNG.standard_normal(shape).astype(np.float32)
    _, t = jax.jvp(f, (data,), (tangent,))
    np.testing.assert_allclose(t, gref(tangent, idx, **kw))
    h = jax.jit(jax.hessian(lambda d: (f(d) ** 2).sum()))(data)
    assert h.shape == data.shape * 2
    vh = jax.vmap(jax.grad(lambda d: (f(d) ** 2).sum()))(jnp.stack([data, -data]))
    np.testing.assert_allclose(vh[0], -vh[1], rtol=1e-6)


def test_indices_carry_no_gradient():
    data, idx = jnp.ones((4, 3)), jnp.array([0, 3, 3])
    gi = jax.grad(lambda d, i: xgather.onnx.gather(d, i, mode="clip").sum(), argnums=(0, 1),
                  allow_int=True)(data, idx)
    assert gi[1].dtype == jax.dtypes.float0
    _, ti = jax.jvp(lambda d: xgather.onnx.gather(d, idx).sum(), (data,), (jnp.ones_like(data),))
    assert float(ti) == 9.0


@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_out_of_range_gradients(mode):
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([-6, -4, -1, 0, 3, 4, 9])
    cot = np.arange(1, 1 + 7 * 3, dtype=np.float32).reshape(7, 3)
    for op, gref, i, kw in [
        (functools.partial(xgather.onnx.gather, axis=0, mode=mode), ref.gather, idx,
         dict(axis=0, oob=mode)),
        (functools.partial(xgather.onnx.gather_nd, mode=mode), ref.gather_nd,
         np.stack([idx, idx[::-1]], -1), dict(oob=mode)),
        (functools.partial(xgather.onnx.gather_elements, axis=0, mode=mode), ref.gather_elements,
         np.stack([idx] * 3, -1), dict(axis=0, oob=mode)),
    ]:
        out, vjp = jax.vjp(lambda d, op=op, i=i: op(d, i), data)
        c = cot[:, :out.shape[-1]] if out.ndim == 2 else cot[:, 0]
        np.testing.assert_allclose(vjp(c)[0], ref.vjp_data(gref, data.shape, c, i, **kw))


def test_checked_grad_composes():
    f = xgather.checked(jax.jit(jax.grad(lambda d, i: (xgather.onnx.gather_nd(d, i) ** 2).sum())),
                        sync=True)
    data = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(f(data, jnp.array([[1, -1], [1, 2]])),
                               [[0, 0, 0], [0, 0, 20.0]])
    with pytest.raises(xgather.OutOfBoundsError, match=r"index -3 at indices\[0, 0\]"):
        f(data, jnp.array([[-3, 0]]))


def test_hints_reach_the_lowering_and_keep_results():
    data = jnp.arange(12.0).reshape(6, 2)
    idx = jnp.array([0, 2, 5])

    def f(d, i):
        return xgather.onnx.gather(d, i, mode="promise_in_bounds", indices_are_sorted=True,
                                   unique_indices=True)

    text = jax.jit(f).lower(data, idx).as_text()
    assert "indices_are_sorted = true" in text
    grad_text = jax.jit(jax.grad(lambda d, i: f(d, i).sum())).lower(data, idx).as_text()
    assert "unique_indices = true" in grad_text and "indices_are_sorted = true" in grad_text
    np.testing.assert_allclose(f(data, idx), np.asarray(data)[[0, 2, 5]])
    g = jax.grad(lambda d: f(d, idx).sum())(data)
    np.testing.assert_allclose(g, ref.vjp_data(ref.gather, (6, 2), np.ones((3, 2)), idx))
    # clip can map distinct indices to one position: unique_indices is dropped there.
    text = jax.jit(jax.grad(lambda d: xgather.onnx.gather(d, idx, mode="clip",
                                                          unique_indices=True).sum())
                   ).lower(data).as_text()
    assert "unique_indices = true" not in text


# -- 16-bit floats: the gradient sums in float32 and rounds once -------------------------------

HALF = [jnp.bfloat16, jnp.float16]


def _sixteenths(shape):
    """Multiples of 1/16 in [-4, 4]: exact in bfloat16 and float16, and their sums in float32."""
    return (RNG.integers(-64, 65, shape) / 16).astype(np.float64)


def _sequential(shape, idx, cot, dtype):
    """The scatter-add as a 16-bit accumulator does it: rounding after every addition."""
    grad = np.zeros(shape, dtype)
    for k, row in zip(idx, cot, strict=True):
        grad[k] = (grad[k].astype(np.float32) + row.astype(np.float32)).astype(dtype)
    return grad


@pytest.mark.parametrize("op, gref, kw, shape, idx, dtype",
                         [pytest.param(*c.values, jnp.bfloat16, id=f"{c.id}-bfloat16")
                          for c in CASES] +
                         [pytest.param(*c.values, jnp.float16, id=f"{c.id}-float16")
                          for c in SECOND])
def test_half_precision_vjp_is_the_sum_rounded_once(op, gref, kw, shape, idx, dtype):
    data = jnp.asarray(RNG.standard_normal(shape), dtype)
    out, vjp = jax.vjp(lambda d: op(d, idx), data)
    cot = _sixteenths(out.shape)
    want = ref.vjp_data(gref, shape, cot, idx, **kw).astype(dtype)
    got = vjp(jnp.asarray(cot, dtype))[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got), want)
    g = xgather.checked(sync=True)(jax.jit(lambda d, i, c: jax.vjp(lambda x: op(x, i), d)[1](c)[0]))
    np.testing.assert_array_equal(np.asarray(g(data, idx, jnp.asarray(cot, dtype))), want)


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
def test_half_precision_hot_rows(dtype):
    # 512 lookups of 4 rows: 16-bit sums rounded after every addition are far off.
    shape, n = (6, 8), 512
    idx = RNG.integers(0, 4, n)
    idx[:4] = [0, 1, 2, -3]
    cot = _sixteenths((n, 8)) + 5  # same signs: the running sum grows past the 16-bit mantissa
    resolved = np.where(idx < 0, idx + 6, idx)
    exact = ref.scatter_add_take(shape, idx, cot, 0)
    assert not np.array_equal(_sequential(shape, resolved, cot, dtype), exact.astype(dtype))
    for op, scale in [(functools.partial(xgather.onnx.gather, axis=0), 1.0),
                      (functools.partial(xgather.labview.gather, axis=0, lda_coeff=0.5), 0.5),
                      (lambda d, i: xgather.onnx.gather_nd(d, i[:, None]), 1.0),
                      (functools.partial(xgather.openvino.gather, axis=0), 1.0)]:
        data = jnp.zeros(shape, dtype)
        want = (exact * scale).astype(dtype)
        grad = xgather.checked(sync=True)(jax.jit(jax.grad(
            lambda d, i, op=op: (op(d, i).astype(jnp.float32) * cot).sum())))(data, idx)
        assert grad.dtype == dtype
        np.testing.assert_array_equal(np.asarray(grad), want)
        vg = jax.vmap(lambda d, c, op=op: jax.vjp(lambda x: op(x, idx), d)[1](c)[0])(
            jnp.stack([data, data]), jnp.asarray(np.stack([cot, -cot]), dtype))
        np.testing.assert_array_equal(np.asarray(vg), np.stack([want, -want]))


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("op, gref, kw, shape, idx", [CASES[0], CASES[2], CASES[4], CASES[-1]])
def test_half_precision_forward_mode_and_hessian(op, gref, kw, shape, idx, dtype):
    data = jnp.asarray(_sixteenths(shape), dtype)
    tangent = jnp.asarray(_sixteenths(shape), dtype)
    out, t = jax.jvp(lambda d: op(d, idx), (data,), (tangent,))
    assert out.dtype == t.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out), gref(np.asarray(data), idx, **kw))
    np.testing.assert_array_equal(np.asarray(t), gref(np.asarray(tangent), idx, **kw))
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(lambda d: op(d, idx))(data)),
                                  np.asarray(jax.jacrev(lambda d: op(d, idx))(data)))
    if dtype == jnp.bfloat16:  # the Hessian: second order through the custom derivative
        h = jax.hessian(lambda d: (op(d, idx).astype(jnp.float32) ** 2).sum())(data)
        assert h.shape == data.shape * 2 and h.dtype == dtype


def test_float8_gradient_sums_in_float32():
    # OpenVINO's ops take float8 data: 2 bits of mantissa (e5m2) hold no running sum.
    import ml_dtypes
    dtype = ml_dtypes.float8_e5m2
    idx = np.array([0, 0, 1, 0] * 20)
    cot = np.full((80, 3), 0.75)
    exact = ref.scatter_add_take((4, 3), idx, cot, 0)  # rows 0 and 1: 45 and 15
    assert not np.array_equal(_sequential((4, 3), idx, cot, dtype), exact.astype(dtype))
    grad = jax.grad(lambda d: (xgather.openvino.gather(d, idx, axis=0).astype(jnp.float32)
                               * cot).sum())(jnp.zeros((4, 3), dtype))
    assert grad.dtype == dtype
    np.testing.assert_array_equal(np.asarray(grad), exact.astype(dtype))


# -- derivatives of loops: JAX drops checkify checks from a loop body in reverse mode ----------

def _scan_loss(op):
    return lambda d, i: jax.lax.scan(lambda c, ii: (c + op(d, ii).sum(), None), 0.0, i)[0]


def test_reverse_mode_through_a_loop_is_exact_for_in_range_negative_indices():
    # Large index arrays, in-range negative indices, a dropped check: the results stay exact.
    op = functools.partial(xgather.onnx.gather_elements, axis=1)
    data = np.zeros((2, 9000), np.float32)
    idx = RNG.integers(-9000, 9000, (3, 2, 9000))
    want = sum(ref.vjp_data(ref.gather_elements, data.shape, np.ones((2, 9000)), i, axis=1)
               for i in idx)
    with pytest.warns(xgather.UncheckedWarning, match=r"onnx\.GatherElements-13: its "
                      r'mode="error" check is traced in a lax\.scan'):
        g = xgather.checked(sync=True)(jax.jit(jax.grad(_scan_loss(op))))(data, idx)
    np.testing.assert_array_equal(np.asarray(g), want)


def test_reverse_mode_through_a_loop_drops_the_check_as_documented():
    # The README's limit: JAX (0.10.2) drops a check inside a differentiated loop body. If
    # this starts raising, JAX has fixed it: drop the warning and this test.
    op = functools.partial(xgather.onnx.gather, axis=1)
    bad = np.array([[0, 5]])
    for loss in (_scan_loss(op),
                 lambda d, i: jax.lax.map(lambda ii: op(d, ii), i).sum()):
        with pytest.warns(xgather.UncheckedWarning):
            xgather.checked(sync=True)(jax.jit(jax.grad(loss)))(np.zeros((1, 3), np.float32), bad)


def test_loops_keep_their_checks_outside_reverse_mode():
    op = functools.partial(xgather.onnx.gather, axis=1)
    data, bad = np.zeros((2, 3), np.float32), np.array([[0, -1], [2, 5]])
    msg = r"^onnx\.Gather-13: index 5 at indices\[1\] is out of range \[-3, 2\]"
    loss = _scan_loss(op)
    fwd = jax.jit(lambda d, i: jax.jvp(lambda x: loss(x, i), (d,), (jnp.ones_like(d),)))
    for fn in (jax.jit(loss), fwd, jax.jit(jax.grad(lambda d, i: op(d, i[1]).sum()))):
        with pytest.raises(xgather.OutOfBoundsError, match=msg):
            xgather.checked(fn, sync=True)(data, bad)  # no UncheckedWarning (warnings: errors)


# -- explain's notes: printed after the plan's own fields, not part of its identity ----------

def test_a_plan_prints_its_own_fields_and_explain_adds_the_traced_lines():
    """explain's notes (the form of the bound check's flag) print after the plan's own
    fields, and are not part of the plan's identity: a plan without them is equal to it."""
    d, i = np.zeros((5, 2), np.float32), np.zeros(3, np.int64)
    plan = xgather.explain(xgather.onnx.gather, d, i)
    bare = dataclasses.replace(plan, notes=())
    assert plan.notes and plan == bare and hash(plan) == hash(bare)
    text = str(bare)
    assert "gradient:" not in text and "bound check" not in text
    assert str(plan) == text + "\n  " + "\n  ".join(plan.notes)
