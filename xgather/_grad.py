"""Gradients that a spec reshapes: LabVIEW's ``lda coeff`` and ``training?``.

Every other op differentiates through ``lax.gather`` itself, whose transpose is
a scatter-add in the same out-of-bounds mode. Here the derivative is defined
with ``jax.custom_jvp`` (so forward mode, reverse mode and ``jax.hessian`` all
work): the tangent of the output is ``coeff * gather(tangent of data)``, and
JAX transposes that into ``coeff * scatter_add(cotangent)``. With
``training=False`` the tangent is zero, so no gradient reaches ``data``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def scaled_gather(gather_prepared, plan, mode, fill_value, hints, grad, data, idx):
    """``gather_prepared(plan, ...)(data, idx)`` whose derivative ``grad`` reshapes."""
    return gather_prepared(plan, mode, fill_value, hints, data, idx)


@scaled_gather.defjvp
def _scaled_gather_jvp(gather_prepared, plan, mode, fill_value, hints, grad, primals, tangents):
    data, idx = primals
    t_data, _ = tangents
    out = scaled_gather(gather_prepared, plan, mode, fill_value, hints, grad, data, idx)
    training, coeff = grad
    if not training:
        return out, jnp.zeros_like(out)
    # The tangent is linear in t_data (filled slots have tangent 0), so JAX can
    # transpose it for reverse mode.
    tangent = gather_prepared(plan, mode, 0, hints, t_data, idx)
    return out, tangent * jnp.asarray(coeff, tangent.dtype)
