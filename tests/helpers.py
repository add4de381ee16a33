"""Run one op eagerly, under jit and under vmap, and compare with a reference."""

from __future__ import annotations

import jax
import numpy as np

import xgather


def assert_same(got, want):
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def check_everywhere(f, data, indices, ref, tuples=False):
    """``f(data, indices)`` eagerly, jitted (checked), and vmapped over a stacked pair.

    ``ref(data, indices)`` is the NumPy reference; it sees each vmapped item on its own.
    ``tuples``: the last axis of ``indices`` holds index tuples (kept in order).
    """
    data, indices = np.asarray(data), np.asarray(indices)
    want = ref(data, indices)
    assert_same(f(data, indices), want)
    assert_same(xgather.checked(jax.jit(f))(data, indices), want)
    data2 = (data[::-1] if data.ndim and data.shape[0] else data).copy()
    axes = tuple(range(indices.ndim - 1 if tuples else indices.ndim))
    indices2 = np.flip(indices, axes).copy()
    got = xgather.checked(jax.vmap(f))(np.stack([data, data2]), np.stack([indices, indices2]))
    assert_same(got[0], want)
    assert_same(got[1], ref(data2, indices2))
