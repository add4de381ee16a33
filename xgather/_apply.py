"""Plan + arrays -> result: the one place that calls ``lax.gather``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from xgather import _dtypes, _grad, _modes
from xgather._errors import OutOfBoundsError, fail
from xgather._plan import Plan


def prepare(plan: Plan, mode: str, indices):
    """Bound check (``"error"``), negative wrap and 64-bit narrowing, on the whole ``indices``."""
    indices = _modes.widen(indices)
    if mode == "error":
        _modes.check(plan, indices)
    return _modes.narrow(plan, _modes.wrap(plan, indices))


def gather_prepared(plan: Plan, mode: str, fill_value, hints, data, idx):
    """``lax.gather`` on wrapped indices: the one call site, vmapped over batch dims."""
    indices_are_sorted, unique_indices = hints
    fill = 0 if fill_value is None else fill_value
    if plan.data_crop is not None:
        data = lax.slice(data, (0,) * data.ndim, plan.data_crop)
    if 0 in plan.bounds:
        # No position exists on an empty axis: every index is out of range.
        if mode == "clip" and idx.size:
            fail(plan.op, 'mode="clip" cannot clamp into an axis of size 0',
                 f"index axes {plan.index_axes}",
                 {"data": plan.data_shape, "indices": plan.indices_shape})
        return jnp.full(plan.gather_shape, fill, data.dtype).reshape(plan.out_shape)
    start = idx if plan.index_vector else idx[..., None]
    if mode == "clip":
        unique_indices = False  # clamping can map distinct indices to one position

    def core(d, i):
        if plan.index_broadcast:
            lead = plan.index_broadcast
            i = jnp.broadcast_to(i[(None,) * len(lead)], lead + i.shape)
        return lax.gather(d, i, plan.dimension_numbers, plan.slice_sizes,
                          mode=_modes.lax_mode(mode),
                          fill_value=fill if mode == "fill" else None,
                          indices_are_sorted=indices_are_sorted, unique_indices=unique_indices)

    if plan.lowering.startswith("vmap"):
        for _ in range(plan.batch_dims):
            core = jax.vmap(core)
    return core(data, start).reshape(plan.out_shape)


def gather_core(plan: Plan, mode: str, fill_value, data, indices, hints=(False, False),
                grad=None):
    """The traced body of every op: prepare the indices, then gather.

    ``grad`` is ``None`` (JAX's own derivative of ``lax.gather``) or a
    ``(training, coeff)`` pair that reshapes the derivative (see :mod:`xgather._grad`).
    """
    idx = prepare(plan, mode, indices)
    if grad is None:
        return gather_prepared(plan, mode, fill_value, hints, data, idx)
    return _grad.scaled_gather(gather_prepared, plan, mode, fill_value, hints, grad, data, idx)


@functools.lru_cache(maxsize=2048)
def compiled(plan: Plan, mode: str, fill_value, hints: tuple[bool, bool], grad=None):
    """One jitted function per (plan, mode, fill, hints, grad): same shapes never retrace."""
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, mode, fill_value, data, indices, hints, grad)
    return jax.jit(body)


def throw(err) -> None:
    """Raise a checkify error as :class:`OutOfBoundsError` with xgather's message."""
    msg = err.get()
    if msg:
        msg = msg.split(" (`check` failed)")[0]
        raise OutOfBoundsError(msg)


def _scalar(fill_value):
    if fill_value is None:
        return None
    if hasattr(fill_value, "item"):
        fill_value = fill_value.item()
    return fill_value


def run(plan: Plan, data, indices, mode: str, fill_value=None, *,
        indices_are_sorted: bool = False, unique_indices: bool = False, grad=None):
    """Run ``plan`` on ``data`` and ``indices`` in ``mode``.

    With ``"error"``, concrete indices are checked on the host at once (eager
    calls, and indices that are constants of a trace); traced indices get a
    checkify check, and tracing stops with a clear error where nothing will
    functionalise that check.
    """
    fill_value = _scalar(fill_value)
    hints = (bool(indices_are_sorted), bool(unique_indices))
    if _dtypes.needs_host(data):
        if _dtypes.is_traced(indices):
            fail(plan.op, "string data, and 64-bit data while jax_enable_x64 is off, "
                 "take the host path, which cannot run under a JAX transformation",
                 str(data.dtype), {"data": plan.data_shape, "indices": plan.indices_shape},
                 kind=TypeError)
        return _dtypes.host_gather(
            plan.op, data,
            lambda iota, fill: run(plan, iota, indices, mode, fill, indices_are_sorted=False,
                                   unique_indices=False),
            fill_value if mode == "fill" else None)
    data = _dtypes.check_data(plan.op, data,
                              {"data": plan.data_shape, "indices": plan.indices_shape})
    mode = check_now_or_later(plan, mode, indices)
    return compiled(plan, mode, fill_value, hints, grad)(data, indices)


def check_now_or_later(plan: Plan, mode: str, indices) -> str:
    """The mode to trace with, once ``"error"`` has been dealt with.

    Concrete indices (eager calls, constants under jit or grad) are checked on
    the host now, and the gather then runs as ``"promise_in_bounds"`` (the same
    gather, checked already). Traced indices keep ``"error"`` (a checkify check),
    and tracing stops with a clear error where nothing will functionalise it.
    """
    if mode == "error":
        if not _dtypes.is_traced(indices):
            _modes.host_check(plan, indices)
            return "promise_in_bounds"
        if not _modes.checks_functionalised():
            _modes.not_functionalised(plan.op)
    return mode


def checked(fn, *, static_argnums=(), static_argnames=()):
    """``fn`` with xgather's bound checks functionalised, compiled once per input shape.

    Returns a jitted function that runs ``fn`` under ``checkify.checkify`` and
    raises :class:`~xgather.OutOfBoundsError` if an index was out of range.
    ``fn`` may be jitted already (``xgather.checked(jax.jit(f))``) or contain
    ``jax.grad``/``jax.vmap``; non-array arguments go in ``static_argnums`` /
    ``static_argnames`` as for ``jax.jit``. Use it as the outermost wrapper: it
    reads the error flag on the host after each call.
    """
    cfn = jax.jit(checkify.checkify(fn, errors=checkify.user_checks),
                  static_argnums=static_argnums, static_argnames=static_argnames)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        err, out = cfn(*args, **kwargs)
        throw(err)
        return out

    return wrapper


def planned(planner):
    """Attach ``planner`` (same arguments as the op, no arrays needed) to a frontend op."""
    def attach(op):
        op.__xgather_plan__ = planner
        return op
    return attach


def explain(op, *args, **kwargs) -> Plan:
    """The plan ``op(*args, **kwargs)`` would run, without running it.

    Arrays may be replaced by anything with ``.shape`` and ``.dtype`` (e.g.
    ``jax.ShapeDtypeStruct``). ``print(xgather.explain(...))`` shows the
    normalised attributes, the lowering taken, the ``lax.GatherDimensionNumbers``
    and the slice sizes.

    >>> import numpy as np, xgather
    >>> p = xgather.explain(xgather.onnx.gather, np.zeros((3, 4)), np.zeros(5, np.int64), axis=1)
    >>> p.out_shape, p.dimension_numbers.offset_dims
    ((3, 5), (0,))
    """
    planner = getattr(op, "__xgather_plan__", None)
    if planner is None:
        raise TypeError(f"xgather.explain: {getattr(op, '__name__', op)!r} is not an xgather op")
    return planner(*args, **kwargs)
