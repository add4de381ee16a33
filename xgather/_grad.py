"""The derivative of every op: JAX's transpose of ``lax.gather``, except where a
spec reshapes it or where the data's precision would not hold the sum.

JAX transposes a gather into a scatter-add in the same out-of-bounds mode. Two
cases take a derivative defined here with ``jax.custom_jvp`` instead (so forward
mode, reverse mode and ``jax.hessian`` all work):

- LabVIEW's ``lda coeff`` and ``training?``: the tangent of the output is
  ``coeff * gather(tangent of data)``, which JAX transposes into
  ``coeff * scatter_add(cotangent)``. With ``training=False`` the tangent is
  zero, so no gradient reaches ``data``.
- Floating data narrower than float32 (bfloat16, float16, float8): the tangent is
  gathered in float32 and rounded once, so that the gradient's scatter-add sums
  in float32 and rounds each row's sum once (as torch's embedding backward
  does), instead of rounding after every addition: summed in bfloat16, the
  gradient of a row that 256 lookups hit was off by about 7%. The forward values
  (output and tangent) are the same either way.

The gradient's scatter-add is JAX's transpose of the gather: one scatter-add at the
indices as given.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from xgather import _gather


def accumulation(dtype) -> np.dtype | None:
    """The dtype a gradient of ``dtype`` data sums in, where it is not ``dtype`` itself."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return None


def tangent(gather, t_data, grad=None):
    """``gather(t_data)`` (linear in ``t_data``) as this module's derivative shapes it.

    ``grad``: ``None`` or LabVIEW's ``(training, coeff)``; the gather runs in
    ``accumulation``'s dtype where there is one, then rounds to ``t_data``'s.
    """
    training, coeff = (True, 1.0) if grad is None else grad
    acc = accumulation(t_data.dtype)
    out = gather(t_data if acc is None else t_data.astype(acc))
    if not training:
        return jnp.zeros(out.shape, t_data.dtype)
    if coeff != 1.0:
        out = out * jnp.asarray(coeff, out.dtype)
    return out.astype(t_data.dtype)


def gather(call, data, idx):
    """``call``'s gather (``xgather._gather.gather``), with this module's derivative where
    it applies: LabVIEW's ``grad`` given, or data that ``accumulation`` widens."""
    if call.grad is None and accumulation(data.dtype) is None:
        return _gather.gather(call, data, idx)
    return _custom(call, data, idx)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _custom(call, data, idx):
    return _gather.gather(call, data, idx)


def _custom_jvp(call, primals, tangents):
    data, idx = primals
    t_data, _ = tangents  # symbolic zeros: the indices' float0 tangent is never made
    out = _custom(call, data, idx)
    if isinstance(t_data, jax.custom_derivatives.SymbolicZero):
        t_data = jnp.zeros(t_data.shape, t_data.dtype)
    # Linear in t_data (filled slots have tangent 0), so JAX can transpose it for
    # reverse mode.
    linear = call._replace(fill_value=0)
    return out, tangent(lambda t: _gather.gather(linear, t, idx), t_data, call.grad)


_custom.defjvp(_custom_jvp, symbolic_zeros=True)
