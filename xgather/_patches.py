"""Whether another library has patched the JAX functions xgather traces with.

An exporter replaces JAX's functions while it traces (jax2onnx's ``to_onnx`` swaps
``jax.numpy.where`` and others for its own), and a trace made then holds primitives that
nothing else can lower: it must not be cached, and an op whose mode would be lost there
(``"error"``, ``"clip"``, ``"fill"``) says how to export it (``EXPORT_ADVICE``). Only the
functions xgather calls are watched: a patch another library leaves behind elsewhere
(jax2onnx 0.17.1 leaves ``jax.numpy.cumsum`` replaced after an export) changes none of
xgather's traces.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
from jax import lax

#: The functions of ``jax``, ``jax.numpy`` and ``jax.lax`` that xgather's code calls
#: (a test keeps this list complete).
WATCHED = {
    jax: ("clear_caches", "default_backend", "device_put", "devices", "grad", "jit",
          "named_scope", "shard_map", "typeof", "vmap"),
    jnp: ("all", "any", "array", "asarray", "broadcast_to", "clip", "concatenate", "full",
          "imag", "issubdtype", "logical_not", "max", "maximum", "minimum", "moveaxis", "ones",
          "pad", "real", "stack", "where", "zeros"),
    lax: ("add", "all_gather", "axis_index", "bitcast_convert_type", "bitwise_and",
          "bitwise_not", "broadcast", "broadcast_in_dim", "broadcasted_iota", "clamp",
          "complex", "concatenate", "cond", "convert_element_type", "dynamic_index_in_dim",
          "dynamic_slice", "full", "full_like", "gather", "ge", "gt", "iota", "lt", "min",
          "neg", "psum", "psum_scatter", "reduce", "reshape", "select", "slice",
          "slice_in_dim", "with_sharding_constraint"),
}

#: What an op traced under an exporter's patches, without xgather's plugin, tells the user.
EXPORT_ADVICE = ("to export xgather's ops to ONNX with jax2onnx, call "
                 "xgather.export.register_jax2onnx() before jax2onnx.to_onnx (or use "
                 "xgather.export.to_onnx)")

# The module dicts (no deprecated name is touched) and the functions as xgather found them.
_ORIGINALS = tuple((vars(module), names, tuple(vars(module).get(n) for n in names))
                   for module, names in WATCHED.items())


def foreign() -> bool:
    """Whether a function xgather traces with differs from the one it found at import."""
    return any(any(map(operator.is_not, map(now.get, names), then))
               for now, names, then in _ORIGINALS)
