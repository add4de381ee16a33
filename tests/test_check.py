"""The deferred check of ``xgather.checked``: when a failure surfaces, in which thread,
with which report; exact results for every legal index; the user's own checkify,
default mode and wrappers; flax.nnx and equinox training steps."""

import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import checkify

import xgather
from tests import reference

G = xgather.onnx.gather
DATA = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.fixture(autouse=True)
def _no_pending_errors():
    """Every test starts and ends with no unread failure in its thread."""
    xgather.raise_if_error()
    yield
    xgather.raise_if_error()


@pytest.fixture(params=["one by one", "in groups"])
def reads(request, monkeypatch):
    """How flags are read: each by itself as soon as ready (a CPU's, on the host already),
    or in groups of READ_GROUP calls (an accelerator's; here CPU flags taken that way)."""
    if request.param == "in groups":
        monkeypatch.setattr(xgather._checked, "_on_host", lambda flag: False)
    return request.param


def test_a_bad_index_in_call_10_of_40_raises_before_the_40th_returns(reads):
    f = xgather.checked(jax.jit(lambda d, i: G(d, i)))
    returned = 0
    with pytest.raises(xgather.OutOfBoundsError) as info:
        for n in range(1, 41):
            f(DATA, np.array([7 if n == 10 else n % 3, -1]))
            returned += 1
    assert 10 <= returned < 40
    # At most MAX_PENDING calls were in flight: the 10th call's flag was read at the
    # latest when call 10 + MAX_PENDING started.
    assert returned <= 10 + xgather.MAX_PENDING
    text = str(info.value)
    assert "onnx.Gather-13: index 7 at indices[0] is out of range [-3, 2]" in text
    assert "call 10 of xgather.checked(" in text and "<lambda>)" in text
    assert "an earlier call" in text
    xgather.raise_if_error()  # raised once: nothing left


def test_a_bad_index_in_the_last_call_raises_at_raise_if_error_once(reads):
    f = xgather.checked(lambda d, i: G(d, i, axis=1))
    out = f(DATA, np.array([0, 9]))  # returns: the flag is read later
    np.testing.assert_array_equal(np.asarray(out)[:, 0], DATA[:, 0])
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 9 at indices\[1\] is out of "
                       r"range \[-4, 3\] for data axis 1 of size 4"):
        xgather.raise_if_error()
    xgather.raise_if_error()  # once


def test_sync_raises_at_the_call():
    f = xgather.checked(lambda d, i: G(d, i), sync=True)
    with pytest.raises(xgather.OutOfBoundsError, match="call 1 of xgather.checked") as info:
        f(DATA, np.array([-4]))
    assert "earlier call" not in str(info.value)

    @xgather.checked(sync=True)
    def g(d, i):
        return G(d, i)
    with pytest.raises(xgather.OutOfBoundsError, match="index -4"):
        g(DATA, np.array([-4]))


def test_sync_checks_switches_every_checked_function():
    f = xgather.checked(lambda d, i: G(d, i))
    xgather.sync_checks(True)
    try:
        with pytest.raises(xgather.OutOfBoundsError, match="index 3"):
            f(DATA, np.array([3]))
    finally:
        xgather.sync_checks(False)
    f(DATA, np.array([3]))
    with pytest.raises(xgather.OutOfBoundsError, match="index 3"):
        xgather.raise_if_error()


def test_each_thread_has_its_own_pending_errors(reads):
    f = xgather.checked(lambda d, i: G(d, i))
    f(DATA, np.array([5]))  # this thread's error, unread
    seen = []

    def other():
        try:
            for _ in range(3 * xgather.MAX_PENDING):
                f(DATA, np.array([1]))
            xgather.raise_if_error()
            seen.append("clean")
        except Exception as err:  # noqa: BLE001 - the test reports what came through
            seen.append(err)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == ["clean"]
    with pytest.raises(xgather.OutOfBoundsError, match="index 5"):
        xgather.raise_if_error()


def test_call_numbers_count_each_threads_own_calls():
    f = xgather.checked(lambda d, i: G(d, i), sync=True)
    for _ in range(5):
        f(DATA, np.array([1]))
    seen = []

    def other():
        f(DATA, np.array([0]))
        try:
            f(DATA, np.array([7]))
        except xgather.OutOfBoundsError as err:
            seen.append(str(err))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(seen) == 1 and "in call 2 of xgather.checked(" in seen[0], seen


def test_a_users_own_check_is_deferred_too(reads):
    def f(d, i):
        checkify.check(jnp.all(d >= 0), "data must be non-negative")
        return G(d, i)
    g = xgather.checked(f)
    g(-DATA, np.array([1]))
    with pytest.raises(checkify.JaxRuntimeError, match="data must be non-negative"):
        xgather.raise_if_error()


def test_flags_read_in_groups_report_the_first_failed_call_of_two_functions(monkeypatch):
    """Accelerator flags: READ_GROUP calls per read (one stacking program each); the
    first failure in call order is raised, with the calls after it counted."""
    monkeypatch.setattr(xgather._checked, "_on_host", lambda flag: False)
    stacked = []
    heads = xgather._checked._heads
    monkeypatch.setattr(xgather._checked, "_heads", lambda *f: stacked.append(len(f)) or heads(*f))
    f = xgather.checked(lambda d, i: G(d, i))
    g = xgather.checked(lambda d, i: G(d, i, axis=1))
    group = xgather._checked.READ_GROUP
    for n in range(group):  # one full group: read at a later call, none failed
        (f if n % 2 else g)(DATA, np.array([n % 3]))
    assert stacked == [group]
    for n in range(group):  # its calls 3 and 5 (f's 6th and 7th) fail: 3 is raised
        (f if n % 2 else g)(DATA, np.array([9 if n in (3, 5) else 0]))
    with pytest.raises(xgather.OutOfBoundsError) as info:
        xgather.raise_if_error()
    text = str(info.value)
    assert "index 9 at indices[0] is out of range [-3, 2] for data axis 0" in text
    assert f"call {group // 2 + 2} of xgather.checked(" in text  # f's 2nd call in the group
    assert "1 later call(s) are still pending" in text  # the group's other failure
    assert stacked == [group, group]
    with pytest.raises(xgather.OutOfBoundsError) as info:  # the later failure, in its turn
        xgather.raise_if_error()
    assert f"call {group // 2 + 3} of xgather.checked(" in str(info.value)
    assert info.value.call == group // 2 + 3 and info.value.index == 9
    xgather.raise_if_error()  # each once
    f(DATA, np.array([1, -3]))  # a part-filled group is read at raise_if_error
    xgather.raise_if_error()
    assert stacked == [group] * 3


@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested-checkify"])
@pytest.mark.parametrize("axis", [0, 1])
def test_legal_negative_indices_are_exact_on_large_gathers(nested, axis):
    """16,384 outputs and more: the sizes where a program once skipped the wrap."""
    data = np.arange(256 * 128, dtype=np.float32).reshape(256, 128)
    idx = np.random.default_rng(axis).integers(-data.shape[axis], data.shape[axis], 300)
    idx[:3] = [-1, -data.shape[axis], 0]

    def op(d, i):
        return G(d, i, axis=axis)
    fn = (lambda d, i: checkify.checkify(op)(d, i)[1]) if nested else op
    got = xgather.checked(fn)(data, idx)
    np.testing.assert_array_equal(np.asarray(got), reference.gather(data, idx, axis))
    got = xgather.checked(fn, sync=True)(data, idx)
    np.testing.assert_array_equal(np.asarray(got), reference.gather(data, idx, axis))


# -- the user's checkify, default mode and wrappers -----------------------------------------

@pytest.mark.parametrize("errors", ["float_checks", "nan_checks", "div_checks",
                                    "index_checks"])
def test_a_checkify_that_would_drop_the_check_is_refused(errors):
    f = checkify.checkify(lambda a, i: G(a, i), errors=getattr(checkify, errors))
    with pytest.raises(xgather.XGatherError, match=r"onnx.Gather-13: mode=\"error\" checks "
                       r"indices with checkify.check, which this checkify.checkify's errors "
                       r"set would drop: add checkify.user_checks"):
        jax.jit(f)(DATA, jnp.array([0, 9]))
    with pytest.raises(xgather.XGatherError, match="would drop"):
        xgather.checked(jax.jit(f))(DATA, jnp.array([0, 9]))


def test_a_checkify_with_user_checks_keeps_the_check():
    f = checkify.checkify(lambda a, i: G(a, i), errors=checkify.float_checks
                          | checkify.user_checks)
    err, _ = jax.jit(f)(DATA, jnp.array([0, 9]))
    assert "index 9 at indices[1]" in err.get()


def test_the_default_mode_in_force_at_the_call_applies_under_jit_and_checked():
    jitted = jax.jit(lambda d, i: G(d, i))
    checked = xgather.checked(lambda d, i: G(d, i), sync=True)
    bad = np.array([7])
    with xgather.default_mode("fill"):
        np.testing.assert_array_equal(np.asarray(jitted(DATA, bad)), np.zeros((1, 4)))
        np.testing.assert_array_equal(np.asarray(checked(DATA, bad)), np.zeros((1, 4)))
    with pytest.raises(xgather.OutOfBoundsError):
        checked(DATA, bad)  # after the block: the spec's rule again
    with pytest.raises(xgather.XGatherError, match="needs the traced function to be wrapped"):
        jitted(DATA, bad)
    seen = []

    def other():  # the block is this thread's alone
        try:
            checked(DATA, bad)
            seen.append("filled")
        except xgather.OutOfBoundsError:
            seen.append("raised")
    with xgather.default_mode("fill"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == ["raised"]


@pytest.mark.parametrize("outer", ["jit", "eval_shape", "nnx.jit"])
def test_checked_inside_a_transformation_says_it_must_be_outermost(outer):
    inner = xgather.checked(lambda d, i: G(d, i))
    if outer == "nnx.jit":
        nnx = pytest.importorskip("flax.nnx")

        def call():
            return nnx.jit(inner)(DATA, np.array([0, 1]))
    elif outer == "jit":
        def call():
            return jax.jit(inner)(DATA, np.array([0, 1]))
    else:
        def call():
            return jax.eval_shape(inner, DATA, np.array([0, 1]))
    with pytest.raises(xgather.XGatherError, match=r"xgather.checked\(.*<lambda>\): must be "
                       "the outermost wrapper"):
        call()


def test_checked_inside_a_users_checkify_leaves_the_check_to_it():
    f = jax.jit(checkify.checkify(xgather.checked(lambda d, i: G(d, i))))
    err, _ = f(DATA, np.array([0, 5]))
    assert "index 5 at indices[1]" in err.get()


def _scan_of_grads(op):
    def loss(w, i):
        return (op(w, i) ** 2).sum()

    def step(w, i):
        return w - 0.1 * jax.grad(loss)(w, i), None
    return lambda w, idx: lax.scan(step, w, idx)[0]


def test_no_unchecked_warning_when_the_gradient_is_inside_the_loop():
    f = xgather.checked(_scan_of_grads(lambda w, i: G(w, i)))
    idx = np.array([[0, -1], [1, 2], [2, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = f(DATA, idx)
    want = DATA.copy()
    for row in idx:
        g = np.zeros_like(want)
        np.add.at(g, reference.gather(np.arange(3), row, 0), 2 * reference.gather(want, row, 0))
        want = want - np.float32(0.1) * g
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    f(DATA, np.array([[0, 1], [1, 7]]))  # the check still works there
    with pytest.raises(xgather.OutOfBoundsError, match="index 7 at indices\\[1\\]"):
        xgather.raise_if_error()


def test_unchecked_warning_when_the_loop_is_inside_the_gradient():
    def loss(w, idx):
        return lax.scan(lambda c, i: (c + G(w, i).sum(), None), 0.0, idx)[0]
    with pytest.warns(xgather.UncheckedWarning, match="onnx.Gather-13: its mode=\"error\" "
                      "check is traced in a lax.scan"):
        xgather.checked(jax.grad(loss))(DATA, np.array([[0, 1]]))


# -- model code --------------------------------------------------------------------------------

def test_with_flax_nnx_imported_plain_calls_and_module_calls_both_hold():
    # With flax.nnx imported, jax.jit's checked function takes arrays as before, and
    # nnx.jit's writes an nnx object's variables back after the call.
    nnx = pytest.importorskip("flax.nnx")

    class Counter(nnx.Module):
        def __init__(self):
            self.n = nnx.Variable(jnp.zeros((), jnp.int32))

    def f(d, i, counter=None):
        if counter is not None:
            counter["c"].n[...] += 1
        return G(d, i)
    plain, step = xgather.checked(f), xgather.checked(f, jit=nnx.jit)
    idx = np.array([2, -1])
    np.testing.assert_array_equal(plain(DATA, idx), reference.gather(DATA, idx, 0))
    plain(DATA, np.array([0, 9]))
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 9 at indices\[1\]"):
        xgather.raise_if_error()
    counter = {"c": Counter()}
    step(DATA, np.array([0]), counter=counter)
    np.testing.assert_array_equal(step(DATA, idx, counter=counter),
                                  reference.gather(DATA, idx, 0))
    assert int(counter["c"].n[...]) == 2
    step(DATA, np.array([5]), counter=counter)
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 5 at indices\[0\]"):
        xgather.raise_if_error()
    np.testing.assert_array_equal(plain(DATA, idx), reference.gather(DATA, idx, 0))


def test_an_nnx_training_step_trains_and_reports_a_bad_id_with_its_line():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.emb = nnx.Param(jax.random.normal(rngs.params(), (10, 4)))
            self.out = nnx.Linear(4, 3, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, ids):
            rows = xgather.onnx.gather(self.emb[...], ids)  # GATHER-LINE
            return self.out(self.drop(rows))

    model = Model(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.sgd(0.2), wrt=nnx.Param)

    @xgather.checked(jit=nnx.jit)
    def step(model, opt, ids, y):
        loss, grads = nnx.value_and_grad(lambda m: ((m(ids) - y) ** 2).mean())(model)
        opt.update(model, grads)
        return loss

    ids, y = jnp.array([1, 2, 3, -1]), jnp.zeros((4, 3))
    losses = [float(step(model, opt, ids, y)) for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]  # the updates reached the caller's model
    before = np.asarray(model.emb[...]).copy()
    step(model, opt, jnp.array([1, 2, 30, 3]), y)
    with pytest.raises(xgather.OutOfBoundsError) as info:
        xgather.raise_if_error()
    source = pathlib.Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(source, 1) if "# GATHER-LINE" in text)
    assert "index 30 at indices[2]" in str(info.value)
    assert f"the gather was traced at {__file__}:{line}" in str(info.value)
    assert "xgather.checked(" in str(info.value) and "step" in str(info.value)
    assert np.isfinite(np.asarray(model.emb[...])).all()  # state survives and trains on
    assert not np.array_equal(np.asarray(model.emb[...]), before)
    assert float(step(model, opt, ids, y)) < losses[0]

    @xgather.checked(jit=nnx.jit)
    def fresh(model, ids):  # an nnx module as a result, made inside
        other = Model(nnx.Rngs(1))
        other.emb[...] = other.emb[...] + model.emb[...]
        return other, other(ids)
    other, out = fresh(model, ids)
    assert isinstance(other, Model) and isinstance(other.emb, nnx.Param)
    np.testing.assert_allclose(np.asarray(other.emb[...]),
                               np.asarray(Model(nnx.Rngs(1)).emb[...] + model.emb[...]),
                               rtol=1e-6)
    assert out.shape == (4, 3)


def test_an_equinox_training_step_with_function_fields_and_donation():
    eqx = pytest.importorskip("equinox")
    optax = pytest.importorskip("optax")

    class Model(eqx.Module):
        emb: jax.Array
        lin: eqx.nn.Linear
        act: object

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.emb = jax.random.normal(k1, (10, 4))
            self.lin = eqx.nn.Linear(4, 3, key=k2)
            self.act = jax.nn.tanh  # a function field

        def __call__(self, ids):
            return jax.vmap(self.lin)(self.act(xgather.onnx.gather(self.emb, ids)))

    model = Model(jax.random.key(0))
    tx = optax.adam(0.05)
    state = tx.init(eqx.filter(model, eqx.is_array))

    def step(model, state, ids, y):
        loss, grads = eqx.filter_value_and_grad(lambda m: ((m(ids) - y) ** 2).mean())(model)
        updates, state = tx.update(grads, state, model)
        return eqx.apply_updates(model, updates), state, loss

    f = xgather.checked(step, jit=eqx.filter_jit, donate="all")
    ids, y = jnp.array([0, 4, -2]), jnp.ones((3, 3))
    with jax.numpy_dtype_promotion("standard"):  # optax's adam mixes int32 and float
        _equinox_steps(f, model, state, ids, y)


def _line_of(marker):
    source = pathlib.Path(__file__).read_text().splitlines()
    return next(n for n, text in enumerate(source, 1) if text.rstrip().endswith(marker))


def test_each_gather_of_one_signature_reports_its_own_line():
    def first(i, j):
        a = G(DATA, i)  # SITE-A
        b = G(DATA, j)  # SITE-B
        return a + b

    def second(i):
        return G(DATA, i)  # SITE-C

    f, g = xgather.checked(jax.jit(first), sync=True), xgather.checked(second, sync=True)
    for call, site in ((lambda: f(np.array([0]), np.array([9])), "SITE-B"),
                       (lambda: f(np.array([9]), np.array([0])), "SITE-A"),
                       (lambda: g(np.array([7])), "SITE-C")):
        with pytest.raises(xgather.OutOfBoundsError,
                           match=rf"traced at {__file__}:{_line_of('# ' + site)}\n"):
            call()


def test_sync_under_nnx_jit_raises_after_the_step_is_applied():
    """nnx.jit writes the variables back before xgather reads the flag: the bad step is
    applied (its reads stayed in bounds, so the weights stay finite), then raised."""
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    table = jnp.arange(40.0).reshape(10, 4)
    opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    @xgather.checked(jit=nnx.jit, sync=True)
    def step(model, opt, ids):
        loss, grads = nnx.value_and_grad(lambda m: (m(G(table, ids)) ** 2).mean())(model)
        opt.update(model, grads)
        return loss

    step(model, opt, jnp.array([1, -1]))
    kernel = np.asarray(model.kernel[...]).copy()
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 10 at indices\[1\]"):
        step(model, opt, jnp.array([2, 10]))
    assert int(opt.step[...]) == 2  # applied
    assert np.isfinite(np.asarray(model.kernel[...])).all()
    assert not np.array_equal(np.asarray(model.kernel[...]), kernel)
    step(model, opt, jnp.array([2, 3]))  # training goes on
    assert int(opt.step[...]) == 3


def test_sync_with_donation_hands_the_result_over_in_the_error():
    table = jnp.arange(40.0).reshape(10, 4)
    f = xgather.checked(lambda w, ids: w + G(table, ids).sum(), sync=True, donate_argnums=0)
    w = jnp.zeros(4)
    with pytest.raises(xgather.OutOfBoundsError, match="donated its arguments") as info:
        f(w, jnp.array([1, 12]))
    assert w.is_deleted()
    # the row read for 12 is somewhere in the table: only the good row's sum is known
    assert info.value.result.shape == (4,) and np.isfinite(np.asarray(info.value.result)).all()


def test_a_results_constants_follow_the_shapes_of_each_call():
    eqx = pytest.importorskip("equinox")

    class Out(eqx.Module):
        rows: jax.Array
        batch: int = eqx.field(static=True)

    class Model(eqx.Module):
        table: jax.Array
        act: object  # a function field: the arguments are split

        def __call__(self, ids):
            rows = self.act(G(self.table, ids))
            return Out(rows, ids.shape[0]), [rows[k] for k in range(ids.shape[0])]

    model = Model(jnp.arange(10.0).reshape(5, 2), jnp.negative)
    f = xgather.checked(lambda m, ids: m(ids), jit=eqx.filter_jit)
    for n in [2, 3, 2, 1, 3]:  # each shape traced once, then taken from jit's cache
        ids = np.arange(n, dtype=np.int32)[::-1]
        out, listed = f(model, ids)
        expected = -np.arange(10.0).reshape(5, 2)[ids]
        assert out.batch == n and len(listed) == n
        np.testing.assert_array_equal(out.rows, expected)
        np.testing.assert_array_equal(np.stack(listed), expected)


def test_equinox_fields_that_are_python_numbers_are_constants():
    eqx = pytest.importorskip("equinox")

    class Model(eqx.Module):
        table: jax.Array
        drop: eqx.nn.Dropout
        scale: float

        def __call__(self, ids, key):
            return self.drop(G(self.table, ids), key=key) * self.scale

    table = jnp.arange(10.0).reshape(5, 2)
    model = Model(table, eqx.nn.Dropout(0.5, inference=True), 2.0)
    f = xgather.checked(lambda m, ids, key: (m(ids, key), m), jit=eqx.filter_jit)
    ids = np.array([4, -1, 0], np.int32)
    for scale in (2.0, 3.0):  # a new constant: a new program
        model = eqx.tree_at(lambda m: m.scale, model, scale)
        out, back = f(model, ids, jax.random.key(0))
        np.testing.assert_array_equal(out, np.arange(10.0).reshape(5, 2)[ids] * scale)
        assert back.drop.inference is True and back.scale == scale  # Python values again


def _equinox_steps(f, model, state, ids, y):
    losses = []
    for _ in range(8):
        model, state, loss = f(model, state, ids, y)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0] and model.act is jax.nn.tanh
    old = model.emb
    model, state, _ = f(model, state, jnp.array([0, 12, 1]), y)
    assert old.is_deleted()  # donated
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 12 at indices\[1\]"):
        xgather.raise_if_error()
    model, state, loss = f(model, state, ids, y)
    assert np.isfinite(float(loss))


def test_static_function_arguments_and_fn_errors_come_through():
    """A function argument is static as jax.jit makes it (``static_argnames``), and
    without that jax.jit's own error says so; a TypeError of fn's own reaches the caller."""
    with pytest.raises(TypeError, match="post"):
        xgather.checked(lambda d, i, post: post(G(d, i)))(DATA, np.array([0]), jnp.abs)
    f = xgather.checked(lambda d, i, post: post(G(d, i)), static_argnames="post")
    np.testing.assert_array_equal(np.asarray(f(DATA, np.array([2, -3]), jnp.negative)),
                                  -reference.gather(DATA, np.array([2, -3])))
    np.testing.assert_array_equal(np.asarray(f(DATA, np.array([1]), jnp.abs)), DATA[[1]])
    f(DATA, np.array([3]), jnp.abs)
    with pytest.raises(xgather.OutOfBoundsError, match="index 3"):
        xgather.raise_if_error()

    def wrong(d, i):
        raise TypeError("fn's own mistake")
    with pytest.raises(TypeError, match="fn's own mistake"):
        xgather.checked(wrong)(DATA, np.array([0]))


def test_non_hashable_static_arguments_get_the_jits_own_error():
    f = xgather.checked(lambda d, i, opts: G(d, i), static_argnames="opts")
    with pytest.raises(ValueError, match="(?i)hashable"):
        f(DATA, np.array([0]), bytearray(b"not hashable"))


def test_static_argnames_as_one_name():
    """As jax.jit takes it: one name is a string, not a sequence of its letters."""
    f = xgather.checked(lambda d, i, axis=0: G(d, i, axis=axis), static_argnames="axis")
    np.testing.assert_array_equal(np.asarray(f(DATA, np.array([3, -1]), axis=1)),
                                  reference.gather(DATA, np.array([3, -1]), axis=1))
    f(DATA, np.array([4]), axis=1)
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 4 at indices\[0\] is out of "
                       r"range \[-4, 3\] for data axis 1"):
        xgather.raise_if_error()


@pytest.mark.parametrize("how", ["argnames", "argnums", "argnums from the end"])
def test_static_and_donated_arguments_by_name_or_by_position(how):
    """As jax.jit reads them (its own rules, on this JAX): where jax.jit takes a call,
    the checked function gives the NumPy loops' result; where it refuses one, the same
    error type comes through."""
    def f(d, i, axis):
        return G(d, i, axis=axis)

    def promise(d, i, axis):
        return G(d, i, axis=axis, mode="promise_in_bounds")
    static = {"argnames": {"static_argnames": "axis"}, "argnums": {"static_argnums": 2},
              "argnums from the end": {"static_argnums": -1}}[how]
    g = xgather.checked(f, **static)
    bare = jax.jit(promise, **static)
    idx = np.array([3, -1])
    for call in (lambda h: h(DATA, idx, 1), lambda h: h(DATA, idx, axis=1),
                 lambda h: h(d=DATA, i=idx, axis=1)):
        try:
            call(bare)
        except Exception as refused:  # noqa: BLE001 - jax.jit's own rule, whatever it is
            with pytest.raises(type(refused)):
                call(g)
            continue
        np.testing.assert_array_equal(np.asarray(call(g)), reference.gather(DATA, idx, axis=1))

    def step(w, ids):
        return w * 2, G(DATA, ids)
    donate = {"argnames": {"donate_argnames": "w"}, "argnums": {"donate_argnums": 0},
              "argnums from the end": {"donate_argnums": -2}}[how]
    h = xgather.checked(step, **donate)
    bare_step = jax.jit(lambda w, ids: (w * 2, G(DATA, ids, mode="promise_in_bounds")),
                        **donate)
    ids = np.array([2, -1])
    for call in (lambda f, w: f(w, ids), lambda f, w: f(w=w, ids=ids)):
        w, v = jnp.ones(3), jnp.ones(3)
        call(bare_step, v)
        out, rows = call(h, w)
        assert w.is_deleted() == v.is_deleted()  # donated where jax.jit donates
        np.testing.assert_array_equal(np.asarray(out), [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(np.asarray(rows), reference.gather(DATA, ids))


CONST_DATA = jnp.asarray(DATA)


@pytest.mark.parametrize("where", ["jit", "scan", "eval_shape", "checked", "grad"])
def test_constant_arrays_inside_a_trace_are_checked_as_it_traces(where):
    """Device arrays that a traced function closes over (a table, fixed ids) are known
    while it traces: their indices are checked then, and the gather goes into the trace."""
    def run(indices):
        def f(x):
            return x * G(CONST_DATA, indices)
        if where == "jit":
            return np.asarray(jax.jit(f)(jnp.float32(2)))
        if where == "scan":
            return np.asarray(lax.scan(lambda c, _: (c, f(c)), jnp.float32(2), None,
                                       length=1)[1][0])
        if where == "eval_shape":
            return jax.eval_shape(f, jnp.float32(2))
        if where == "checked":
            return np.asarray(xgather.checked(f, sync=True)(jnp.float32(2)))
        return np.asarray(jax.grad(lambda x: f(x).sum())(jnp.float32(2)))

    good = jnp.array([2, -1, -3])
    expected = reference.gather(DATA, np.array([2, -1, -3]))
    got = run(good)
    if where == "eval_shape":
        assert got.shape == expected.shape and got.dtype == np.float32
    elif where == "grad":
        np.testing.assert_allclose(got, expected.sum())
    else:
        np.testing.assert_array_equal(got, 2 * expected)
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"index -4 at indices\[1\] is out of range \[-3, 2\]"):
        run(jnp.array([0, -4]))


def test_checked_under_disable_jit_raises_at_the_call():
    """jax.disable_jit, for stepping through a function: each op runs at once, and a bad
    index raises there, as an eager call does."""
    f = xgather.checked(lambda d, i: G(d, i) + 1)
    with jax.disable_jit():
        np.testing.assert_array_equal(np.asarray(f(CONST_DATA, jnp.array([-1]))),
                                      reference.gather(DATA, np.array([-1])) + 1)
        with pytest.raises(xgather.OutOfBoundsError, match="index 5 at indices"):
            f(CONST_DATA, jnp.array([1, 5]))


def test_a_list_argument_under_jit_is_indices():
    """A Python list passed to a jitted function arrives as a list of traced scalars."""
    f = xgather.checked(lambda d, i: G(d, i))
    np.testing.assert_array_equal(np.asarray(f(DATA, [2, -1])),
                                  reference.gather(DATA, np.array([2, -1])))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda d, i: G(d, i, mode="clip"))(
        DATA, [5, 1])), reference.gather(DATA, np.array([5, 1]), oob="clip"))
    f(DATA, [0, 3])
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 3 at indices\[1\]"):
        xgather.raise_if_error()


# -- at exit and from the environment --------------------------------------------------------

@pytest.mark.subprocess
def test_an_unread_failure_is_reported_at_exit_and_the_env_switch_makes_calls_sync():
    code = textwrap.dedent("""
        import sys, numpy as np, xgather
        if sys.argv[1] == "in groups":  # an accelerator's way, with CPU flags
            xgather._checked._on_host = lambda flag: False
        f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i))
        for n in range(11):  # the last group part-filled: read at exit
            f(np.zeros(3, np.float32), np.array([4 if n == 10 else 0]))
        print("returned")
    """)
    for reads in ("one by one", "in groups"):
        run = subprocess.run([sys.executable, "-c", code, reads], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0 and "returned" in run.stdout, run.stderr
        assert "a check failed and was never read" in run.stderr, reads
        assert "index 4 at indices[0]" in run.stderr and "call 11 of" in run.stderr, reads
    env_sync = subprocess.run([sys.executable, "-c", code, "in groups"], capture_output=True,
                              text=True, timeout=120, env={**__import__("os").environ,
                                                           "XGATHER_SYNC_CHECKS": "1"})
    assert env_sync.returncode != 0 and "returned" not in env_sync.stdout
    assert "OutOfBoundsError" in env_sync.stderr


@pytest.mark.parametrize("off", ["0", "false", "No", ""])
def test_the_env_switch_reads_off_values_as_off(off):
    code = ("import numpy as np, xgather\n"
            "f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i))\n"
            "f(np.zeros(3, np.float32), np.array([4]))\n"
            "print('returned')\n")
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                         text=True, timeout=120,
                         env={**__import__("os").environ, "XGATHER_SYNC_CHECKS": off})
    assert run.returncode == 0 and "returned" in run.stdout, run.stderr  # deferred


# -- no failure is lost ------------------------------------------------------------------------

def _raised_calls(n_max=10):
    """The call numbers of the failures raise_if_error raises, one by one."""
    calls = []
    for _ in range(n_max):
        try:
            xgather.raise_if_error()
            return calls
        except xgather.OutOfBoundsError as err:
            calls.append(err.call)
    return calls


def test_every_failure_is_raised_in_its_turn(reads):
    f = xgather.checked(lambda d, i: G(d, i))
    raised, bad, ran = [], [], 0
    for n in range(1, 13):
        while True:  # a call that raises an earlier failure has not run: again, as a loop would
            try:
                f(DATA, np.array([7 if n in (2, 4, 5, 9) else 0]))
                break
            except xgather.OutOfBoundsError as err:
                raised.append(err.call)
        ran += 1
        if n in (2, 4, 5, 9):
            bad.append(ran)
    raised += _raised_calls()
    assert raised == bad == [2, 4, 5, 9]


def test_an_interrupt_while_waiting_for_a_flag_leaves_its_failure_pending(monkeypatch):
    f = xgather.checked(lambda d, i: G(d, i))
    monkeypatch.setattr(xgather._checked, "_on_host", lambda flag: False)  # queued, unread
    f(DATA, np.array([5]))
    read = xgather._check.flag_set
    with monkeypatch.context() as m:
        def interrupted(flag):
            raise KeyboardInterrupt
        m.setattr(xgather._check, "flag_set", interrupted)
        m.setattr(xgather._checked._Group, "failed", lambda self: interrupted(None))
        with pytest.raises(KeyboardInterrupt):
            xgather.raise_if_error()
    assert xgather._check.flag_set is read
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 5 at indices\[0\]"):
        xgather.raise_if_error()


def test_a_failure_left_by_an_ended_thread_is_raised_by_another_thread():
    f = xgather.checked(lambda d, i: G(d, i))
    t = threading.Thread(target=lambda: f(DATA, np.array([0, 6])))
    t.start()
    t.join()
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 6 at indices\[1\]"):
        xgather.raise_if_error()
    xgather.raise_if_error()  # once


def test_a_sync_call_raises_an_older_failure_first():
    deferred = xgather.checked(lambda d, i: G(d, i))
    now = xgather.checked(lambda d, i: G(d, i, axis=1), sync=True)
    deferred(DATA, np.array([8]))
    with pytest.raises(xgather.OutOfBoundsError, match="index 8 .*data axis 0") as older:
        now(DATA, np.array([9]))
    assert older.value.call == 1
    with pytest.raises(xgather.OutOfBoundsError, match="index 9 .*data axis 1") as own:
        now(DATA, np.array([9]))
    assert own.value.call == 1  # the call that raised the older failure did not run


def test_a_forked_child_reports_its_pending_failures_at_exit():
    code = textwrap.dedent("""
        import multiprocessing as mp, numpy as np, xgather

        def child():
            f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i))
            f(np.zeros(3, np.float32), np.array([0]))
            f(np.zeros(3, np.float32), np.array([7]))
            print("child returned", flush=True)

        if __name__ == "__main__":
            p = mp.get_context("fork").Process(target=child)
            p.start()
            p.join()
            print("parent exit code", p.exitcode)
    """)
    run = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-W",
                          "ignore::RuntimeWarning", "-c", code], capture_output=True,
                         text=True, timeout=120)
    assert "child returned" in run.stdout and "parent exit code 0" in run.stdout, run.stderr
    assert "a check failed and was never read" in run.stderr, run.stderr
    assert "index 7 at indices[0]" in run.stderr and "call 2 of" in run.stderr


# -- the error as data -------------------------------------------------------------------------

def test_the_error_carries_what_its_message_says():
    with pytest.raises(xgather.OutOfBoundsError) as eager:
        G(DATA, np.array([[0, 1], [-5, 7]]), axis=1)
    e = eager.value
    assert (e.op, e.index, e.position, e.valid_range, e.axis, e.size, e.count) == (
        "onnx.Gather-13", -5, (1, 0), (-4, 3), 1, 4, 2)
    f = xgather.checked(lambda d, i: G(d, i))  # LINE-OF-THE-CHECKED-GATHER
    f(DATA, np.array([1, 2]))
    f(DATA, np.array([1, 3, 3]))
    with pytest.raises(xgather.OutOfBoundsError) as later:
        xgather.raise_if_error()
    e = later.value
    assert (e.op, e.index, e.position, e.valid_range, e.count) == (
        "onnx.Gather-13", 3, (1,), (-3, 2), 2)
    assert (e.call, e.call_index) == (2, 1)
    assert (e.file, e.line) == (__file__, _line_of("# LINE-OF-THE-CHECKED-GATHER"))


# -- the user's jit, its options and results ---------------------------------------------------

def test_checked_on_jax_jit_equals_the_jit_in_promise_with_static_and_donated_arguments():
    def step(w, table, ids, scale, mode):
        rows = G(table, ids, mode=mode)
        loss = ((rows @ w) ** 2).mean() * scale
        return w - 0.1 * jax.grad(lambda w: ((rows @ w) ** 2).mean() * scale)(w), loss

    opts = dict(static_argnames=("scale", "mode"), donate_argnums=0)
    mine = xgather.checked(lambda *a, **k: step(*a, **k, mode="error"), **opts)
    theirs = jax.jit(lambda *a, **k: step(*a, **k, mode="promise_in_bounds"), **opts)
    table = jnp.asarray(np.random.default_rng(0).normal(size=(20, 4)), jnp.float32)
    ids = jnp.asarray([3, 19, 0, -1, 7])
    w1, w2 = jnp.ones((4, 2), jnp.float32), jnp.ones((4, 2), jnp.float32)
    for k in range(6):
        w1, l1 = mine(w1, table, ids, scale=float(k % 2 + 1))
        w2, l2 = theirs(w2, table, ids, scale=float(k % 2 + 1))
        np.testing.assert_array_equal(np.asarray(l1), np.asarray(l2))
    np.testing.assert_array_equal(np.asarray(w1), np.asarray(w2))
    assert "stablehlo" in mine.lower(w1, table, ids, scale=1.0).as_text()
    old = w1
    mine(w1, table, ids, scale=1.0)
    assert old.is_deleted()  # donated, as jax.jit donates


def test_a_sync_call_after_a_slow_failing_call_loses_neither_failure():
    slow = xgather.checked(lambda d, i: G(d, i) + jnp.linalg.norm(
        jnp.ones((600, 600)) @ jnp.ones((600, 600))))
    now = xgather.checked(lambda d, i: G(d, i, axis=1), sync=True)
    slow(DATA, np.array([8]))  # not ready yet when the sync call starts
    with pytest.raises(xgather.OutOfBoundsError, match="index 8 .*data axis 0"):
        now(DATA, np.array([9]))
    with pytest.raises(xgather.OutOfBoundsError, match="index 9 .*data axis 1"):
        now(DATA, np.array([9]))  # its own, at its own call: it had not run
    xgather.raise_if_error()


# -- every input answered as the eager ops answer it -------------------------------------------

def test_inputs_under_checked_as_the_eager_ops_read_them():
    f = xgather.checked(lambda d, i: G(d, i))
    idx = np.array([1, -1])
    want = reference.gather(DATA, idx)
    for d, i in ((DATA.astype(">f4"), idx), (DATA, idx.astype(">i8").astype(">i4"))):
        np.testing.assert_array_equal(np.asarray(f(d, i)), want)  # other byte orders
    with pytest.raises(xgather.XGatherTypeError, match="argument 1 is a NumPy masked array"):
        f(DATA, np.ma.masked_array(idx, mask=[0, 1]))
    with pytest.raises(xgather.XGatherTypeError, match="argument 0, a NumPy array of <U1, "
                                                       "cannot be traced by a jit"):
        f(np.array(["a", "b", "c"]), np.array([1]))
    big = 2**40
    with pytest.raises(xgather.XGatherTypeError if not jax.config.jax_enable_x64
                       else xgather.OutOfBoundsError, match=rf"argument 1, a Python int, does "
                       rf"not fit int32|index {big}"):
        f(DATA, big)
        xgather.raise_if_error()


def test_torch_tensors_under_checked_are_read_at_each_call():
    torch = pytest.importorskip("torch")
    f = xgather.checked(lambda d, i: G(d, i))
    ids = torch.tensor([0, 2])
    np.testing.assert_array_equal(np.asarray(f(DATA, ids)), DATA[[0, 2]])
    ids[1] = -1  # written in place: seen by the next call
    np.testing.assert_array_equal(np.asarray(f(DATA, ids)), DATA[[0, 2]])
    ids[0] = 7  # a bad index written in place is checked
    f(DATA, ids)
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 7 at indices\[0\]"):
        xgather.raise_if_error()
    table = torch.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(f(-table, np.array([1]))), -DATA[[1]])
    np.testing.assert_array_equal(np.asarray(f(torch.neg(table).conj(), np.array([2]))),
                                  -DATA[[2]])


def test_a_users_own_checkify_inside_checked_gets_the_full_report():
    def inner(d, i):
        return checkify.checkify(lambda: G(d, i), errors=checkify.user_checks)()
    err, _ = xgather.checked(inner)(DATA, np.array([5]))
    msg = err.get()
    assert "xgather report of site" not in msg
    assert re.search(r"onnx.Gather-13: index 5 at indices\[0\] is out of range \[-3, 2\]", msg)


def test_clear_caches_empties_the_check_tables_once_no_flag_is_pending():
    from xgather import _checked, _report
    f = xgather.checked(lambda d, i: G(d, i))
    f(DATA, np.array([1]))
    f(DATA, np.array([9]))  # pending: the tables stay
    xgather.clear_caches()
    assert len(_report._sites) and len(_checked._layouts)
    with pytest.raises(xgather.OutOfBoundsError, match="index 9"):  # still readable
        xgather.raise_if_error()
    xgather.clear_caches()
    assert len(_report._sites) == len(_checked._layouts) == 0
    assert _checked._queue().calls == {}  # the per-function call counters too
    f(DATA, np.array([8]))  # traced again: new numbers
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 8 at indices\[0\]") as info:
        xgather.raise_if_error()
    assert info.value.call == 1  # counted afresh


def test_the_default_mode_exports_with_jax_export_and_a_symbolic_batch():
    from jax import export
    table = jnp.arange(40.0).reshape(10, 4)
    step = xgather.checked(lambda ids: G(table, ids) * 2.0)
    b, = export.symbolic_shape("b")
    exp = export.export(step.jitted)(jax.ShapeDtypeStruct((b, 3), jnp.int32))
    exp = export.deserialize(exp.serialize())  # as another process would load it
    for n in (1, 5):
        ids = np.arange(3 * n, dtype=np.int32).reshape(n, 3) % 10 - 4
        (flag, _), rows = exp.call(ids)
        assert int(flag[0]) == 0
        np.testing.assert_array_equal(np.asarray(rows), 2.0 * reference.gather(
            np.asarray(table), ids))
    (flag, _), _ = exp.call(np.array([[0, 1, 2], [3, 10, 4]], np.int32))
    assert int(flag[0]) == 1  # a bad index: the flag says so


def test_checked_on_nnx_jit_equals_nnx_jit_in_promise_with_a_static_argument():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class Model(nnx.Module):
        def __init__(self, mode):
            self.emb = nnx.Param(jnp.asarray(np.random.default_rng(1).normal(
                size=(12, 3)), jnp.float32))
            self.mode = mode

        def __call__(self, ids, scale):
            return G(self.emb[...], ids, mode=self.mode) * scale

    def step(model, opt, ids, scale):
        loss, grads = nnx.value_and_grad(lambda m: (m(ids, scale) ** 2).mean())(model)
        opt.update(model, grads)
        return loss

    runs = []
    for mode, wrap in (("error", lambda f: xgather.checked(f, jit=nnx.jit,
                                                           static_argnames="scale")),
                       ("promise_in_bounds", lambda f: nnx.jit(f, static_argnames="scale"))):
        model = Model(mode)
        opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        f = wrap(step)
        losses = [np.asarray(f(model, opt, jnp.array([3, -1, 7]), scale=float(k % 3 + 1)))
                  for k in range(6)]
        runs.append((losses, np.asarray(model.emb[...])))
    (l1, w1), (l2, w2) = runs
    np.testing.assert_array_equal(np.stack(l1), np.stack(l2))
    np.testing.assert_array_equal(w1, w2)


def test_checked_on_filter_jit_equals_filter_jit_in_promise_with_donation():
    eqx = pytest.importorskip("equinox")

    class Model(eqx.Module):
        emb: jax.Array
        act: object
        mode: str = eqx.field(static=True)

        def __call__(self, ids):
            return self.act(G(self.emb, ids, mode=self.mode))

    def step(model, ids):
        loss, grads = eqx.filter_value_and_grad(lambda m: (m(ids) ** 2).mean())(model)
        return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads)), loss

    runs = []
    for mode, jit in (("error", lambda f: xgather.checked(f, jit=eqx.filter_jit,
                                                          donate="all")),
                      ("promise_in_bounds", lambda f: eqx.filter_jit(f, donate="all"))):
        model = Model(jnp.arange(30.0).reshape(10, 3) / 10, jnp.tanh, mode)
        f, losses = jit(step), []
        for _ in range(6):
            old = model.emb
            model, loss = f(model, jnp.array([0, 9, -2]))
            losses.append(np.asarray(loss))
        assert old.is_deleted() and model.act is jnp.tanh  # donated; the field kept
        runs.append((losses, np.asarray(model.emb)))
    (l1, w1), (l2, w2) = runs
    np.testing.assert_array_equal(np.stack(l1), np.stack(l2))
    np.testing.assert_array_equal(w1, w2)


def test_shardings_and_other_jit_options_pass_through():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    spec = NamedSharding(mesh, PartitionSpec("x"))
    f = xgather.checked(lambda d, i: G(d, i), out_shardings=spec, keep_unused=True)
    out = f(DATA, np.array([2, -1]))
    assert out.sharding == spec
    np.testing.assert_array_equal(np.asarray(out), reference.gather(DATA, np.array([2, -1])))
