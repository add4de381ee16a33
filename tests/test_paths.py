"""Every fast path against the NumPy loops: cached eager calls, the flag program, the fast
``xgather.checked``, both places of the negative wrap, and the lowering of other backends.

Each path is taken on purpose (the test asserts which one ran) and must give the same
results, the same errors and the same messages as the spec's loops in tests/reference.py.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgather
from tests import reference as ref
from tests.helpers import assert_same
from xgather import OutOfBoundsError, _frontend, _gather, _lower, _plan

G, ND, EL = xgather.onnx.gather, xgather.onnx.gather_nd, xgather.onnx.gather_elements


def _message(op, value, where, lo, hi, axis, size, count=1):
    return re.escape(f"{op}: index {value} at indices[{where}] is out of range [{lo}, {hi}] "
                     f"for data axis {axis} of size {size} ({count} out-of-range value(s) in "
                     "indices)")


def _runners_for(op):
    return [k for k in _frontend.RUNNERS if k[0] is op]


@pytest.mark.parametrize("kind", ["numpy", "jax"])
def test_cached_eager_calls_check_every_call(kind):
    """The second call of a signature hits the cache, and still checks its own indices."""
    put = np.asarray if kind == "numpy" else jnp.asarray
    data = put(np.arange(20, dtype=np.float32).reshape(4, 5))
    good, bad = put(np.array([0, -1, 3], np.int32)), put(np.array([0, 4, -6], np.int32))
    before = len(_runners_for(G))
    assert_same(G(data, good, 1), ref.gather(np.asarray(data), np.asarray(good), 1))
    assert len(_runners_for(G)) == before + 1  # the signature is cached now
    with pytest.raises(OutOfBoundsError, match=_message("onnx.Gather-13", -6, 2, -5, 4, 1, 5)):
        G(data, bad, 1)
    assert len(_runners_for(G)) == before + 1  # ... and that call reused it
    shifted = put(np.array([1, 2, -5], np.int32))
    assert_same(G(data, shifted, 1), ref.gather(np.asarray(data), np.asarray(shifted), 1))


@pytest.mark.parametrize("op, idx, args, cols", [(G, [[1, -2]], (1,), 13),
                                                 (ND, [[0, 2], [-1, 1]], (), 14),
                                                 (EL, [[0, 2, 1]], (1,), 15)])
def test_an_eager_call_on_numpy_arrays_compiles_one_program(op, idx, args, cols,
                                                            backend_compiles):
    """The gather only: NumPy data goes to the device as a transfer (jnp.asarray would
    compile an identity program per shape first, as long as the gather's compile)."""
    data = np.arange(3 * cols, dtype=np.float32).reshape(3, cols)  # shapes no other test uses
    idx = np.asarray(idx, np.int32)
    want = {G: ref.gather, ND: ref.gather_nd, EL: ref.gather_elements}[op](data, idx, *args)
    assert_same(op(data, idx, *args), want)
    assert len(backend_compiles) == 1
    assert_same(op(data, idx, *args), want)
    assert len(backend_compiles) == 1


def test_cached_calls_follow_the_default_mode_and_their_arguments():
    data, idx = np.arange(6, dtype=np.float32), np.array([1, 9], np.int64)
    with pytest.raises(OutOfBoundsError):
        G(data, idx)
    with xgather.default_mode("fill"):
        assert_same(G(data, idx), ref.gather(data, idx, oob="fill"))
    with pytest.raises(OutOfBoundsError):
        G(data, idx)
    assert_same(G(data, idx, mode="clip"), ref.gather(data, idx, oob="clip"))
    assert_same(G(data, idx, 0, mode="fill", fill_value=7.0),
                ref.gather(data, idx, oob="fill", fill=7))
    assert_same(G(data, idx, 0, mode="fill", fill_value=-1.0),
                ref.gather(data, idx, oob="fill", fill=-1))
    # True == 1 as a dict key: the type keeps bool attributes apart from ints.
    with pytest.raises(xgather.XGatherError, match="axis must be an int"):
        G(data.reshape(2, 3), np.array([0], np.int64), True)
    G(data.reshape(2, 3), np.array([0], np.int64), 1)
    with pytest.raises(xgather.XGatherError, match="axis must be an int"):
        G(data.reshape(2, 3), np.array([0], np.int64), True)


@pytest.mark.parametrize("axis", [np.int64(1), np.int32(-1), np.array(1)], ids=repr)
def test_every_op_takes_a_numpy_integer_axis(axis):
    d = np.arange(12, dtype=np.float32).reshape(3, 4)
    i1, i2 = np.array([3, 0], np.int32), np.array([[3], [0], [2]], np.int32)
    assert_same(xgather.onnx.gather(d, i1, axis), ref.gather(d, i1, 1))
    assert_same(xgather.labview.gather(d, i1, axis=axis), ref.gather(d, i1, 1))
    assert_same(xgather.openvino.gather(d, i1, axis), ref.gather(d, i1, 1, oob="fill"))
    assert_same(xgather.bnns.gather(d, i1, axis), ref.gather(d, i1, 1))
    for op in (xgather.onnx.gather_elements, xgather.openvino.gather_elements,
               xgather.bnns.gather_along_axis):
        assert_same(op(d, i2, axis=axis), np.take_along_axis(d, i2, 1))
    for bad in (np.True_, np.float64(1.0), np.array([1])):
        with pytest.raises(xgather.XGatherError, match="axis must be an int"):
            xgather.onnx.gather(d, i1, bad)


def test_cached_calls_keep_64_bit_index_checks():
    """NumPy int64 indices are converted on every call; a value beyond int32 stays out of
    range (reported as given, filled, clamped)."""
    data = np.arange(4, dtype=np.float32)
    wide = np.array([2**32 + 1, 0], np.int64)
    for _ in range(2):
        assert_same(G(data, np.array([3, -4], np.int64)), ref.gather(data, [3, -4]))
        with pytest.raises(OutOfBoundsError, match=r"index 4294967297 at indices\[0\]"):
            G(data, wide)
        assert_same(G(data, wide, mode="fill", fill_value=-1.0),
                    ref.gather(data, wide, oob="fill", fill=-1.0))
        assert_same(G(data, wide, mode="clip"), ref.gather(data, wide, oob="clip"))


_D34 = np.arange(12.0, dtype=np.float32).reshape(3, 4)
_LONG = np.arange(200, dtype=np.int32) % 4  # over 64 values: NumPy's min and max decide


@pytest.mark.parametrize("call, good, bad, want", [
    # scalar bounds, 10 values (Python's min and max), too high and too low
    (lambda i: G(_D34, i, 1), np.arange(-4, 4, dtype=np.int32),
     np.array([0, 1, 4], np.int32), _message("onnx.Gather-13", 4, 2, -4, 3, 1, 4)),
    (lambda i: G(_D34, i, 1), np.array([3, -4], np.int32),
     np.array([-5, 0], np.int32), _message("onnx.Gather-13", -5, 0, -4, 3, 1, 4)),
    # over 64 values, the bad one last
    (lambda i: G(_D34, i, 1), _LONG, np.append(_LONG, np.int32(9)),
     _message("onnx.Gather-13", 9, 200, -4, 3, 1, 4)),
    # index vectors: each component against its own axis (3 fits axis 1, not axis 0)
    (lambda i: ND(_D34, i), np.array([[2, 3], [-3, -4]], np.int32),
     np.array([[0, 3], [3, 0]], np.int32), _message("onnx.GatherND-13", 3, "1, 0", -3, 2, 0, 3)),
    (lambda i: ND(_D34, i), np.tile(np.array([[2, 3]], np.int32), (100, 1)),
     np.array([[0, 0]] * 99 + [[0, -5]], np.int32),
     _message("onnx.GatherND-13", -5, "99, 1", -4, 3, 1, 4)),
    # no negative indices: the range starts at 0
    (lambda i: G(_D34, i, 1, negative_indices=False), np.array([0, 3], np.int32),
     np.array([0, -1], np.int32),
     re.escape("onnx.Gather-13: index -1 at indices[1] is out of range [0, 3] for data axis 1 "
               "of size 4 (1 out-of-range value(s) in indices)")),
    # unsigned indices (OpenVINO takes any integer type)
    (lambda i: xgather.openvino.gather_nd(_D34, i), np.array([[2, 3]], np.uint32),
     np.array([[2, 4]], np.uint32), "openvino.GatherND-8: index 4 at indices\\[0, 1\\]"),
], ids=["high", "low", "long", "vector", "vector-long", "nonnegative", "unsigned"])
def test_cached_numpy_calls_check_every_range_form(call, good, bad, want):
    """The host check of a cached eager call settles the range once per signature: each
    form of it (Python's or NumPy's min and max, index vectors, no negative indices,
    unsigned indices) reports as the uncached check does, and passes what is in range."""
    for _ in range(2):  # the first call settles the signature, the second reuses it
        with pytest.raises(OutOfBoundsError, match="^" + want):
            call(bad)
    if good.ndim == 2:
        want_good = ref.gather_nd(_D34, good.astype(np.int64))
    else:
        want_good = ref.gather(_D34, good, 1)
    for _ in range(2):
        assert_same(call(good), want_good)


@pytest.mark.parametrize("op, data, indices, args, want", [
    (G, np.arange(12.0, dtype=np.float32).reshape(3, 4), np.array([[0, 7]], np.int32), (1,),
     _message("onnx.Gather-13", 7, "0, 1", -4, 3, 1, 4)),
    (ND, np.arange(12.0, dtype=np.float32).reshape(3, 4), np.array([[0, 0], [-4, 1]], np.int32),
     (), _message("onnx.GatherND-13", -4, "1, 0", -3, 2, 0, 3)),
    (EL, np.arange(12.0, dtype=np.float32).reshape(3, 4), np.full((3, 4), -5, np.int32), (1,),
     _message("onnx.GatherElements-13", -5, "0, 0", -4, 3, 1, 4, count=12)),
])
def test_device_flag_reports_as_the_host_check(op, data, indices, args, want):
    """Device indices: the program's flag, then the report from the indices themselves."""
    for put in (np.asarray, jnp.asarray):
        for _ in range(2):  # the first call settles the signature, the second reuses it
            with pytest.raises(OutOfBoundsError, match="^" + want + "$"):
                op(put(data), put(indices), *args)


def test_checked_traces_one_program_that_carries_the_report():
    """One trace per argument structure, bad calls included: no rerun, no second program."""
    calls = []

    def f(d, i):
        calls.append(1)
        return G(d, i, 1).sum(axis=-1)

    g = xgather.checked(sync=True)(f)
    data = np.arange(20, dtype=np.float32).reshape(4, 5)
    for i in ([0, 1], [4, 3], [2, -2]):
        i = np.array(i, np.int32)
        np.testing.assert_allclose(g(data, i), ref.gather(data, i, 1).sum(axis=-1))
    with pytest.raises(OutOfBoundsError, match=_message("onnx.Gather-13", 5, 1, -5, 4, 1, 5)):
        g(data, np.array([0, 5], np.int32))
    two_bad = _message("onnx.Gather-13", -6, 0, -5, 4, 1, 5, count=2)
    with pytest.raises(OutOfBoundsError, match=two_bad):
        g(data, np.array([-6, 5], np.int32))
    assert len(calls) == 1


@pytest.fixture
def branch_wrap(monkeypatch):
    """Plans whose wrap takes a branch at any size (XLA:CPU's lowering choices, which are
    exact on every platform)."""
    monkeypatch.setattr(_lower, "SEPARATE_WRAP", 1)
    xgather._frontend.clear_caches()
    with xgather.lowering("cpu"):
        yield
    xgather._frontend.clear_caches()


@pytest.mark.parametrize("sync", [False, True], ids=["deferred", "sync"])
def test_checked_is_exact_for_negative_indices_where_the_wrap_branches(branch_wrap, sync):
    """Every result is the spec's before any flag is read: in-range negative indices are
    wrapped by the one program, which also reports a bad index."""
    calls = []

    def f(d, i):
        calls.append(1)
        return G(d, i, 1) * 2

    g = xgather.checked(jax.jit(f), sync=sync)
    data = np.arange(20, dtype=np.float32).reshape(4, 5)
    for i in ([[0, 4], [1, 2]], [[-5, 4], [-1, 2]], [[-1, -2], [3, -5]]):
        i = np.array(i, np.int32)
        np.testing.assert_allclose(g(data, i), 2 * ref.gather(data, i, 1))
    with pytest.raises(OutOfBoundsError, match=_message("onnx.Gather-13", 5, "1, 0", -5, 4, 1,
                                                        5)):
        g(data, np.array([[-5, 4], [5, 2]], np.int32))  # sync: raises here
        xgather.raise_if_error()  # deferred: here
    assert len(calls) == 1


def test_device_indices_take_one_exact_program(branch_wrap):
    """Eager calls on device indices: one program, exact for negative indices, whose flag
    is read at the call; errors are the host check's."""
    from xgather import _apply
    data = jnp.asarray(np.arange(30, dtype=np.float32).reshape(5, 6))
    idx = np.array([0, 5, 3], np.int32)
    plan = xgather.explain(G, data, idx, 1)
    exact = _apply.program(_gather.Call(plan, "promise_in_bounds"), True)
    before = exact._cache_size()
    for i in ([0, 5, 3], [-6, 5, -1], [1, 2, 3], [-2, 0, 0]):
        i = np.array(i, np.int32)
        assert_same(G(data, jnp.asarray(i), 1), ref.gather(np.asarray(data), i, 1))
    with pytest.raises(OutOfBoundsError, match=_message("onnx.Gather-13", -7, 2, -6, 5, 1, 6)):
        G(data, jnp.asarray(np.array([0, -6, -7], np.int32)), 1)
    assert exact._cache_size() == before + 1


def test_checked_reports_under_vmap_and_grad():
    g = xgather.checked(sync=True)(jax.vmap(lambda d, i: G(d, i)))
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[0, -3], [2, 1]], np.int32)
    assert_same(g(data, idx), np.stack([ref.gather(data[k], idx[k]) for k in range(2)]))
    with pytest.raises(OutOfBoundsError, match="index 3 at indices"):
        g(data, np.array([[0, 1], [3, 1]], np.int32))
    dg = xgather.checked(sync=True)(jax.grad(lambda d, i: (G(d, i) ** 2).sum()))
    idx = np.array([0, 0, -1], np.int32)
    d = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(dg(d, idx), ref.scatter_add_take(d.shape, idx, 2 * d[[0, 0, 2]]))
    with pytest.raises(OutOfBoundsError, match="index -4 at indices"):
        dg(d, np.array([0, -4], np.int32))


CASES = [  # (op, data shape, indices shape, args, index bound, reference)
    (G, (7, 5), (6,), (0,), 7, lambda d, i: ref.gather(d, i, 0)),
    (G, (3, 4, 6), (2, 2), (1,), 4, lambda d, i: ref.gather(d, i, 1)),
    (G, (5, 9), (4,), (1,), 9, lambda d, i: ref.gather(d, i, 1)),
    (EL, (4, 6), (4, 5), (1,), 6, lambda d, i: ref.gather_elements(d, i, 1)),
    (ND, (5, 6, 3), (4, 2), (), 5, lambda d, i: ref.gather_nd(d, i)),
    (ND, (5, 6), (7, 2), (), 5, lambda d, i: ref.gather_nd(d, i)),
]


@pytest.fixture(params=["fused", "branch"])
def wrap_pass(request, monkeypatch):
    """Plans made with the wrap inside the gather, or in a branch ("separate" for row
    gathers, "gather" for element gathers: see _expected_pass), with XLA:CPU's lowering
    choices (exact on every platform; the other platforms' are tested below)."""
    monkeypatch.setattr(_lower, "SEPARATE_WRAP", 1 if request.param == "branch" else 2**62)
    xgather._frontend.clear_caches()
    with xgather.lowering("cpu"):
        yield request.param
    xgather._frontend.clear_caches()


def _expected_pass(wrap_pass, plan):
    if wrap_pass == "fused":
        return "fused"
    return "separate" if np.prod(plan.out_shape) >= _lower.ROWS * plan.index_count else "gather"


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_the_cases_take_every_pass(monkeypatch, platform):
    """With the size rule (the CPU's choice; on the GPU, ``wrap="by_size"``)."""
    monkeypatch.setattr(_lower, "SEPARATE_WRAP", 1)
    with xgather.lowering(platform, wrap="by_size"):
        passes = {xgather.explain(op, np.zeros(d, np.float32), np.zeros(i, np.int32),
                                  *a).wrap_pass for op, d, i, a, _, _ in CASES}
    # Without row batching, the gather inside (3, 4, 6) copies slices of 18 elements.
    assert passes == ({"separate", "gather"} if platform == "cpu" else
                      {"separate", "gather", "fused"})


def _reference(op, data, idx, args, oob):
    if op is ND:
        return ref.gather_nd(data, idx, oob=oob)
    if op is EL:
        return ref.gather_elements(data, idx, *args, oob=oob)
    return ref.gather(data, idx, *args, oob=oob)


# Index draws: "mixed" has negative (and, but for error, out-of-range) indices, so the
# separate pass takes its branch; "inside" lies in [0, s-1], where the branch is skipped.
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("mode", ["error", "clip", "fill", "promise_in_bounds"])
@pytest.mark.parametrize("draw", ["mixed", "inside"])
def test_both_wrap_passes_match_the_loops(case, mode, draw, wrap_pass):
    op, dshape, ishape, args, s, want = case
    rng = np.random.default_rng(1)
    data = rng.standard_normal(dshape).astype(np.float32)
    lo, hi = (-s, s) if mode in ("error", "promise_in_bounds") else (-s - 2, s + 2)
    idx = rng.integers(0 if draw == "inside" else lo, s if draw == "inside" else hi, ishape)
    idx = idx.astype(np.int32)
    if draw == "mixed":
        idx.reshape(-1)[0] = -1  # at least one negative index, in range
    assert (idx < 0).any() == (draw == "mixed")
    plan = xgather.explain(op, data, idx, *args)
    assert plan.wrap_pass == _expected_pass(wrap_pass, plan)
    assert _plan._WRAP_TEXT[plan.wrap_pass] in str(plan)
    oob = {"error": "error", "clip": "clip", "fill": "fill", "promise_in_bounds": "error"}[mode]
    reference = _reference(op, data, idx, args, oob)
    f = jax.jit(lambda d, i: op(d, i, *args, mode=mode))
    if mode == "error":
        f = xgather.checked(f)
    assert_same(f(data, idx), reference)
    assert_same(op(data, idx, *args, mode=mode), reference)  # NumPy indices: the host check
    assert_same(op(data, jnp.asarray(idx), *args, mode=mode), reference)  # the device flag


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("where", ["negative", "past"])
def test_both_wrap_passes_report_a_bad_index(case, where, wrap_pass):
    """A bad index beside in-range ones (negative or not) is reported the same on each path."""
    op, dshape, ishape, args, s, want = case
    rng = np.random.default_rng(3)
    data = rng.standard_normal(dshape).astype(np.float32)
    idx = rng.integers(0, s, ishape).astype(np.int32)
    flat = idx.reshape(-1)
    flat[0] = -1  # a valid negative index: the branch is taken in either case
    last = flat.size - (ishape[-1] if op is ND else 1)  # a component bounded by s
    flat[last] = -s - 1 if where == "negative" else s
    with pytest.raises(OutOfBoundsError) as host:
        op(data, idx, *args)
    message = re.escape(str(host.value))
    assert f"index {flat[last]} at indices[" in str(host.value)
    with pytest.raises(OutOfBoundsError, match=message):
        op(data, jnp.asarray(idx), *args)
    with pytest.raises(OutOfBoundsError, match=message):
        xgather.checked(sync=True)(jax.jit(lambda d, i: op(d, i, *args)))(data, idx)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("mode", ["error", "clip", "fill"])
def test_both_wrap_passes_differentiate(case, mode, wrap_pass):
    """The gradient through either pass is the scatter-add of the cotangent at the positions
    the NumPy loops read (found by gathering a flat iota); fill sends none back."""
    op, dshape, ishape, args, s, want = case
    rng = np.random.default_rng(4)
    data = rng.standard_normal(dshape).astype(np.float32)
    lo, hi = (-s, s) if mode == "error" else (-s - 2, s + 2)
    idx = rng.integers(lo, hi, ishape).astype(np.int32)
    idx.reshape(-1)[0] = -1
    iota = np.arange(data.size, dtype=np.int64).reshape(dshape)
    pos = _reference(op, iota, idx, args, mode)  # the flat position each output reads
    if mode == "fill":  # a filled slot reads nothing: gathering ones tells which
        pos = np.where(_reference(op, np.ones(dshape), idx, args, "fill") == 0, -1, pos)
    out = np.where(pos >= 0, data.reshape(-1)[np.maximum(pos, 0)], 0)
    expected = np.zeros(data.size, np.float32)
    np.add.at(expected, pos[pos >= 0], 2 * out[pos >= 0])
    f = jax.grad(lambda d, i: (op(d, i, *args, mode=mode) ** 2).sum())
    if mode == "error":
        f = xgather.checked(f)
    np.testing.assert_allclose(f(data, idx), expected.reshape(dshape), rtol=1e-6)


@pytest.mark.parametrize("platform", _lower.PLATFORMS)
def test_the_default_threshold_takes_each_pass(platform):
    """The size rule, as the CPU takes it (and an accelerator under ``wrap="by_size"``)."""
    def wrap_pass(op, dshape, ishape, *args):
        with xgather.lowering(platform, wrap="by_size"):
            return xgather.explain(op, np.zeros(dshape, np.float32),
                                   np.zeros(ishape, np.int32), *args).wrap_pass
    assert wrap_pass(G, (100, 16), (10,)) == "fused"  # small
    assert wrap_pass(G, (100, 512), (1024,)) == "fused"  # rows of 512: once per row
    assert wrap_pass(ND, (64, 64, 8), (4096, 2)) == "fused"  # rows of 8
    assert wrap_pass(ND, (64, 64, 4), (8192, 2)) == "separate"  # rows of 4
    # Along axis 1: one element per slice where the rows are batched (XLA:CPU), else
    # slices of 64 elements (one per row), which wrap once per slice.
    inner = wrap_pass(G, (64, 1024), (512,), 1)
    assert inner == ("separate" if platform == "cpu" else "fused")
    assert wrap_pass(EL, (256, 256), (256, 256)) == "gather"


@pytest.mark.parametrize("mode", ["error", "clip", "fill"])
def test_large_row_gathers_wrap_inside_the_gather(mode):
    """Rows of ROW_SLICE elements or more keep the wrap in the gather at any size."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((300, 8)).astype(np.float32)
    lo, hi = (-300, 300) if mode == "error" else (-303, 303)
    idx = rng.integers(lo, hi, 4096).astype(np.int32)
    idx[0] = -1
    plan = xgather.explain(G, data, idx)
    assert plan.wrap_pass == "fused" and math.prod(plan.out_shape) >= _lower.SEPARATE_WRAP
    want = ref.gather(data, idx, oob=mode)
    f = jax.jit(lambda d, i: G(d, i, mode=mode))
    assert_same((xgather.checked(f) if mode == "error" else f)(data, idx), want)
    assert_same(G(data, jnp.asarray(idx), mode=mode), want)


@pytest.mark.parametrize("element", _lower.ELEMENT_GATHERS)
@pytest.mark.parametrize("platform", _lower.PLATFORMS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[2]}")
def test_every_platforms_lowering_runs_here_too(case, platform, element):
    """Plans made with each platform's choices (and each element lowering) give the loops'
    results on this machine, eagerly, under jit and under the checked default."""
    op, dshape, ishape, args, s, want = case
    rng = np.random.default_rng(2)
    data = rng.standard_normal(dshape).astype(np.float32)
    idx = rng.integers(-s, s, ishape).astype(np.int32)
    with xgather.lowering(platform, element_gather=element):
        plan = xgather.explain(op, data, idx, *args)
        assert plan.platform == platform
        assert f"(chosen for the {platform} platform)" in str(plan)
        flag = (f"a float32 max over the {idx.size}" if platform == "cpu" else
                f"jnp.any over the {idx.size} index values")
        assert f"on device indices eagerly, {flag}" in str(plan)
        elements = op is EL or (op is ND and ishape[-1] == len(dshape))
        assert (plan.lowering == "linear") == (elements and element == "linear")
        assert_same(op(data, idx, *args), want(data, idx))
        assert_same(op(data, jnp.asarray(idx), *args), want(data, idx))
        assert_same(xgather.checked(jax.jit(lambda d, i: op(d, i, *args)))(data, idx),
                    want(data, idx))


@pytest.mark.parametrize("platform", _lower.PLATFORMS)
def test_each_platform_takes_its_choices(platform):
    """The table of :mod:`xgather._lower`, as the plans show it: row batching on XLA:CPU
    only; the flag a float32 max there and jnp.any elsewhere; element gathers as batching
    dims until a GPU measurement says otherwise."""
    with xgather.lowering(platform):
        inner = xgather.explain(G, np.zeros((3, 4, 6), np.float32), np.zeros(2, np.int32), 1)
        elems = xgather.explain(EL, np.zeros((3, 4), np.float32), np.zeros((3, 2), np.int32), 1)
    assert inner.platform == elems.platform == platform
    assert inner.lowering == ("vmap+row_batching" if platform == "cpu" else "vmap")
    assert elems.lowering == "batching_dims"
    assert ("float32 max" in str(inner)) == (platform == "cpu")


#: 64-bit indices beyond int32, then in range: XLA:CPU and XLA:GPU (an H200, jax 0.11.2)
#: keep only the low 32 bits of such an index (``2**32 + 5`` would read row 5, ``2**40``
#: row 0), so every platform's choices saturate them into int32 first.
_WIDE = np.array([2**32 + 5, 2**40, -2**40, np.iinfo(np.int64).min, np.iinfo(np.int64).max,
                  2**31, -2**31 - 1, 3, -2], np.int64)
_WIDE_U = np.array([2**64 - 1, 2**32 + 2, 2**40, 2**31, 3], np.uint64)
#: (name, op, indices, the loops, the op's name in messages)
_WIDE_OPS = [("onnx.gather", G, _WIDE, ref.gather, "onnx.Gather-13"),
             ("onnx.gather_nd", ND, _WIDE[:, None], ref.gather_nd, "onnx.GatherND-13"),
             ("onnx.gather_elements", EL, _WIDE, ref.gather_elements,
              "onnx.GatherElements-13"),
             ("openvino.gather, uint64", lambda d, i, **kw: xgather.openvino.gather(d, i, 0, **kw),
              _WIDE_U, ref.gather, "openvino.Gather-8")]


@pytest.mark.parametrize("mode", ["error", "clip", "fill", "promise_in_bounds"])
@pytest.mark.parametrize("platform", _lower.PLATFORMS)
def test_64_bit_indices_beyond_int32_stay_out_of_range_with_every_platforms_choices(
        platform, mode):
    """With x64 on, each platform's choices give the loops' results for 64-bit indices
    beyond int32 (eagerly on NumPy and device indices, and under ``jax.jit``; ``"error"``
    reports the index as given, ``"promise_in_bounds"`` takes the in-range ones)."""
    data = np.arange(10, dtype=np.float32)
    kw = dict(mode=mode, fill_value=-1.0) if mode == "fill" else dict(mode=mode)
    with jax.enable_x64(True), xgather.lowering(platform):
        for name, op, idx, loops, spec in _WIDE_OPS:
            if mode == "promise_in_bounds":
                inside = (idx.astype(object) < 10) & (idx.astype(object) >= -10)
                idx = idx[inside.reshape(len(idx), -1).all(axis=1)]
            f = jax.jit(lambda d, i, op=op: op(d, i, **kw))
            if mode == "error":
                f = xgather.checked(f, sync=True)
            runs = {"eager, NumPy indices": lambda i, op=op: op(data, i, **kw),
                    "eager, device indices": lambda i, op=op: op(data, jnp.asarray(i), **kw),
                    "jit": lambda i, f=f: f(data, i)}
            if mode == "error":  # the first index, as given, and how many are out of range
                bad = int(((idx.astype(object) >= 10) | (idx.astype(object) < -10)).sum())
                message = (rf"^{re.escape(spec)}: index {int(idx.ravel()[0])} at "
                           rf"indices\[0(, 0)?\] is out of range .* \({bad} out-of-range")
                for run in runs.values():
                    with pytest.raises(OutOfBoundsError, match=message):
                        run(idx)
                continue
            oob = "error" if mode == "promise_in_bounds" else mode
            want = loops(data, idx.astype(object), oob=oob, fill=-1.0)
            for how, run in runs.items():
                got = np.asarray(run(idx))
                np.testing.assert_array_equal(got, want, err_msg=f"{name}, {how}")


@pytest.mark.parametrize("platform", _lower.PLATFORMS)
def test_programs_for_an_accelerator_saturate_64_bit_indices(platform):
    """No GPU runs in CI: the program lowered for ``cuda`` (and ``tpu``) from int64 and
    uint64 indices, with each platform's choices, holds the saturation's clamp, and the
    same program from int32 indices none."""
    S = jax.ShapeDtypeStruct
    with jax.enable_x64(True), xgather.lowering(platform):
        for name, op, idx, _, _ in _WIDE_OPS:
            f = jax.jit(lambda d, i, op=op: op(d, i, mode="promise_in_bounds"))
            for runtime in ("cuda", "tpu"):
                texts = {dtype: f.trace(S((10,), np.float32), S(idx.shape, dtype)).lower(
                    lowering_platforms=(runtime,)).as_text()
                    for dtype in (idx.dtype, np.int32)}
                assert re.search(r"stablehlo\.clamp .*xu?i64>", texts[idx.dtype]), \
                    (name, runtime)
                assert "stablehlo.clamp" not in texts[np.int32], (name, runtime)


def test_plans_are_made_for_the_default_backend():
    plan = xgather.explain(G, np.zeros((3, 4, 6), np.float32), np.zeros(2, np.int32), 1)
    assert plan.platform == {"cuda": "gpu", "rocm": "gpu"}.get(jax.default_backend(),
                                                               jax.default_backend())
    with xgather.lowering("gpu"):
        assert xgather.explain(G, np.zeros(3, np.float32), np.zeros(2, np.int32)).platform == "gpu"
    assert xgather.explain(G, np.zeros(3, np.float32), np.zeros(2, np.int32)).platform == \
        plan.platform


def test_lowering_refuses_unknown_choices():
    with pytest.raises(xgather.XGatherError, match="platform must be one of"):
        with xgather.lowering("metal"):
            pass
    with pytest.raises(xgather.XGatherError, match="element_gather must be one of"):
        with xgather.lowering(element_gather="flat"):
            pass


def test_the_element_lowering_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("XGATHER_ELEMENT_GATHER", "gpu=linear")
    assert _lower._env_element_gather() == {"gpu": "linear"}
    monkeypatch.setenv("XGATHER_ELEMENT_GATHER", "linear")
    assert _lower._env_element_gather() == dict.fromkeys(_lower.PLATFORMS, "linear")
    monkeypatch.setenv("XGATHER_ELEMENT_GATHER", "gpu=flat")
    with pytest.raises(ValueError, match="XGATHER_ELEMENT_GATHER"):
        _lower._env_element_gather()


def test_clear_caches_forgets_every_signature():
    data, idx = np.arange(5, dtype=np.float32), np.array([1], np.int32)
    G(data, idx)
    assert _runners_for(G)
    xgather._frontend.clear_caches()
    assert not _frontend.RUNNERS
    assert_same(G(data, idx), ref.gather(data, idx))


def test_flags_are_read_from_every_kind_of_result():
    """``flag_set``: a CPU array through the buffer protocol (multi-device arrays, which fall
    back to a copy, are read in tests/multidevice)."""
    from xgather._check import flag_set
    flag = jax.jit(lambda i: (jnp.max(i) > 2, i))
    assert flag_set(flag(jnp.arange(4))[0]) is True
    assert flag_set(flag(jnp.arange(3))[0]) is False
    assert flag_set(jnp.zeros((), bool)) is False


def test_cached_eager_calls_keep_array_kinds_and_weak_types_apart():
    """The key holds a JAX array's aval (shape, dtype, weak type) and a NumPy array's shape
    and dtype: each kind gets its own runner, and each checks its own indices."""
    data = np.arange(6, dtype=np.float32)
    with jax.numpy_dtype_promotion("standard"):
        weak = jnp.arange(6) * 1.0  # same shape and dtype, weakly typed: its own key
    idx = np.array([5, -6], np.int32)
    before = len(_runners_for(G))
    for d in (data, jnp.asarray(data), weak):
        for put in (np.asarray, jnp.asarray):
            assert_same(np.asarray(G(d, put(idx))), ref.gather(data, idx))
            with pytest.raises(OutOfBoundsError,
                               match=_message("onnx.Gather-13", 6, 1, -6, 5, 0, 6)):
                G(d, put(np.array([0, 6], np.int32)))
    assert weak.dtype == data.dtype and weak.aval.weak_type
    assert len(_runners_for(G)) - before == 6


def test_a_plain_jit_after_a_checked_report_still_names_the_remedies():
    # The checked program's traces (functionalised checks) are its own: a plain call of the
    # same jitted function gets xgather's error, not JAX's "not functionalized" one.
    d = np.arange(10, dtype=np.float32)
    inner = jax.jit(lambda d, i: xgather.onnx.gather(d, i))
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 11 at indices\[0\]"):
        xgather.checked(sync=True)(inner)(d, np.array([11]))
    with pytest.raises(xgather.XGatherError, match=r"use xgather\.checked"):
        inner(d, np.array([1]))


def test_a_users_own_failed_check_is_not_an_index_error():
    from jax.experimental import checkify

    def f(d, i):
        checkify.check(d.sum() < 0, "user says no")
        return xgather.onnx.gather(d, i)

    with pytest.raises(checkify.JaxRuntimeError, match="user says no") as info:
        xgather.checked(sync=True)(f)(np.arange(3.0, dtype=np.float32), np.array([1]))
    assert not isinstance(info.value, xgather.OutOfBoundsError)


def test_eager_cache_is_bounded_and_skips_nan_fills():
    from xgather import _frontend
    d, i = jnp.arange(4.0), jnp.array([1, 9])
    _frontend.RUNNERS.clear()
    for _ in range(3):
        out = xgather.onnx.gather(d, i, mode="fill", fill_value=float("nan"))
        assert out[0] == 1.0 and np.isnan(out[1])
    assert not _frontend.RUNNERS  # NaN != NaN: such keys would never be found again
    size = _frontend.RUNNERS_MAX
    try:
        _frontend.RUNNERS_MAX = 3
        for n in range(2, 9):
            np.testing.assert_array_equal(
                xgather.onnx.gather(jnp.arange(float(n)), i % n, mode="clip"),
                ref.gather(np.arange(float(n)), np.asarray(i) % n, oob="clip"))
            assert len(_frontend.RUNNERS) <= 3
    finally:
        _frontend.RUNNERS_MAX = size
