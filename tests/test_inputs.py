"""Unusual inputs: torch tensors and other array objects, masked arrays, lists holding
objects, other byte orders; and the public cache switch."""

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import jax
import numpy as np
import pytest

import xgather
from tests import reference as ref

X64 = bool(jax.config.jax_enable_x64)
DATA = np.arange(12, dtype=np.float32).reshape(4, 3)
ROOT = Path(__file__).resolve().parents[1]

OPS = {  # op, its attributes, the loops
    "onnx.gather": (xgather.onnx.gather, dict(axis=0), lambda d, i: ref.gather(d, i, 0)),
    "onnx.gather_nd": (xgather.onnx.gather_nd, {}, lambda d, i: ref.gather_nd(d, i)),
    "onnx.gather_elements": (xgather.onnx.gather_elements, dict(axis=0),
                             lambda d, i: ref.gather_elements(d, i, 0)),
    "openvino.gather": (xgather.openvino.gather, dict(axis=0),
                        lambda d, i: ref.gather(d, i, 0, oob="fill")),
    "bnns.gather_nd": (xgather.bnns.gather_nd, {}, lambda d, i: ref.gather_nd(d, i,
                                                                              negative=False)),
}
INDICES = {"onnx.gather": [1, -1, 0], "onnx.gather_nd": [[1], [-1]],
           "onnx.gather_elements": [[1, 0, -1]], "openvino.gather": [2, -4],
           "bnns.gather_nd": [[1], [3]]}


class DLPackOnly:
    """An array object of another library: ``__dlpack__`` and a dtype NumPy cannot read
    (as a torch tensor has), no ``__array__``."""

    def __init__(self, array):
        self._array = np.asarray(array)
        self.shape = self._array.shape
        self.dtype = type("ForeignDType", (), {"itemsize": self._array.dtype.itemsize})()

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.mark.parametrize("name", sorted(OPS))
def test_array_objects_through_dlpack_are_exact_and_checked(name):
    op, attrs, loops = OPS[name]
    idx = np.asarray(INDICES[name], np.int64)
    got = op(DLPackOnly(DATA), DLPackOnly(idx), **attrs)
    np.testing.assert_array_equal(np.asarray(got), loops(DATA, idx))
    assert xgather.explain(op, DLPackOnly(DATA), DLPackOnly(idx), **attrs).data_shape == (4, 3)
    if name.startswith("onnx"):
        bad = idx.copy()
        bad.reshape(-1)[-1] = 9
        with pytest.raises(xgather.OutOfBoundsError, match="index 9 at indices"):
            op(DLPackOnly(DATA), DLPackOnly(bad), **attrs)


def test_64_bit_data_through_dlpack_stays_exact():
    wide = np.array([2**40 + 1, -(2**53) - 1, 7], np.int64)
    got = xgather.onnx.gather(DLPackOnly(wide), DLPackOnly(np.array([1, 0])))
    assert np.asarray(got).dtype == np.int64
    np.testing.assert_array_equal(np.asarray(got), wide[[1, 0]])


def test_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is installed on CI's oldest leg only")
    data = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    idx = torch.tensor([1, -1, 0])
    np.testing.assert_array_equal(np.asarray(xgather.onnx.gather(data, idx)),
                                  ref.gather(DATA, np.array([1, -1, 0]), 0))
    # 64-bit values with x64 off (the host path), bfloat16, a tensor that requires grad
    wide = torch.tensor([2**40 + 1, 3])
    assert np.asarray(xgather.onnx.gather(wide, torch.tensor([0]))).tolist() == [2**40 + 1]
    half = torch.tensor([1.5, 2.5], dtype=torch.bfloat16)
    assert float(np.asarray(xgather.onnx.gather(half, np.array([1]))).astype(np.float32)[0]) \
        == 2.5
    grad = torch.tensor([1.0, 2.0], requires_grad=True)
    assert np.asarray(xgather.onnx.gather(grad, torch.tensor([1]))).tolist() == [2.0]
    out = xgather.onnx.gather_elements(data, torch.tensor([[3, 0, -1]]), 0)
    np.testing.assert_array_equal(np.asarray(out),
                                  ref.gather_elements(DATA, np.array([[3, 0, -1]]), 0))
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"index 9 at indices\[1\] is out of range \[-4, 3\]"):
        xgather.onnx.gather(data, torch.tensor([1, 9]))


def test_torch_cpu_tensors_without_jax_cpu_backend(monkeypatch):
    """Where JAX has no CPU backend (``JAX_PLATFORMS=cuda``), its DLPack import cannot
    read a CPU tensor: torch's bfloat16 (which NumPy reads through ml_dtypes only) is read
    on the host, as the other types are, and gathered on the default device."""
    torch = pytest.importorskip("torch", reason="torch is installed on CI's oldest leg only")

    def no_cpu_backend(*args, **kwargs):
        raise RuntimeError("Unknown backend cpu. Available backends are ['cuda']")
    monkeypatch.setattr(jax.dlpack, "from_dlpack", no_cpu_backend)
    half = torch.tensor([[1.5, -2.5e-3], [3.0e38, 7.0]], dtype=torch.bfloat16).T
    got = xgather.onnx.gather(half, torch.tensor([1, -2]))
    assert got.dtype == jax.numpy.bfloat16 and got.devices() == {jax.devices()[0]}
    want = half[torch.tensor([1, -2])].float().numpy()
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want)
    grad = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, requires_grad=True)
    assert np.asarray(xgather.onnx.gather(grad, np.array([1]))).astype(np.float32).tolist() \
        == [2.0]


def test_torch_tensors_with_a_negative_or_conjugate_bit_are_read_as_their_values():
    """torch keeps ``-x`` and ``conj(z)`` as a bit beside the memory, which DLPack does not
    carry: the values read are the tensor's, as torch prints them."""
    torch = pytest.importorskip("torch", reason="torch is installed on CI's oldest leg only")
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j])
    negated = z.conj().imag  # a view with its negative bit set
    assert negated.is_neg()
    want_neg = np.array([-2.0, 4.0, -0.5], np.float32)
    conj = z.conj()
    assert conj.is_conj()
    want_conj = np.array([1 - 2j, 3 + 4j, -5 - 0.5j], np.complex64)
    idx = np.array([2, 0, -2])
    for op in (xgather.onnx.gather, xgather.openvino.gather):
        np.testing.assert_array_equal(np.asarray(op(negated, idx, 0)), want_neg[idx])
        np.testing.assert_array_equal(np.asarray(op(conj, idx, 0)), want_conj[idx])


@pytest.mark.parametrize("name", ["data", "indices"])
def test_torch_tensors_on_the_meta_device_are_refused(name):
    torch = pytest.importorskip("torch", reason="torch is installed on CI's oldest leg only")
    meta = torch.empty(3, dtype=torch.float32 if name == "data" else torch.int64,
                       device="meta")
    args = (meta, np.array([0])) if name == "data" else (DATA, meta)
    with pytest.raises(xgather.XGatherTypeError,
                       match=rf"xgather.onnx.gather: {name} is a torch.Tensor on the meta "
                             r"device, which has a shape and no values"):
        xgather.onnx.gather(*args)


@pytest.mark.parametrize("name", ["data", "indices"])
def test_typed_prng_key_arrays_are_refused_with_the_way_to_gather_them(name):
    keys = jax.random.split(jax.random.key(0), 4)
    args = (keys, np.array([0, 2])) if name == "data" else (DATA, keys)
    pattern = (rf"onnx.Gather-13: {name} is an array of typed PRNG keys, which no gather "
               r"spec defines; gather their raw bits \(jax.random.key_data")
    for call in (lambda: xgather.onnx.gather(*args),
                 lambda: jax.jit(lambda a, b: xgather.onnx.gather(a, b, mode="clip"))(*args),
                 lambda: xgather.explain(xgather.onnx.gather, *args)):
        with pytest.raises(xgather.XGatherTypeError, match=pattern):
            call()
    # what the message advises gives jnp.take's keys
    if name == "data":
        raw = xgather.onnx.gather(jax.random.key_data(keys), np.array([0, 2]))
        got = jax.random.wrap_key_data(raw)
        want = jax.numpy.take(keys, np.array([0, 2]), axis=0)
        np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))


class ShapeAndDtype:
    """Looks like an array (``.shape``, ``.dtype``) and holds no values."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


@pytest.mark.parametrize("name", ["data", "indices"])
def test_an_object_with_shape_and_dtype_only_is_no_array(name):
    args = ((ShapeAndDtype((4, 3), np.float32), np.array([0])) if name == "data" else
            (DATA, ShapeAndDtype((2,), np.int32)))
    for op in (xgather.onnx.gather, xgather.openvino.gather, xgather.labview.gather):
        with pytest.raises(xgather.XGatherTypeError,
                           match=rf"{name} is not an array: it has .shape and .dtype but no "
                                 r"values .*; got tests.test_inputs.ShapeAndDtype"):
            op(*args, 0)
    # explain takes it: a plan needs shapes only
    assert xgather.explain(xgather.onnx.gather, *args).out_shape == ((1, 3) if name == "data"
                                                                     else (2, 3))


@pytest.mark.parametrize("shape", [(3, -2), (-1,)])
def test_explain_refuses_negative_dims(shape):
    for data, idx, name in ((jax.ShapeDtypeStruct(shape, np.float32), np.zeros(2, int), "data"),
                            (DATA, jax.ShapeDtypeStruct(shape, np.int32), "indices")):
        with pytest.raises(xgather.XGatherError,
                           match=rf"onnx.Gather-13: every dim of {name} must be >= 0; got "
                                 rf"{name}.shape=\({shape[0]},"):
            xgather.explain(xgather.onnx.gather, data, idx)


MASKED = [
    ("float data", np.ma.masked_array(DATA, mask=DATA > 5), np.array([0])),
    ("indices", DATA, np.ma.masked_array([0, 1], mask=[0, 1])),
    ("string data (the host path)", np.ma.masked_array(np.array(["a", "b"]), mask=[1, 0]),
     np.array([0])),
    ("64-bit data (the host path with x64 off)",
     np.ma.masked_array(np.array([1, 2], np.int64), mask=[1, 0]), np.array([0])),
]


@pytest.mark.parametrize("what, data, idx", MASKED, ids=[m[0] for m in MASKED])
def test_masked_arrays_are_refused_on_every_path(what, data, idx):
    name = "indices" if what == "indices" else "data"
    for call in (lambda: xgather.onnx.gather(data, idx),
                 lambda: xgather.openvino.gather(data, idx, 0),
                 lambda: jax.jit(lambda: xgather.onnx.gather(data, idx, mode="clip"))()):
        with pytest.raises(xgather.XGatherTypeError,
                           match=rf"{name} is a NumPy masked array: a mask means nothing"):
            call()


def test_lists_holding_objects_get_a_clear_error():
    with pytest.raises(xgather.XGatherTypeError,
                       match=r"^onnx\.Gather-13: data as a list must hold numbers \(integers "
                             r"within 64 bits\) or strings only; got \[1.0, None, 2.0\]"):
        xgather.onnx.gather([1.0, None, 2.0], np.array([0]))
    with pytest.raises(xgather.XGatherTypeError, match="indices as a list must hold numbers"):
        xgather.onnx.gather(DATA, [0, None])
    with pytest.raises(xgather.XGatherTypeError, match="^openvino.Gather-8: data as a list"):
        xgather.openvino.gather([None], [0], 0)
    with pytest.raises(xgather.XGatherTypeError, match=r"^openvino\.Gather-8: data as a list "
                                                       r"must hold numbers \(integers within 64"):
        xgather.openvino.gather([2**70, 1], [0], 0)
    # Lists of numbers are taken as before (JAX's dtype for them).
    assert np.asarray(xgather.onnx.gather([1.0, 2.0], [1])).tolist() == [2.0]


@pytest.mark.parametrize("dtype", [">f4", ">i4", ">i8", ">f8", ">c8", ">u2"])
def test_other_byte_orders_are_read_as_their_values(dtype):
    data = (np.arange(6) * 3 + 1).reshape(3, 2).astype(dtype)
    native = data.astype(np.dtype(dtype).newbyteorder("="))
    idx = np.array([2, -1, 0], ">i4")
    calls = [lambda: xgather.onnx.gather(data, idx), lambda: xgather.openvino.gather(data, idx, 0)]
    if X64 or np.dtype(dtype).itemsize < 8:  # else the host path, which jit cannot run
        calls.append(jax.jit(lambda: xgather.onnx.gather(data, idx, mode="clip")))
    for call in calls:
        out = np.asarray(call())
        assert out.dtype.isnative and out.dtype.kind == native.dtype.kind
        np.testing.assert_array_equal(out, native[[2, -1, 0]])
    with pytest.raises(xgather.OutOfBoundsError, match="index 7 at indices"):
        xgather.onnx.gather(data, np.array([7], ">i8"))


def test_clear_caches_frees_the_compiled_programs():
    data, idx = np.arange(7, dtype=np.float32), np.array([1, 2], np.int32)
    xgather.clear_caches()
    xgather.onnx.gather(data, idx, mode="clip")
    (runner,) = xgather._frontend.RUNNERS.values()  # the jitted function, with its program
    alive = weakref.ref(runner)
    del runner
    gc.collect()
    assert alive() is not None  # held by the cache
    xgather.clear_caches()
    gc.collect()
    assert alive() is None and not xgather._frontend.RUNNERS
    np.testing.assert_array_equal(np.asarray(xgather.onnx.gather(data, idx)), data[[1, 2]])


# -- exporting without xgather's plugin ----------------------------------------------------------

_UNREGISTERED = """
import sys, numpy as np, jax2onnx, xgather
d = np.arange(12, dtype=np.float32).reshape(4, 3)
i = np.array([1, 7, -1], np.int32)
for f in [{fns}]:
    try:
        jax2onnx.to_onnx(f, [d, i], opset=21)
        print("exported")
    except xgather.XGatherError as err:
        print("refused:", str(err).replace(chr(10), " "))
    except AttributeError as err:  # jax2onnx 0.17.1 on jax 0.12 fails after tracing, unaided
        print("failed:", str(err).replace(chr(10), " "))
    print("eager:", [np.asarray(f(d, np.array([1, 2, -1], np.int32))).tolist() for _ in range(3)])
    sys.stdout.flush()
"""

#: Each export in turn, in one process: the later ones after the earlier ones' patches.
_EXPORTS = {
    # jax2onnx drops lax.gather's clip and fill: index -7 into 6 columns exported as 5
    "clip": ("lambda d, i: xgather.onnx.gather(d, i, 0, mode='clip')", "refused"),
    "fill": ("lambda d, i: xgather.onnx.gather(d, i, 0, mode='fill')", "refused"),
    "openvino": ("lambda d, i: xgather.openvino.gather(d, i, 0)", "refused"),
    "default": ("lambda d, i: xgather.onnx.gather(d, i, 0)", "refused"),
    "promise": ("lambda d, i: xgather.onnx.gather(d, i, 0, mode='promise_in_bounds')",
                "exported"),
}


@pytest.mark.subprocess
def test_exports_without_the_plugin_leave_xgather_working():
    pytest.importorskip("jax2onnx")
    fns = ", ".join(fn for fn, _ in _EXPORTS.values())
    proc = subprocess.run([sys.executable, "-c", _UNREGISTERED.format(fns=fns)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * len(_EXPORTS), proc.stdout
    want = DATA[[1, 2, -1]].tolist()
    pairs = zip(lines[::2], lines[1::2], strict=True)  # what each export printed
    for (name, (_, outcome)), (export, eager) in zip(_EXPORTS.items(), pairs, strict=True):
        # jax2onnx 0.17.1 cannot finish an export on jax 0.12 without xgather's plugin (it
        # reads jax._src.core.ClosedJaxpr, which the plugin restores); it traced under its
        # patches all the same, which is what the eager calls after it must survive.
        assert export.startswith(outcome) or (
            outcome == "exported" and "ClosedJaxpr" in export), (name, proc.stdout)
        if outcome == "refused":  # the advice names what an exporter needs
            assert "xgather.export.register_jax2onnx()" in export, (name, export)
        assert eager == f"eager: {[want] * 3}", (name, proc.stdout)


@pytest.mark.subprocess
@pytest.mark.skipif(X64, reason="already the x64 run")
def test_with_x64_on():
    from tests.helpers import rerun_with_x64
    rerun_with_x64(__file__, "not x64_on and not without_the_plugin")


def test_every_jax_function_xgather_calls_is_watched_for_patches():
    import re

    import jax.numpy as jnp
    from jax import lax

    from xgather import _patches
    modules = {"jax": jax, "jnp": jnp, "lax": lax}
    source = "\n".join(p.read_text() for p in (ROOT / "xgather").rglob("*.py"))
    called = {(prefix, name) for prefix, name in
              re.findall(r"\b(jax|jnp|lax)\.([a-z_][a-z0-9_]*)\(", source)}
    functions = {(prefix, name) for prefix, name in called
                 if callable(vars(modules[prefix]).get(name))
                 and not isinstance(vars(modules[prefix]).get(name), type)}
    watched = {(prefix, name) for prefix, module in modules.items()
               for name in _patches.WATCHED.get(module, ())}
    assert functions <= watched, sorted(functions - watched)


def test_a_patch_left_elsewhere_does_not_stop_the_caches(monkeypatch):
    import jax.numpy as jnp
    monkeypatch.setattr(jnp, "cumsum", lambda *a, **k: None)  # as jax2onnx 0.17.1 leaves it
    assert not xgather._patches.foreign()
    monkeypatch.setattr(jnp, "where", lambda *a, **k: None)
    assert xgather._patches.foreign()
