"""An eager call reads no memory of the caller's after it returns: a data loader that
refills one NumPy buffer (or torch tensor) between calls gets, from every call, the
gather of what it passed. The reference is NumPy's own indexing of a copy of each batch.

The race these tests catch needs a program that is still running when the caller
refills its buffer: large enough gathers, and many batches (before the copy or wait was
made, most batches of every mode came back partly from the next batch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgather
from xgather import _dtypes

MODES = [None, "clip", "fill", "promise_in_bounds"]
BATCHES = 12
N = 400_000  # indices per batch


def _batches(rng, rows):
    # in range, negative ones too (they count from the end in every mode)
    return [rng.integers(-rows, rows, N).astype(np.int32) for _ in range(BATCHES)]


def _kw(mode):
    return {} if mode is None else {"mode": mode}


def _refill(values, buf, fill, call):
    """``call(buf)`` after each refill of ``buf`` with the next of ``values``, as a data
    loader runs; the results read only after the loop."""
    outs = []
    for v in values:
        fill(buf, v)
        outs.append(call(buf))
    return [np.asarray(o) for o in outs]


def _refill_indices(table, batches, mode, buf, fill):
    return _refill(batches, buf, fill,
                   lambda b: xgather.onnx.gather(table, b, axis=0, **_kw(mode)))


def _refill_data(tables, idx, mode, buf, fill):
    return _refill(tables, buf, fill,
                   lambda t: xgather.onnx.gather(t, idx, axis=0, **_kw(mode)))


def _numpy_fill(buf, values):
    buf[:] = values


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("table_on", ["numpy", "device"])
def test_a_refilled_numpy_index_buffer(mode, table_on):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((1000, 4)).astype(np.float32)
    batches = _batches(rng, 1000)
    given = table if table_on == "numpy" else jax.device_put(table)
    outs = _refill_indices(given, batches, mode, np.empty(N, np.int32), _numpy_fill)
    wrong = [k for k, (o, b) in enumerate(zip(outs, batches, strict=True))
             if not np.array_equal(o, table[b])]
    assert not wrong, f"batches {wrong} of {BATCHES} read the buffer after the call returned"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", [2000, 80_000], ids=["copied", "read-in-place"])
def test_a_refilled_numpy_data_buffer(mode, rows):
    """Small data is copied; data over ``COPY_MAX`` bytes is read in place, and the call
    waits for its program."""
    assert (rows * 4 * 4 > _dtypes.COPY_MAX) == (rows == 80_000)
    rng = np.random.default_rng(1)
    tables = [rng.standard_normal((rows, 4)).astype(np.float32) for _ in range(6)]
    idx = jax.device_put(rng.integers(-rows, rows, N).astype(np.int32))
    host_idx = np.asarray(idx)
    outs = _refill_data(tables, idx, mode, np.empty((rows, 4), np.float32), _numpy_fill)
    wrong = [k for k, (o, t) in enumerate(zip(outs, tables, strict=True))
             if not np.array_equal(o, t[host_idx])]
    assert not wrong, f"tables {wrong} were read after the call returned"


@pytest.mark.parametrize("mode", MODES)
def test_a_refilled_64_bit_index_buffer(mode):
    """64-bit NumPy indices (converted to 32 bits with x64 off) are exact too."""
    rng = np.random.default_rng(2)
    table = rng.standard_normal((1000, 4)).astype(np.float32)
    batches = [b.astype(np.int64) for b in _batches(rng, 1000)]
    outs = _refill_indices(table, batches, mode, np.empty(N, np.int64), _numpy_fill)
    assert all(np.array_equal(o, table[b]) for o, b in zip(outs, batches, strict=True))


@pytest.mark.parametrize("mode", MODES)
def test_refilled_torch_tensors(mode):
    torch = pytest.importorskip("torch", reason="torch is installed on CI's oldest leg only")
    rng = np.random.default_rng(3)
    table = rng.standard_normal((1000, 4)).astype(np.float32)
    batches = _batches(rng, 1000)

    def fill(buf, values):
        buf.copy_(torch.from_numpy(values))
    outs = _refill_indices(torch.from_numpy(table.copy()), batches, mode,
                           torch.empty(N, dtype=torch.int32), fill)
    assert all(np.array_equal(o, table[b]) for o, b in zip(outs, batches, strict=True))
    tables = [rng.standard_normal((2000, 4)).astype(np.float32) for _ in range(6)]
    idx = rng.integers(-2000, 2000, N).astype(np.int32)
    outs = _refill_data(tables, torch.from_numpy(idx), mode,
                        torch.empty((2000, 4), dtype=torch.float32), fill)
    assert all(np.array_equal(o, t[idx]) for o, t in zip(outs, tables, strict=True))


def test_every_op_reads_its_indices_before_returning():
    """Each op, eager and cached, with the indices changed at once after the call."""
    rng = np.random.default_rng(4)
    data = rng.standard_normal((300, 300)).astype(np.float32)
    cases = {
        xgather.onnx.gather: (rng.integers(0, 300, N // 4), (0,)),
        xgather.onnx.gather_elements: (rng.integers(0, 300, (N // 300, 300)), (0,)),
        xgather.onnx.gather_nd: (rng.integers(0, 300, (N // 4, 2)), ()),
        xgather.openvino.gather: (rng.integers(0, 300, N // 4), (0,)),
        xgather.bnns.gather_nd: (rng.integers(0, 300, (N // 4, 2)), ()),
        xgather.labview.gather: (rng.integers(0, 300, N // 4), (0,)),
    }
    for op, (idx, attrs) in cases.items():
        want = np.asarray(op(data, idx.astype(np.int32).copy(), *attrs))
        for _ in range(3):  # the first call, then the cached path
            buf = idx.astype(np.int32)
            out = op(data, buf, *attrs)
            buf[:] = 0
            np.testing.assert_array_equal(np.asarray(out), want, err_msg=op.__name__)



@jax.jit
def _slow_copy(x):
    m = jax.lax.fori_loop(0, 100, lambda _, m: jnp.tanh(m @ m), jnp.full((128, 128), 0.01))
    return jnp.where(m[0, 0] > 2, 0, x)  # x itself: tanh stays within [-1, 1]


def _aligned_empty(n: int) -> np.ndarray:
    """An int32 buffer on a 64-byte boundary, which JAX reads in place where it can (jax
    0.12 copies a buffer off that boundary)."""
    raw = np.empty(4 * n + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + 4 * n].view(np.int32)


def _late(x):
    """``x`` on the device, from a program that runs for a while: a program given it starts
    only once the caller has moved on, and reads its other inputs then. That makes the race
    certain where a call returns before its program has read a NumPy buffer."""
    return _slow_copy(x)


@pytest.mark.parametrize("mode", [None, "clip"])
def test_a_refilled_index_buffer_under_the_sharded_gather(mode):
    from jax.sharding import Mesh
    mesh = Mesh(np.array(jax.devices()[:1]), ("rows",))
    rng = np.random.default_rng(5)
    table = rng.standard_normal((1000, 4)).astype(np.float32)
    batches = _batches(rng, 1000)[:4]
    outs = _refill(batches, _aligned_empty(N), _numpy_fill,
                   lambda b: xgather.sharded.gather(_late(table), b, mesh=mesh, rows="rows",
                                                    **_kw(mode)))
    wrong = [k for k, (o, b) in enumerate(zip(outs, batches, strict=True))
             if not np.array_equal(o, table[b])]
    assert not wrong, f"batches {wrong} read the buffer after the call returned"


@pytest.mark.parametrize("n,kind", [(200_000, "numpy"), (2_000_000, "numpy"),
                                    (200_000, "torch")], ids=["copied", "waited-for", "torch"])
def test_a_refilled_batch_buffer_under_checked(n, kind):
    """The user's jax.jit reads a NumPy argument in place on a CPU, after the call has
    returned; under ``xgather.checked`` the step gathers, and checks, the batch it was
    given. One batch holds a bad id: its call, and no other, reports it."""
    buf = _aligned_empty(n)
    if kind == "torch":
        torch = pytest.importorskip("torch", reason="torch is installed on CI's oldest leg only")
        buf = torch.from_numpy(buf)  # the same memory, written in place below
    rng = np.random.default_rng(6)
    table = rng.standard_normal((1000, 4)).astype(np.float32)
    step = xgather.checked(
        lambda t, batch: xgather.onnx.gather(t, batch["ids"], axis=0) * 2)
    batches = [rng.integers(-1000, 1000, n).astype(np.int32) for _ in range(6)]
    bad_call, bad_at = 3, n // 3
    batches[bad_call - 1][bad_at] = 1000
    outs, failures = [], []
    for b in batches:
        buf[:] = b if kind == "numpy" else torch.from_numpy(b)
        while True:  # as a training loop: an earlier call's failure, then this batch again
            try:
                outs.append(step(_late(table), {"ids": buf}))
                break
            except xgather.OutOfBoundsError as err:
                failures.append(err)
        buf[:] = 0  # the loader moves on at once: the call holds the batch it was given
    try:
        xgather.raise_if_error()
    except xgather.OutOfBoundsError as err:
        failures.append(err)
    assert [(e.call, e.index, e.position) for e in failures] == [(bad_call, 1000, (bad_at,))]
    for k, (o, b) in enumerate(zip(outs, batches, strict=True)):
        if k != bad_call - 1:
            np.testing.assert_array_equal(np.asarray(o), 2 * table[b], err_msg=f"batch {k}")
