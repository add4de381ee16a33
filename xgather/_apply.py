"""Plan + arrays -> result: the one place that calls ``lax.gather``."""

from __future__ import annotations

import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from xgather import _dtypes, _grad, _jaxprivate, _modes, _plan
from xgather._errors import OutOfBoundsError, UncheckedWarning, XGatherTypeError, fail
from xgather._plan import Plan


def prepare(plan: Plan, mode: str, indices, flag: bool = False, use=None,
            speculate: bool | None = None):
    """``use`` (the gather; identity if None) of the indices made ready, and the flag.

    Returns ``(bad, use(indices))``: negative indices wrapped where the spec says
    so (for larger gathers in a branch of their own, skipped when no index is
    negative: see :func:`xgather._modes.flag_and_wrap`), 64-bit indices narrowed
    on XLA:CPU; ``bad`` (None without ``flag``) is true where some index lies
    outside the spec's range. ``"error"`` emits the checkify check on ``bad``
    (``flag`` is then implied). ``speculate`` (by default: whether checks are
    traced in the ``"speculate"`` style) flags every index outside ``[0, s-1]``
    instead and skips the wrap, for a caller that reruns exactly when the flag
    is set.
    """
    indices = _modes.widen(plan, indices)
    error = mode == "error"
    use = use or (lambda i: i)
    if speculate is None:
        speculate = _modes.current_style() == "speculate"
    bad, out = _modes.flag_and_wrap(plan, indices, flag or error,
                                    lambda i: use(_modes.narrow(plan, i)), speculate)
    if error:
        _modes.check(plan, indices, bad)
    return bad, out


class Hints(NamedTuple):
    """How XLA may lower a gather, none of it changing the values: promises about the
    wrapped positions, and where the result lives (``out_sharding``: a
    ``NamedSharding``, or a ``PartitionSpec`` of the mesh in context)."""

    indices_are_sorted: bool = False
    unique_indices: bool = False
    out_sharding: Any = None


NO_HINTS = Hints()


def gather_prepared(plan: Plan, mode: str, fill_value, hints: Hints, data, idx):
    """``lax.gather`` on wrapped indices: the one call site, vmapped over batch dims, and
    placed as ``hints.out_sharding`` says."""
    if hints.out_sharding is None:
        return _gather_prepared(plan, mode, fill_value, hints, data, idx)
    return placed(functools.partial(_gather_prepared, plan, mode, fill_value, hints),
                  hints.out_sharding)(data, idx)


def placed(fn, out_sharding):
    """``fn`` with its result placed as ``out_sharding``.

    On a mesh with Explicit axes, ``fn`` runs with those axes made Auto
    (``jax.sharding.auto_axes``), so that XLA's partitioner chooses how the gather
    reads its inputs, and the result is resharded as asked; this is what
    ``jnp.ndarray.at[...].get(out_sharding=)`` does. On Auto axes the result is
    constrained to it.
    """
    mesh = mesh_of(out_sharding)
    if mesh.explicit_axes:
        return jax.sharding.auto_axes(fn, out_sharding=out_sharding, axes=mesh.explicit_axes)
    return lambda *args: lax.with_sharding_constraint(fn(*args), out_sharding)


def mesh_of(out_sharding):
    """The (abstract) mesh of ``out_sharding``: a ``NamedSharding``'s own, else the one in
    context (``jax.set_mesh``; empty where none is)."""
    if isinstance(out_sharding, jax.sharding.NamedSharding):
        return out_sharding.mesh.abstract_mesh
    return jax.sharding.get_abstract_mesh()


def _gather_prepared(plan: Plan, mode: str, fill_value, hints: Hints, data, idx):
    indices_are_sorted, unique_indices = hints.indices_are_sorted, hints.unique_indices
    fill = 0 if fill_value is None else fill_value
    if plan.data_crop is not None:
        data = lax.slice(data, (0,) * data.ndim, plan.data_crop)
    if 0 in plan.bounds:
        # No position exists on an empty axis: every index is out of range.
        no_clamp_into_nothing(plan, mode, idx)
        # full_like keeps data's weak type, as the gather does
        return lax.full_like(data, fill, shape=plan.gather_shape).reshape(plan.out_shape)
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
    try:
        return core(data, start).reshape(plan.out_shape)
    except ValueError as e:  # vmap over batch dims that an Explicit mesh shards apart
        if "should be sharded the same" not in str(e):
            raise
        fail(plan.op, "on a mesh's Explicit axes, the batch dims of data and indices must be "
             "sharded alike (or give out_sharding=, or make the mesh with AxisType.Auto axes)",
             f"data {_spec(data)}, indices {_spec(idx)} with batch_dims={plan.batch_dims}",
             {"data": plan.data_shape, "indices": plan.indices_shape}, kind=XGatherTypeError)
    except _jaxprivate.SHARDING_TYPE_ERROR:  # a result sharding JAX cannot infer
        fail(plan.op, "inputs sharded over a mesh's Explicit axes (jax.make_mesh's default): "
             "there JAX asks a gather from sharded indices, or along a sharded data axis, for "
             "the sharding of its result. Give it as out_sharding= (a NamedSharding, or a "
             "PartitionSpec under jax.set_mesh), make the mesh with axis_types=(AxisType.Auto, "
             "...), reshard the inputs (jax.sharding.reshard), or use xgather.sharded.gather "
             "for a table sharded by rows",
             f"data {_spec(data)}, indices {_spec(idx)}",
             {"data": plan.data_shape, "indices": plan.indices_shape}, kind=XGatherTypeError)


def no_clamp_into_nothing(plan: Plan, mode: str, indices) -> None:
    """``"clip"`` has no position to clamp to where an indexed axis has size 0."""
    if mode == "clip" and 0 in plan.bounds and np.size(indices):
        fail(plan.op, 'mode="clip" cannot clamp into an axis of size 0',
             f"index axes {plan.index_axes}",
             {"data": plan.data_shape, "indices": plan.indices_shape})


def _spec(x) -> str:
    try:
        return str(jax.typeof(x).sharding.spec)
    except AttributeError:  # pragma: no cover - other JAX versions
        return "sharded"


def gather_core(plan: Plan, mode: str, fill_value, data, indices, hints: Hints = NO_HINTS,
                grad=None, flag: bool = False, speculate: bool | None = None):
    """The traced body of every op: prepare the indices, then gather.

    ``grad`` is ``None`` (the derivative of ``lax.gather``, summed in float32 for
    16-bit floats) or a ``(training, coeff)`` pair that reshapes it (see
    :mod:`xgather._grad`).
    With ``flag``, returns ``(bad, out)`` (see :func:`prepare`, also for ``speculate``).
    """
    def gather(idx):
        return _grad.gather(gather_prepared, plan, mode, fill_value, hints, grad, data, idx)

    bad, out = prepare(plan, mode, indices, flag, gather, speculate)
    return (bad, out) if flag else out


@functools.lru_cache(maxsize=2048)
def compiled(plan: Plan, mode: str, fill_value, hints: Hints, grad=None):
    """One jitted function per (plan, mode, fill, hints, grad): same shapes never retrace."""
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, mode, fill_value, data, indices, hints, grad)
    return jax.jit(body)


@functools.lru_cache(maxsize=2048)
def flagged(plan: Plan, fill_value, hints: Hints, grad=None, speculate=False):
    """``"error"`` on concrete device indices: one jitted function returning ``(bad, out)``.

    ``bad`` is true if some index lies outside the spec's range (with
    ``speculate``: outside ``[0, s-1]``, and ``out`` is then valid only while
    ``bad`` is clear); ``out`` is the gather (XLA keeps stray reads in bounds).
    The caller reads ``bad`` and reports the first bad index from the
    indices themselves, so the program carries no report.
    """
    def body(data, indices):
        with jax.named_scope(plan.op):
            return gather_core(plan, "promise_in_bounds", fill_value, data, indices, hints, grad,
                               flag=True, speculate=speculate)
    return jax.jit(body)


def clear_caches() -> None:
    """Forget every plan, jitted function and eager call path xgather has cached.

    Needed after tracing under patched JAX functions (an exporter's), so that
    later calls trace afresh.
    """
    for cached in (compiled, flagged, _plan._take_plan, _plan._nd_plan, _plan._elements_plan):
        cached.cache_clear()
    from xgather import _frontend
    _frontend.RUNNERS.clear()


def throw(err) -> None:
    """Raise a checkify error: xgather's bound report as :class:`OutOfBoundsError` with its
    message, any other failed check (a user's own ``checkify.check``) as checkify raises it."""
    msg = err.get()
    if msg:
        msg = msg.split(" (`check` failed)")[0]
        if not msg.endswith(_modes.REPORT_END):
            err.throw()
        raise OutOfBoundsError(msg)


def run(plan: Plan, data, indices, mode: str, fill_value=None, *,
        indices_are_sorted: bool = False, unique_indices: bool = False, grad=None,
        out_sharding=None):
    """Run ``plan`` on ``data`` and ``indices`` in ``mode``; ``fill_value`` a Python scalar
    (as :func:`xgather._dtypes.fill_scalar` gives it: it keys the jit cache) or None.

    With ``"error"``, concrete indices are checked at once (see
    :func:`concrete_runner`); traced indices get a checkify check, and tracing
    stops with a clear error where nothing will functionalise that check.
    """
    hints = Hints(bool(indices_are_sorted), bool(unique_indices), out_sharding)
    if _dtypes.needs_host(data):
        if _dtypes.is_traced(indices):
            _no_host_path(plan, data, "under a JAX transformation")
        try:
            return _dtypes.host_gather(
                plan.op, data,
                lambda iota, fill: run(plan, iota, indices, mode, fill, indices_are_sorted=False,
                                       unique_indices=False),
                fill_value if mode == "fill" else None)
        except jax.errors.TracerArrayConversionError:  # constant indices inside jax.jit
            _no_host_path(plan, data, "inside jax.jit")
    data = _dtypes.check_data(plan.op, data,
                              {"data": plan.data_shape, "indices": plan.indices_shape})
    if not _dtypes.is_traced(data, indices):
        return concrete_runner(plan, mode, fill_value, hints, grad, indices)(data, indices)
    mode = check_now_or_later(plan, mode, indices)
    gather = compiled(plan, mode, fill_value, hints, grad)
    if mode == "error" and _modes.under_derivative():
        if _modes.in_loop_body() and _modes.under_derivative(reverse=True):
            warnings.warn(UncheckedWarning(
                f"{plan.op}: its mode=\"error\" check is traced in a lax.scan/map/fori_loop/"
                "while_loop body under a derivative, where JAX drops checkify checks in reverse "
                "mode: an out-of-range index would go unreported. Check the indices outside the "
                "loop, or choose mode=\"clip\", \"fill\" or \"promise_in_bounds\""),
                stacklevel=_user_stacklevel())
        if _modes.current_style() == "speculate":
            with _modes.check_style("flag"):  # exact: its flag may be dropped (under_derivative)
                return gather(data, indices)
    return gather(data, indices)


def _no_host_path(plan: Plan, data, where: str) -> NoReturn:
    fail(plan.op, "string data, and 64-bit data while jax_enable_x64 is off, take the host "
         f"path, which cannot run {where}", str(data.dtype),
         {"data": plan.data_shape, "indices": plan.indices_shape}, kind=XGatherTypeError)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside xgather and JAX (for warnings)."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
            "xgather", "jax"):
        frame, level = frame.f_back, level + 1
    return level


def concrete_runner(plan: Plan, mode: str, fill_value, hints, grad, indices):
    """``(data, indices) -> result`` for concrete arrays of these shapes and kinds.

    Everything that depends only on the signature is settled here, once, so
    that a call does no more than its own work; the frontends cache the result
    per signature. Under ``"error"``, NumPy indices are checked on the host
    while the program runs, and device indices inside the program, which
    returns a flag beside the result (pulling small device indices to the host
    measured no faster on XLA:CPU: the read waits for the program). That
    program speculates (:func:`flagged`): where the wrap would take a branch of
    its own, its flag is set by any index outside ``[0, s-1]``. When it is,
    the host check reports a bad index, and in-range negative indices are
    gathered again by the exact program, which this signature then keeps.
    Either way a bad index is reported from the indices themselves
    (:func:`xgather._modes.host_check`).
    """
    if mode != "error":
        return compiled(plan, mode, fill_value, hints, grad)
    if isinstance(indices, np.ndarray):
        gather = compiled(plan, "promise_in_bounds", fill_value, hints, grad)
        check = _modes.host_checker(plan)

        def host_checked(data, indices):
            # Dispatched first, so that the check runs while the program does (a bad
            # index still raises before the result is returned: XLA keeps stray reads
            # in bounds meanwhile).
            out = gather(data, indices)
            check(indices)
            return out
        return host_checked
    exact = flagged(plan, fill_value, hints, grad)
    gather = flagged(plan, fill_value, hints, grad, speculate=True)

    def device_checked(data, indices):
        nonlocal gather
        bad, out = gather(data, indices)
        try:  # flag_set, inlined
            if not memoryview(bad)[()]:
                return out
        except (BufferError, TypeError):
            if not copied_flag_set(bad):
                return out
        _modes.host_check(plan, indices)
        if gather is exact:
            raise AssertionError(f"{plan.op}: the device flagged an index the host check "
                                 "passed")
        gather = exact  # in-range negative indices: wrap them from now on
        return device_checked(data, indices)
    return device_checked


def flag_set(flag) -> bool:
    """The flag a checked program returned, read on the host (it waits for the program).

    A single-device CPU array is read through the buffer protocol, a few
    microseconds sooner than ``np.asarray``; other arrays (GPU, sharded) are
    copied over (:func:`copied_flag_set`). The per-call paths of
    :func:`checked` and :func:`concrete_runner` inline the first case, which
    saves a call and measured about 0.8 us of W8's 32 (issue 12).
    """
    try:
        return bool(memoryview(flag)[()])
    except (BufferError, TypeError):
        return copied_flag_set(flag)


def copied_flag_set(flag) -> bool:
    """:func:`flag_set` where the flag has no single CPU buffer: a GPU or sharded array
    is copied to the host; a checkify ``Error`` (where :func:`_any_error` found no
    flag field) is set when it holds a message."""
    if isinstance(flag, checkify.Error):
        return flag.get() is not None
    return bool(np.asarray(flag))


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


def _any_error(err):
    """True where a checkify ``Error`` holds a failed check (one scalar), or None."""
    preds = _jaxprivate.error_predicates(err)
    if preds is None:  # a checkify without the field: report the whole error instead
        _jaxprivate.fallback("Error._pred", "xgather.checked runs every call with the report")
        return None
    flag = jnp.zeros((), bool)
    for p in preds:
        flag = flag | jnp.any(p)
    return flag


def checked(fn, *, static_argnums=(), static_argnames=()):
    """``fn`` with xgather's bound checks functionalised, compiled once per input shape.

    Returns a jitted function that runs ``fn`` under ``checkify.checkify`` and
    raises :class:`~xgather.OutOfBoundsError` if an index was out of range.
    ``fn`` may be jitted already (``xgather.checked(jax.jit(f))``) or contain
    ``jax.grad``/``jax.vmap``; non-array arguments go in ``static_argnums`` /
    ``static_argnames`` as for ``jax.jit``. Use it as the outermost wrapper: it
    reads the error flag on the host after each call.

    Each call runs a program that returns only the result and one flag. It is
    traced without the report (the first bad index, its position, the count)
    and, where an op's wrap would take a branch of its own, speculates: the
    flag is set by any index outside ``[0, s-1]``, so the program needs no
    negative wrap and no branch, and its result counts only while the flag is
    clear. When the flag is set, the exact program (the wrap,
    the flag of the spec's range, still no report; compiled on first use)
    runs: if its flag is clear (in-range negative indices), its result is
    returned, and it is the fast program from then on. If it is set, ``fn``
    runs again with the full report, which the error shows (see
    :func:`xgather._modes.check_style`).
    """
    if not callable(fn):
        fail("xgather.checked", "fn must be a callable (a function of arrays)",
             type(fn).__name__, kind=XGatherTypeError)
    jit_kw = dict(static_argnums=static_argnums, static_argnames=static_argnames)
    checkified = checkify.checkify(fn, errors=checkify.user_checks)
    full_jit = jax.jit(checkified, **jit_kw)

    def full(*args, **kwargs):
        with _modes.check_style("full"):
            return full_jit(*args, **kwargs)

    def traced(style):
        def flag_and_out(*args, **kwargs):
            with _modes.check_style(style):
                err, out = checkified(*args, **kwargs)
            flag = _any_error(err)
            return (err if flag is None else flag), out
        return jax.jit(flag_and_out, **jit_kw)

    exact = traced("flag")
    fast = traced("speculate")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal fast
        flag, out = fast(*args, **kwargs)
        try:  # flag_set, inlined: every call's path
            if not memoryview(flag)[()]:
                return out
        except (BufferError, TypeError):
            if not copied_flag_set(flag):
                return out
        if fast is not exact:
            flag, out = exact(*args, **kwargs)
            if not flag_set(flag):  # in-range negative indices: the exact program from now on
                fast = exact
                return out
        throw(full(*args, **kwargs)[0])
        raise AssertionError(f"{getattr(fn, '__name__', fn)!r}: a check failed on the device "
                             "and passed in the report")

    return wrapper


_Op = TypeVar("_Op", bound=Callable[..., Any])


def planned(planner: Callable[..., Plan]) -> Callable[[_Op], _Op]:
    """Attach ``planner`` (same arguments as the op, no arrays needed) to a frontend op,
    and cache the op's eager calls per signature. The op keeps its signature."""
    def attach(op: _Op) -> _Op:
        from xgather._frontend import cached
        wrapper = cached(op)
        wrapper.__xgather_plan__ = planner
        return cast(_Op, wrapper)
    return attach


def explain(op, *args, **kwargs) -> Plan:
    """The plan ``op(*args, **kwargs)`` would run, without running it.

    Arrays may be replaced by anything with ``.shape`` and ``.dtype`` (e.g.
    ``jax.ShapeDtypeStruct``). ``print(xgather.explain(...))`` shows the
    normalised attributes, the lowering taken, the ``lax.GatherDimensionNumbers``
    and the slice sizes.

    >>> import numpy as np, xgather
    >>> p = xgather.explain(xgather.onnx.gather, np.zeros((3, 4)), np.zeros(5, np.int64), axis=1)
    >>> p.out_shape, p.index_axes, p.bounds
    ((3, 5), (1,), (4,))
    """
    planner = getattr(op, "__xgather_plan__", None)
    if planner is None:
        raise XGatherTypeError(f"xgather.explain: {getattr(op, '__name__', op)!r} is not an "
                               "xgather op")
    try:  # the arguments the op itself would take, no more (the planner ignores call options)
        inspect.signature(op).bind(*args, **kwargs)
    except TypeError as e:
        raise XGatherTypeError(f"xgather.explain: {getattr(op, '__name__', op)}: {e}") from None
    if kwargs.get("mode") is not None:
        _modes.choice(f"xgather.explain({getattr(op, '__name__', op)})", "mode", kwargs["mode"],
                      _modes.MODES)
    return planner(*args, **kwargs)
