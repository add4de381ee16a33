"""Model steps: a gather inside the small jitted computation a model runs it in.

A model does not run a gather back to back with itself: its lookup feeds a
dense layer, its GatherElements a softmax. Each step workload (``M1``-``M4``,
:data:`bench.workloads.WORKLOADS`) names the gather (``op``, ``axis``,
``batch_dims``, as the gather workloads do) and a ``step``, the computation
around it:

* ``dense``: ``sum(relu(gather(table, ids) @ W))``, an embedding lookup feeding a
  dense layer;
* ``dense_grad``: the gradient of ``dense`` in the table and ``W``;
* ``softmax_matmul``: ``softmax(gather_elements(x, i), axis=-1) @ W``, a
  post-processing step;
* ``standardize_matmul``: ``standardize(gather_nd(x, i, batch_dims=1)) @ W``, an
  indexing step (each gathered row centred and scaled over its last axis).

The same step runs in JAX around xgather's op (the spec's default under
``xgather.checked``, and promise), around a hand-written ``lax.gather``, and in
torch around its own gather, so that the default's cost is read where users
pay it.
"""

from __future__ import annotations

import numpy as np

STEPS = ("dense", "dense_grad", "softmax_matmul", "standardize_matmul")
#: The width of the matmul after the gather, where it is not the data's own.
PROJECTION = 64


def weight_shape(w, dshape, ishape) -> tuple[int, int]:
    """The step's weight matrix's shape for data of shape ``dshape`` and indices of shape
    ``ishape``: ``(n, n)`` for the dense steps, else ``(n, PROJECTION)``, where ``n`` is
    the width of the gather's output (its last axis), which the matmul contracts. That is
    not always the data's: M3's GatherElements reads rows of 32768 at GPU sizes and
    gathers rows of 8192."""
    n = w.gather_shape(dshape, ishape)[-1]
    return (n, n) if w.step in ("dense", "dense_grad") else (n, PROJECTION)


def weights(w, data, idx) -> np.ndarray:
    """The step's weight matrix (float32, drawn from a fixed seed)."""
    shape = weight_shape(w, data.shape, idx.shape)
    rng = np.random.default_rng(1)
    return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0])).astype(np.float32)


def jax_step(w, gather):
    """``f(data, indices, weights)``: the step around ``gather(data, indices)`` in JAX."""
    import jax
    import jax.numpy as jnp

    if w.step in ("dense", "dense_grad"):
        def dense(d, i, wt):
            return jnp.maximum(gather(d, i) @ wt, 0).sum()
        if w.step == "dense":
            return dense
        grad = jax.grad(dense, argnums=(0, 2))
        return lambda d, i, wt: grad(d, i, wt)
    if w.step == "softmax_matmul":
        return lambda d, i, wt: jax.nn.softmax(gather(d, i), axis=-1) @ wt

    def standardize_matmul(d, i, wt):
        y = gather(d, i)
        y = (y - y.mean(-1, keepdims=True)) / (y.std(-1, keepdims=True) + 1e-5)
        return y @ wt
    return standardize_matmul


def torch_step(w, gather):
    """``f(data, indices, weights)``: the same step in torch around its ``gather``."""
    import torch

    if w.step in ("dense", "dense_grad"):
        def dense(d, i, wt):
            return torch.relu(gather(d, i) @ wt).sum()
        if w.step == "dense":
            return dense

        def dense_grad(d, i, wt):
            d.grad = wt.grad = None
            dense(d, i, wt).backward()
            return d.grad, wt.grad
        return dense_grad
    if w.step == "softmax_matmul":
        return lambda d, i, wt: torch.softmax(gather(d, i), dim=-1) @ wt

    def standardize_matmul(d, i, wt):
        y = gather(d, i)
        y = (y - y.mean(-1, keepdim=True)) / (y.std(-1, keepdim=True, correction=0) + 1e-5)
        return y @ wt
    return standardize_matmul


def numpy_step(w, data, idx, wt):
    """The step in NumPy (float64 inside): the reference the runners are checked against."""
    d, wt = data.astype(np.float64), wt.astype(np.float64)
    if w.op == "onnx.gather":
        y = np.take(d, idx, axis=w.axis)
    elif w.op == "onnx.gather_elements":
        y = np.take_along_axis(d, idx, axis=w.axis)
    else:  # gather_nd, batch_dims=1, one index component
        y = d[np.arange(d.shape[0])[:, None], idx[..., 0]]
    if w.step == "dense":
        return np.maximum(y @ wt, 0).sum()
    if w.step == "dense_grad":
        mask = (y @ wt > 0).astype(np.float64)      # d sum(relu(y @ wt)) / d(y @ wt)
        g_wt = y.T @ mask
        g_y = mask @ wt.T
        g_d = np.zeros_like(d)
        np.add.at(g_d, idx, g_y)
        return g_d, g_wt
    if w.step == "softmax_matmul":
        e = np.exp(y - y.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ wt
    y = (y - y.mean(-1, keepdims=True)) / (y.std(-1, keepdims=True) + 1e-5)
    return y @ wt
