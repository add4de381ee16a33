"""Indices made ready for ``lax.gather``, then the gather: a dtype that counts to every
axis, negative indices wrapped where the spec says so, 64-bit indices saturated into
int32's range (on every platform). Everything here is exact for every legal index: the
wrap is never skipped on a guess, only where indices cannot be negative (unsigned, or
``negative_indices=False``), which is known at trace time.

"The spec's range" is ``[-s, s-1]`` where negative indices count from the end
(``plan.negative``), else ``[0, s-1]``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from xgather import _grad, _lower
from xgather._gather import Call

# -- the reductions over the indices: "is any value true" -----------------------------------

# Above this many indices, the flag's first stage reduces (rows, lanes) blocks.
_BLOCKED_ABOVE = 1 << 15
# XLA:CPU runs a float32 max over _LIBRARY_MIN or more values as a library kernel; over
# fewer it compiles loops (one unrolled loop up to _UNROLLED_MAX values). Beside large
# gathers, flags of _UNROLLED_MAX+1 to _LIBRARY_MIN-1 values are padded up to _LIBRARY_MIN,
# which compiles faster and costs a little per call, hidden by such a gather. Beside small
# gathers (Plan.small) the padding would be a large part of the call, so their flags are
# not padded: a boolean jnp.any compiles faster than the float loops there and runs as
# fast. Over several thousand values jnp.any compiles slowly, hence the float max
# everywhere else. The measurements behind these choices: docs/lowering.md.
_LIBRARY_MIN, _UNROLLED_MAX = 1 << 12, 32
_BLOCK_ROWS, _BLOCK_LANES = 32, 128


def any_true(bad, form: str, pad: bool = True):
    """``bad.any()``, in the ``form`` a platform's choices name (``Plan.flag_form``): the
    one XLA:CPU compiles and runs fastest there, ``jnp.any`` elsewhere.

    On XLA:CPU the flag is a float32 max, which goes to a library kernel (a
    boolean reduction of many values becomes a tree of scalar loops, slow to
    compile and to run). With ``pad``, fewer than ``_LIBRARY_MIN`` values (but
    more than ``_UNROLLED_MAX``) are padded with ``False`` up to that size;
    without it they are reduced by ``jnp.any``. Above ``_BLOCKED_ABOVE``, a first
    stage reduces (rows, lanes) blocks over their rows, fused with the compare
    that makes ``bad``. Both forms compute the same flag, so a program lowered with
    another platform's form stays exact.
    """
    flat = bad.ravel()
    n = flat.size
    if not _lower.known(n):  # a symbolic size (jax.export): the plain form
        return jnp.any(flat)
    if n == 0:
        return jnp.zeros((), bool)
    if form != "float max":
        return jnp.any(flat)
    m, _, size = flag_steps(n, pad)
    if m:
        lanes = flat[:m].reshape(-1, _BLOCK_ROWS, _BLOCK_LANES).any(axis=1).ravel()
        flat = jnp.concatenate([lanes, flat[m:]]) if m < n else lanes
    if size > flat.size:
        flat = jnp.pad(flat, (0, size - flat.size))
    if _UNROLLED_MAX < size < _LIBRARY_MIN:  # not padded: beside a small gather
        return jnp.any(flat)
    return jnp.max(flat.astype(jnp.float32)) > 0


def flag_steps(n: int, pad: bool = True) -> tuple[int, int, int]:
    """``(m, read, size)``: how ``any_true`` reduces ``n`` values on XLA:CPU. The
    first ``m`` are reduced in (rows, lanes) blocks first (0: none), leaving ``read``
    values, which the float32 max reads padded to ``size``."""
    block = _BLOCK_ROWS * _BLOCK_LANES
    m = n // block * block if n > _BLOCKED_ABOVE else 0
    read = size = m // _BLOCK_ROWS + n - m
    if pad and _UNROLLED_MAX < read < _LIBRARY_MIN:
        size = _LIBRARY_MIN
    return m, read, size



def any_form(n, form: str, pad: bool = True) -> str:
    """What ``any_true`` over ``n`` values is on ``platform`` (``explain`` shows it)."""
    if form != "float max" or not isinstance(n, int):
        return f"jnp.any over the {n} index values"
    m, read, size = flag_steps(n, pad)
    blocks = (f"{m} of them in ({_BLOCK_ROWS}, {_BLOCK_LANES}) blocks first, then " if m
              else "")
    if _UNROLLED_MAX < size < _LIBRARY_MIN:  # not padded: beside a small gather
        return f"jnp.any over the {n} index values" + (f" ({blocks}over {read})" if m else "")
    kind = "one unrolled max" if size <= _UNROLLED_MAX else "the library max"
    padded = f" padded to {size}" if size > read else ""
    return f"a float32 max over the {n} index values ({blocks}{kind} over {read}{padded})"


def fit_dtype(plan, indices):
    """Indices in a dtype that can hold ``index + s`` for every axis: narrow integers
    become int32, and where an axis is longer than the dtype can count (int32 indices
    into an axis of ``2**31`` elements or more, with x64 on), 64-bit (NumPy or JAX)."""
    if np.dtype(indices.dtype).itemsize < 4:
        indices = indices.astype(np.int32)
    if max(plan.bounds, default=0) > np.iinfo(indices.dtype).max:
        wide = np.uint64 if np.dtype(indices.dtype).kind == "u" else np.int64
        indices = indices.astype(wide)  # the axis exists only with x64 on
    return indices


def bounds_array(plan, indices, xp=jnp):
    """``s`` for each index: a scalar, or ``indices``' shape for index tuples (NumPy or JAX)."""
    if plan.index_vector:
        s = xp.asarray(np.asarray(plan.bounds), dtype=indices.dtype)
        return xp.broadcast_to(s, indices.shape)
    return xp.asarray(plan.bounds[0], dtype=indices.dtype)


def valid(plan, indices, xp):
    """True where an index lies in the spec's range (before any wrap). Traced, in
    ``lax`` ops: ``jnp``'s are jitted functions, each traced again at every new shape
    (a first call's cost)."""
    signed = np.issubdtype(indices.dtype, np.signedinteger)
    if xp is not jnp:
        s = bounds_array(plan, indices, xp)
        inside = indices < s
        if signed:
            inside = inside & (indices >= (-s if plan.negative else 0))
        return inside
    s = _bounds_lax(plan, indices)
    inside = lax.lt(indices, s)
    if signed:
        low = lax.neg(s) if plan.negative else lax.full_like(s, 0)
        inside = lax.bitwise_and(inside, lax.ge(indices, low))
    return inside


def _bounds_lax(plan, indices):
    """``bounds_array`` for traced indices, as a constant of their shape."""
    dtype = np.dtype(indices.dtype)
    if plan.index_vector:
        s = np.asarray(plan.bounds, dtype)
        return lax.broadcast_in_dim(s, indices.shape, (indices.ndim - 1,))
    return lax.full(indices.shape, plan.bounds[0], dtype)


def out_of_range(plan, indices):
    """The ``"error"`` mode's flag: some index lies outside the spec's range (before any
    wrap), reduced in the form the plan's platform runs fastest (``xgather._lower``)."""
    bad = jnp.logical_not(valid(plan, fit_dtype(plan, indices), jnp))
    return any_true(bad, plan.flag_form, pad=not plan.small)


def wraps(plan, indices) -> bool:
    """Whether negative indices count from the end here (the spec's rule, signed indices)."""
    return plan.negative and jnp.issubdtype(indices.dtype, jnp.signedinteger)


def wrap(plan, indices):
    """Negative indices count from the end where the spec says so: ``i + s`` for ``i < 0``.

    A compare, an add and a select: plain ops that every backend and every
    exporter knows (no bit casts; ONNX has ``BitCast`` only from opset 26).
    An index below ``-s`` stays negative, so out of range for every mode.
    """
    if not wraps(plan, indices):
        return indices
    s = _bounds_lax(plan, indices)
    return lax.select(lax.lt(indices, lax.full_like(indices, 0)), lax.add(indices, s), indices)


def saturate_64(plan, indices):
    """64-bit indices saturated into the int32 range, on every platform, where every
    axis fits it.

    XLA's gather keeps only the low 32 bits of a 64-bit index into a small operand:
    XLA:CPU (jax 0.10.2: index ``2**32 + 5`` reads row 5 under ``"fill"``) and XLA:GPU
    (jax 0.11.2 on an H200: OpenVINO Gather's ``2**40`` read row 0 where the spec says
    zeros). Saturating first keeps every out-of-range index out of range, on the same
    side, and in-range indices unchanged, so the clamp is exact on every platform and
    runs on each (no choice per platform: a program exported for several is the same
    program on each). The dtype stays 64-bit. Runs after ``wrap``.
    """
    if jnp.dtype(indices.dtype).itemsize != 8 or max(plan.bounds, default=0) >= 2**31:
        return indices
    info = np.iinfo(np.int32)
    low = jnp.asarray(0 if jnp.issubdtype(indices.dtype, jnp.unsignedinteger) else info.min,
                      indices.dtype)
    return lax.clamp(low, indices, jnp.asarray(info.max, indices.dtype))


def ready(plan, indices):
    """The indices as the gather reads them: fitted, wrapped, saturated (all inline)."""
    indices = fit_dtype(plan, indices)
    return saturate_64(plan, wrap(plan, indices))


def gather(call: Call, data, indices, *, inline_wrap: bool = False):
    """``call``'s gather of ``data`` at ``indices``, made ready here.

    Where the wrap goes (``plan.wrap_pass``): ``"fused"`` (small gathers, wide slices)
    or ``inline_wrap`` (the programs that check) compute it inside the gather, a
    compare and a select that run as fast there as in a pass of their own and compile
    30-40% faster (docs/lowering.md). Otherwise one reduction over the indices asks
    whether any is negative, and only then does a branch of a conditional wrap them:
    indices in ``[0, s-1]``, the common case, reach the gather untouched (XLA would
    fuse the wrap into the gather and recompute it for every element copied). With
    ``"gather"`` (element gathers, as many indices as elements copied) the gather runs
    inside each branch, so that the indices are not copied out of the conditional;
    with ``"separate"`` (row gathers) after it.
    """
    plan = call.plan
    indices = fit_dtype(plan, indices)
    if not wraps(plan, indices) or inline_wrap or plan.wrap_pass == "fused":
        return _ready_gather(call, True, data, indices)  # (wrap: nothing where none wraps)
    negative = any_true(indices < 0, plan.flag_form)
    if plan.wrap_pass == "gather":  # the gather in each branch: the indices stay inside
        return lax.cond(negative, functools.partial(_ready_gather, call, True),
                        functools.partial(_ready_gather, call, False), data, indices)
    indices = lax.cond(negative, functools.partial(wrap, plan), lambda i: i, indices)
    return _ready_gather(call, False, data, indices)


def _ready_gather(call: Call, wrapped: bool, data, indices):
    """The gather of indices wrapped already (or here, with ``wrapped``), saturated here."""
    if wrapped:
        indices = wrap(call.plan, indices)
    indices = saturate_64(call.plan, indices)
    return _grad.gather(call, data, indices)
