"""The private JAX names of ``xgather._jaxprivate``: present, and meaning what xgather
reads them for, on every JAX the suite runs on. A name that moves fails here loudly;
the library itself then falls back (exact results, one warning), which the last tests
check by hiding the names."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import checkify

import xgather
from xgather import _jaxprivate, _modes


def test_no_private_name_moved():
    _jaxprivate.backends_started()
    assert _jaxprivate.MISSING == {}, (jax.__version__, _jaxprivate.MISSING)


def test_enum_state_is_part_of_the_trace_context_and_the_jit_key():
    state = _modes.TraceState("xgather_test_private_state", ("a", "b"), "a", "a test state")
    assert state._state is not None, _jaxprivate.MISSING
    traces = []

    @jax.jit
    def f(x):
        traces.append(state.value)
        return x + 1

    x = jnp.zeros(3)
    f(x)
    with state.traced_as("b"):
        assert state.value == "b"
        f(x)  # a jit-key state: the C++ dispatch cache must not hand back the "a" program
        f(x)
    f(x)
    assert traces == ["a", "b"] and state.value == "a"


def test_loop_inside_derivative_tells_which_is_outside():
    seen = {}

    def probe(name):
        def f(x):
            seen[name] = _jaxprivate.loop_inside_derivative()
            return x * 2.0
        return f

    def scan(name):
        return lambda x: lax.scan(lambda c, _: (probe(name)(c), None), x, None, length=2)[0]

    probe("plain")(1.0)
    jax.jit(probe("jit"))(1.0)
    jax.grad(probe("grad"))(1.0)
    scan("scan")(1.0)
    jax.grad(scan("scan-in-grad"))(1.0)
    jax.jvp(scan("scan-in-jvp"), (1.0,), (1.0,))
    jax.linearize(scan("scan-in-linearize"), 1.0)
    jax.vjp(scan("scan-in-vjp"), 1.0)
    jax.grad(lambda x: lax.map(probe("map-in-grad"), x).sum())(jnp.ones(2))
    jax.grad(lambda x: lax.fori_loop(0, 2, lambda i, c: probe("fori-in-grad")(c), x))(1.0)
    lax.scan(lambda c, _: (jax.grad(probe("grad-in-scan"))(c), None), 1.0, None, length=2)
    jax.grad(lambda x: lax.scan(lambda c, _: (jax.grad(scan("scan-in-grad-in-scan-in-grad"))(
        c), None), x, None, length=2)[0])(1.0)
    assert seen == {"plain": False, "jit": False, "grad": False, "scan": False,
                    "scan-in-grad": True, "scan-in-jvp": False, "scan-in-linearize": True,
                    "scan-in-vjp": True, "map-in-grad": True, "fori-in-grad": True,
                    "grad-in-scan": False, "scan-in-grad-in-scan-in-grad": True}, seen


def test_checkify_errors_are_those_of_the_innermost_checkify():
    seen = []

    def f(x):
        seen.append(_jaxprivate.checkify_errors())
        return x + 1

    checkify.checkify(f)(1.0)
    checkify.checkify(f, errors=checkify.float_checks)(1.0)
    checkify.checkify(lambda x: checkify.checkify(f, errors=checkify.nan_checks)(x)[1],
                      errors=checkify.all_checks)(1.0)
    jax.jit(f)(2.0)
    xgather.checked(f)(3.0)
    assert seen == [checkify.user_checks, checkify.float_checks, checkify.nan_checks, None,
                    checkify.user_checks], seen


def test_the_sharding_type_error_is_an_exception_class():
    # What it catches (a gather on Explicit mesh axes) is in tests/multidevice
    # (test_explicit_axes_*), which test_sharded.py runs on 8 devices.
    assert isinstance(_jaxprivate.SHARDING_TYPE_ERROR, type)
    assert issubclass(_jaxprivate.SHARDING_TYPE_ERROR, Exception)


def test_array_impl_is_the_class_of_a_jax_array_and_keys_eager_calls():
    from xgather import _frontend
    x = jnp.arange(6.0).reshape(2, 3)
    assert type(x) is _jaxprivate.ARRAY_IMPL
    assert type(jax.device_put(np.zeros(2))) is _jaxprivate.ARRAY_IMPL
    key = _frontend.signature(xgather.onnx.gather, (x, jnp.array([1])), {})
    assert key is not None and key[1] == x.aval


def test_backends_started_reads_jax_state():
    jnp.zeros(1).block_until_ready()
    assert _jaxprivate.backends_started() is True


def test_error_predicates_are_the_failed_checks():
    def f(x):
        checkify.check(x > 0, "x must be positive")
        return x

    err, _ = checkify.checkify(f)(-1.0)
    preds = _jaxprivate.error_predicates(err)
    assert preds is not None and bool(np.any([np.any(p) for p in preds]))
    err, _ = checkify.checkify(f)(1.0)
    assert not any(np.any(p) for p in _jaxprivate.error_predicates(err))


def test_closed_jaxpr_alias_is_the_public_class():
    import jax._src.core as core
    import jax.extend.core as public
    assert _jaxprivate.alias_closed_jaxpr()
    assert core.ClosedJaxpr is public.ClosedJaxpr


@pytest.mark.subprocess
def test_import_and_exact_results_survive_every_private_name_moving():
    # The names are hidden while xgather imports (JAX itself still needs them after).
    script = textwrap.dedent("""
        import sys, warnings
        import jax, jax.numpy, jax.extend.core, jax.interpreters.ad, jax.experimental.checkify
        import jax._src.array, jax._src.config, jax._src.core
        import numpy as np
        hidden = {(jax._src.array, "ArrayImpl"), (jax._src.config, "enum_state"),
                  (jax._src.core, "ShardingTypeError")}
        saved = {(m, n): getattr(m, n) for m, n in hidden}
        modules = {n: sys.modules[n] for n in ("jax._src.checkify",
                                                "jax._src.lax.control_flow.loops",
                                                "jax._src.interpreters.ad")}
        for m, n in hidden:
            delattr(m, n)
        sys.modules.update(dict.fromkeys(modules))  # None: their import fails
        import xgather
        from xgather import _jaxprivate
        for (m, n), value in saved.items():
            setattr(m, n, value)
        sys.modules.update(modules)
        data = np.arange(12.0, dtype=np.float32).reshape(3, 4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather(d, i, axis=1)))(
                data, np.array([3, -4]))
            try:
                xgather.checked(lambda d, i: xgather.onnx.gather(d, i), sync=True)(
                    data, np.array([5]))
            except xgather.OutOfBoundsError as e:
                error = str(e)
            grad = jax.grad(lambda d: xgather.onnx.gather(d, np.array([2, 2])).sum())(data)
            eager = xgather.onnx.gather(data, np.array([-1]))
        print(sorted(_jaxprivate.MISSING))
        print(np.asarray(got).tolist(), np.asarray(eager).tolist())
        print(np.asarray(grad).sum(axis=1).tolist())
        print(error.split(":")[0], "index 5" in error)
        print(sorted({str(w.message).split("private name")[0] for w in caught}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == str(sorted(["ArrayImpl", "ShardingTypeError", "ad", "checkify",
                                   "enum_state", "loops"])), out.stdout
    want = np.arange(12.0).reshape(3, 4)
    assert lines[1] == f"{want[:, [3, 0]].tolist()} {want[[2]].tolist()}"
    assert lines[2] == "[0.0, 0.0, 8.0]"
    assert lines[3] == "onnx.Gather-13 True"
    assert f"xgather: jax {jax.__version__} lacks the " in lines[4], lines[4]
