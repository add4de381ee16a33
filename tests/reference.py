"""NumPy references written from the spec texts, with plain loops.

Nothing here calls xgather. Each function follows the formula of its spec:

* ``gather``: OpenVINO Gather-7/8 (ONNX Gather is its ``batch_dims=0`` case):
  ``out[p_0..p_{axis-1}, i_b..i_{M-1}, p_{axis+1}..] =
  data[p_0..p_{axis-1}, indices[p_0..p_{b-1}, i_b..i_{M-1}], p_{axis+1}..]``.
* ``gather_nd``: ONNX GatherND: each index tuple of length ``k`` in
  ``indices[b..., q...]`` picks ``data[b..., tuple, :...]``.
* ``gather_elements``: ONNX GatherElements:
  ``out[i] = data[i_0, .., indices[i], .., i_{r-1}]``.

Out-of-range handling, per index component of size ``s``:
``"error"`` raises IndexError; ``"clip"`` wraps in-range negatives then clamps;
``"fill"`` writes ``fill`` (the whole slice for GatherND).
"""

from __future__ import annotations

import numpy as np


class Fill(Exception):
    pass


def resolve(k: int, s: int, negative: bool = True, oob: str = "error") -> int:
    k = int(k)
    lo = -s if negative else 0
    if lo <= k < s:
        return k + s if k < 0 else k
    if oob == "error":
        raise IndexError(f"index {k} out of range [{lo}, {s - 1}]")
    if oob == "fill":
        raise Fill
    if oob == "clip":
        if negative and -s <= k < 0:
            k += s
        return min(max(k, 0), s - 1)
    raise ValueError(oob)


def gather(data, indices, axis=0, batch_dims=0, *, negative=True, oob="error", fill=0):
    data, indices = np.asarray(data), np.asarray(indices)
    r, q, b = data.ndim, indices.ndim, batch_dims
    axis = axis + r if axis < 0 else axis
    out_shape = data.shape[:axis] + indices.shape[b:] + data.shape[axis + 1:]
    out = np.empty(out_shape, data.dtype)
    s = data.shape[axis]
    for pos in np.ndindex(*out_shape):
        pre, ii, post = pos[:axis], pos[axis:axis + q - b], pos[axis + q - b:]
        k = indices[pre[:b] + ii]
        try:
            out[pos] = data[pre + (resolve(k, s, negative, oob),) + post]
        except Fill:
            out[pos] = fill
    return out


def gather_nd(data, indices, batch_dims=0, *, negative=True, oob="error", fill=0):
    data, indices = np.asarray(data), np.asarray(indices)
    b, k = batch_dims, indices.shape[-1]
    out_shape = indices.shape[:-1] + data.shape[b + k:]
    out = np.empty(out_shape, data.dtype)
    for pos in np.ndindex(*indices.shape[:-1]):
        tup = indices[pos]
        try:
            where = tuple(resolve(tup[j], data.shape[b + j], negative, oob) for j in range(k))
            out[pos] = data[pos[:b] + where]
        except Fill:
            out[pos] = fill
    return out


def gather_elements(data, indices, axis=0, *, negative=True, oob="error", fill=0):
    data, indices = np.asarray(data), np.asarray(indices)
    axis = axis + data.ndim if axis < 0 else axis
    out = np.empty(indices.shape, data.dtype)
    for pos in np.ndindex(*indices.shape):
        src = list(pos)
        try:
            src[axis] = resolve(indices[pos], data.shape[axis], negative, oob)
            out[pos] = data[tuple(src)]
        except Fill:
            out[pos] = fill
    return out


def scatter_add_take(shape, indices, cotangent, axis=0, batch_dims=0, *, negative=True,
                     oob="error", scale=1.0):
    """The gradient of ``gather`` w.r.t. data: each cotangent entry added at its source."""
    indices, cotangent = np.asarray(indices), np.asarray(cotangent)
    grad = np.zeros(shape, cotangent.dtype)
    r, q, b = len(shape), indices.ndim, batch_dims
    axis = axis + r if axis < 0 else axis
    s = shape[axis]
    for pos in np.ndindex(*cotangent.shape):
        pre, ii, post = pos[:axis], pos[axis:axis + q - b], pos[axis + q - b:]
        try:
            grad[pre + (resolve(indices[pre[:b] + ii], s, negative, oob),) + post] += cotangent[pos]
        except Fill:
            pass
    return grad * scale


def vjp_data(gather_ref, shape, cotangent, *args, **kwargs):
    """The gradient w.r.t. ``data`` of any reference gather: scatter-add of the cotangent.

    ``gather_ref`` runs on the flat positions of ``data`` (filled slots are -1), so
    every output element knows its source; the cotangent is added there, duplicates
    accumulating and filled slots dropping out.
    """
    positions = gather_ref(np.arange(int(np.prod(shape))).reshape(shape), *args, fill=-1,
                           **kwargs)
    cotangent = np.asarray(cotangent)
    grad = np.zeros(int(np.prod(shape)), cotangent.dtype)
    keep = positions >= 0
    np.add.at(grad, positions[keep], cotangent[keep])
    return grad.reshape(shape)
