"""How a spec frontend declares an op (``op``), what every call of one
does before it runs, and the per-signature cache of eager calls.

A frontend declares each op once: its signature and docstring, the planner that
turns its arguments into a plan, and the index dtypes it takes. The decorator owns
the rest: the cache lookup, the plan, the options resolved and the run.

An eager call (concrete arrays in, no transformation) is resolved once per
signature: the op's name, the shapes, dtypes and kinds (JAX or NumPy) of
``data`` and ``indices``, every other argument, the process-wide default
mode and the x64 flag. The first call runs as usual and leaves behind a runner
(``xgather._apply.eager_runner``); later calls with the same signature go straight
to it: one dict lookup, then the jitted program, with the same checks and errors.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, cast

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from xgather import (
    _apply,
    _check,
    _dtypes,
    _gather,
    _jaxprivate,
    _lower,
    _modes,
    _patches,
    _plan,
    _report,
)
from xgather._errors import XGatherTypeError, fail
from xgather._gather import Call
from xgather._plan import Plan

#: Signature -> runner, filled by the ops' first eager calls;
#: [`clear_caches`][xgather.clear_caches] empties it.
RUNNERS: dict = {}
#: At this many signatures the cache starts afresh (as ``xgather._apply.program``'s holds 2048
#: programs).
RUNNERS_MAX = 2048


_JAX_ARRAY = _jaxprivate.ARRAY_IMPL  # without it, eager calls are not cached (still exact)


_INEXACT = (float, complex, np.inexact)


def signature(op, args: tuple, kwargs: dict):
    """The cache key of an eager call, or None where its arrays are not concrete (tracers,
    lists, subclasses). A key holding an unhashable attribute (an array as ``axis``) is no
    key either: the op finds that out when it looks the key up.

    A JAX array enters as its aval (shape, dtype, weak type: one attribute, hashed
    once), a NumPy array as its shape and dtype; written out inline, since every
    eager call pays for it.
    """
    if len(args) < 2:
        return None
    data, indices = args[0], args[1]
    kind = type(data)
    spec_data = (data.aval if kind is _JAX_ARRAY else
                 (data.shape, data.dtype) if kind is np.ndarray else None)
    kind = type(indices)
    spec_indices = (indices.aval if kind is _JAX_ARRAY else
                    (indices.shape, indices.dtype) if kind is np.ndarray else None)
    if spec_data is None or spec_indices is None:
        return None
    # The attributes' types too: 1, 1.0 and True are equal keys but not equal arguments.
    attrs = args[2:]
    types = tuple(map(type, attrs)) if attrs else ()
    if kwargs:
        if "fill_value" in kwargs or "out_sharding" in kwargs:  # (an `in` costs less)
            fill = kwargs.get("fill_value")
            if isinstance(fill, _INEXACT) and _dtypes.signed_zero_or_nan(fill):
                # -0.0 == 0.0 as a key (the uncached path fills the sign given); NaN != NaN,
                # so each call would add a key of its own
                return None
            if isinstance(kwargs.get("out_sharding"), PartitionSpec):
                return None  # its mesh is the context's, which the key does not hold
        return (op, spec_data, spec_indices, attrs, tuple(kwargs.items()), types,
                tuple(map(type, kwargs.values())), _modes.current_default(), _dtypes.x64(),
                _lower.override())
    return (op, spec_data, spec_indices, attrs, types, _modes.current_default(),
            _dtypes.x64(), _lower.override())


def _plain(x) -> bool:
    """A JAX array, or a NumPy array in native byte order: an input taken as it is."""
    kind = type(x)
    return kind is _JAX_ARRAY or (kind is np.ndarray and x.dtype.isnative)


def _inputs(where: str, args: tuple, kwargs: dict):
    """``args`` and ``kwargs`` with ``data`` and ``indices`` made inputs the ops read
    exactly (``xgather._dtypes.foreign_input``): torch tensors, other byte orders,
    and clear errors for masked arrays and lists of objects."""
    args = tuple(_dtypes.foreign_input(where, name, x) if not _plain(x) else x
                 for name, x in zip(("data", "indices"), args[:2], strict=False)) + args[2:]
    for name in ("data", "input", "indices"):
        if name in kwargs and not _plain(kwargs[name]):
            kwargs = {**kwargs, name: _dtypes.foreign_input(where, name, kwargs[name])}
    return args, kwargs


def _name(op) -> str:
    """``xgather.onnx.gather``: an op as users call it."""
    return f"{op.__module__.removesuffix('._ops')}.{op.__name__}"


def versioned(spec: str, name: str, version, supported: tuple[int, ...], what: str) -> str:
    """``"onnx.Gather-13"``, or an error that lists the supported versions."""
    if isinstance(version, bool) or not isinstance(version, int | np.integer) or \
            version not in supported:
        fail(f"{spec}.{name}", f"{what} must be one of {', '.join(map(str, supported))}",
             f"{what}={version!r}")
    return f"{spec}.{name}-{version}"


#: What a frontend takes as an array besides objects with ``.shape`` and ``.dtype``.
_ARRAY_LIKE = (list, tuple, int, float, complex, np.generic)


def check_array(op: str, name: str, x) -> None:
    """``x`` is an array, or a (nested) list or scalar that NumPy makes one of, else an error.

    ``None``, strings and other objects are not arrays: without this check they
    would read as rank-0 arrays and fail later with a misleading rank error.
    """
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            fail(op, f"{name} is an array of typed PRNG keys, which no gather spec defines; "
                 f"gather their raw bits (jax.random.key_data({name}) along the same axes, "
                 "then jax.random.wrap_key_data)", str(x.dtype), kind=XGatherTypeError)
        return
    if isinstance(x, _ARRAY_LIKE):
        return
    fail(op, f"{name} must be an array (or a nested list or scalar of numbers)",
         _type_name(x))


def _type_name(x) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}".removeprefix("builtins.")


#: What a call takes as values (beside objects with ``__array__``, ``__dlpack__`` or
#: ``__jax_array__``): arrays, tracers, lists and scalars.
_VALUES = (jax.Array, jax.core.Tracer, np.ndarray) + _ARRAY_LIKE


def check_values(op: str, name: str, x, sh) -> None:
    """``x`` holds values: an object with ``.shape`` and ``.dtype`` alone (such as
    ``jax.ShapeDtypeStruct``, which ``explain`` takes) is no input to a call."""
    if isinstance(x, _VALUES) or any(hasattr(x, a) for a in
                                     ("__array__", "__dlpack__", "__jax_array__")):
        return
    fail(op, f"{name} is not an array: it has .shape and .dtype but no values (no "
         "__array__, __dlpack__ or __jax_array__); xgather.explain takes such objects, a "
         "call needs arrays", _type_name(x), sh, kind=XGatherTypeError)


def shapes(data, indices, op: str | None = None) -> dict[str, tuple[int, ...]]:
    """The shapes an error message shows; with ``op``, both inputs are checked to be arrays."""
    if op is not None:
        check_array(op, "data", data)
        check_array(op, "indices", indices)
    where = op or "xgather"
    return {"data": _dtypes.shape_of(data, where, "data"),
            "indices": _dtypes.shape_of(indices, where, "indices")}


def check_addressable(plan) -> None:
    """With x64 off, indices are at most 32 bits: an axis of ``2**31`` or more is out of reach."""
    if not _dtypes.x64() and max(plan.bounds, default=0) > np.iinfo(np.int32).max:
        fail(plan.op, "with jax_enable_x64 off, indices are int32 and cannot address an axis of "
             "2**31 or more elements (enable it with jax.config.update('jax_enable_x64', True))",
             f"axis sizes {plan.bounds} for data axes {plan.index_axes}", plan.shapes)


def int_attr(op: str, name: str, value, sh=None) -> int:
    """An integer attribute (a Python int or NumPy integer scalar, not a bool), as an int."""
    number = _dtypes.as_int(value)
    if number is None:
        fail(op, f"{name} must be an int", repr(value), sh)
    return number


def bool_option(op: str, name: str, value, sh=None, note: str = "") -> bool:
    """A boolean option (``negative_indices``, the promises to XLA, LabVIEW's ``training``):
    a bool or NumPy bool, no truthy guesses."""
    if not isinstance(value, bool | np.bool_):
        fail(op, f"{name} must be a bool{note}", repr(value), sh)
    return bool(value)


def data_dtype(data) -> np.dtype:
    """``data``'s dtype; for lists and scalars, the one JAX gives them (float32 without x64)."""
    if hasattr(data, "dtype"):
        return np.dtype(data.dtype)
    return np.dtype(jax.dtypes.canonicalize_dtype(np.asarray(data).dtype))


def mode_and_fill(plan, data, mode, fill_value, spec_default: str, sh=None):
    """``(mode, fill_value, spec_rule)`` of a call: the mode it runs in (``_modes.resolve``)
    and its ``fill_value`` checked against ``data``'s dtype. ``spec_rule``: ``mode=None``
    where the spec defines out-of-range results (OpenVINO Gather's zeros), whose
    ``fill_value`` is then None: checked, but not used outside ``"fill"``."""
    spec_rule = mode is None and spec_default != "error"
    mode = _modes.resolve(plan.op, mode, spec_default)
    fill_value = _dtypes.fill_scalar(plan.op, fill_value, data_dtype(data), sh)
    return mode, None if spec_rule else fill_value, spec_rule


def resolve_call(plan, data, indices, allowed, mode, fill_value, *, spec_default="error",
                 indices_are_sorted=False, unique_indices=False, grad=None, out_sharding=None):
    """What every call resolves before it runs: ``(call, indices, check)``.

    The axes addressable, the options checked, the mode resolved, ``fill_value``
    checked against ``data``'s dtype, and the indices converted
    (``xgather._dtypes.index_array``); ``check`` is the ``"error"`` mode's host check
    (None otherwise), which sees indices beyond int32 as given before they are
    saturated.
    """
    check_addressable(plan)
    sh = shapes(data, indices)
    check_values(plan.op, "data", data, sh)
    check_values(plan.op, "indices", indices, sh)
    mode, fill_value, _ = mode_and_fill(plan, data, mode, fill_value, spec_default, sh)
    check = functools.partial(_check.host_check, plan) if mode == "error" else None
    indices = _dtypes.index_array(plan.op, indices, allowed, sh, check)
    sorted_ = bool_option(plan.op, "indices_are_sorted", indices_are_sorted, sh)
    unique = bool_option(plan.op, "unique_indices", unique_indices, sh)
    check_out_sharding(plan, out_sharding, data, sh)
    return Call(plan, mode, fill_value, sorted_, unique, out_sharding, grad), indices, check


def _axes(entry) -> tuple:
    """The mesh axes a PartitionSpec entry splits a dim over (none for None, unconstrained)."""
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def check_out_sharding(plan, out_sharding, data, sh) -> None:
    """``out_sharding`` is None, a ``NamedSharding``, or a ``PartitionSpec`` with a mesh in
    context, of at most the output's rank, for a result on devices."""
    if out_sharding is None:
        return
    if not isinstance(out_sharding, PartitionSpec | NamedSharding):
        fail(plan.op, "out_sharding must be a jax.sharding.NamedSharding or PartitionSpec",
             _type_name(out_sharding), sh, kind=XGatherTypeError)
    mesh = _gather.mesh_of(out_sharding)
    if mesh.empty:  # a PartitionSpec outside jax.set_mesh
        fail(plan.op, "out_sharding as a PartitionSpec needs a mesh in context "
             "(with jax.set_mesh(mesh): ...); or give a NamedSharding", repr(out_sharding), sh)
    spec = out_sharding if isinstance(out_sharding, PartitionSpec) else out_sharding.spec
    if len(spec) > len(plan.out_shape):
        fail(plan.op, "out_sharding's spec has more entries than the result has dims",
             f"{spec} for a result of shape {plan.out_shape}", sh)
    names = [n for entry in spec for n in _axes(entry)]
    if len(set(names)) < len(names):
        fail(plan.op, "out_sharding names a mesh axis twice", str(spec), sh)
    unknown = [n for n in names if n not in mesh.axis_names]
    if unknown:
        fail(plan.op, "out_sharding names axes the mesh does not have",
             f"{spec} on a mesh with axes {tuple(mesh.axis_names)}", sh)
    for dim, entry in enumerate(spec):
        parts = math.prod(mesh.shape[n] for n in _axes(entry))
        if plan.out_shape[dim] % parts:
            fail(plan.op, "out_sharding must split each result dim into equal parts",
                 f"{spec}: dim {dim} of size {plan.out_shape[dim]} into {parts} parts, for a "
                 f"result of shape {plan.out_shape}", sh)
    if _dtypes.needs_host(data):
        fail(plan.op, "out_sharding places a result on devices; string data, and 64-bit data "
             "while jax_enable_x64 is off, are gathered on the host", str(data_dtype(data)), sh)


def _run_and_cache(key, call: Call, data, indices, given_indices, check):
    """Run ``call``; on the first eager call of a signature (``key``), cache its runner.
    ``given_indices``: the indices as the caller gave them, ``indices`` as converted."""
    plan = call.plan
    if _dtypes.needs_host(data):
        return _host_run(call, data, indices)
    checked = _dtypes.check_data(plan.op, data, plan.shapes)
    if key is not None and not _patches.foreign():
        # NumPy indices: the signature fixes their dtype (checked above) and the x64 flag,
        # so a call converts them only where they are saturated (64-bit ones, x64 off), into
        # an array of its own, which the runner then need not copy (``_apply.held``).
        convert = (_dtypes.int32_conversion(given_indices.dtype)
                   if isinstance(given_indices, np.ndarray) else None)
        if convert is None:
            runner = _apply.eager_runner(call, data, indices)
        elif check is not None:
            # "error": one pass over the indices as given checks them; in range, they fit
            # the 32-bit type, and are converted without a pass to ask
            narrow = indices.dtype
            checks = _report.host_checker(plan)
            unchecked = _apply.eager_runner(call._replace(mode="promise_in_bounds"), data,
                                            indices, own_indices=True)

            def runner(data, indices):
                checks(indices)
                return unchecked(data, indices.astype(narrow))
        else:
            converted = _apply.eager_runner(call, data, indices, own_indices=True)

            def runner(data, indices):
                return converted(data, convert(indices))
        if len(RUNNERS) >= RUNNERS_MAX:  # a program's runners, not every shape ever seen
            RUNNERS.clear()
        RUNNERS[key] = runner
        # as later calls run: data as given, and indices as given where the runner converts
        return runner(data, indices if convert is None else given_indices)
    return _apply.run(call, checked, indices)


def _host_run(call: Call, data, indices):
    """Data JAX cannot hold (strings; 64-bit NumPy data while x64 is off): gathered on the
    host at positions the op computes on the device (``xgather._dtypes.host_gather``)."""
    plan = call.plan
    if _dtypes.is_traced(indices):
        _no_host_path(plan, data, "under a JAX transformation")
    try:
        return _dtypes.host_gather(
            plan.op, data,
            lambda iota, fill: _apply.run(Call(plan, call.mode, fill), iota, indices),
            call.fill_value if call.mode == "fill" else None)
    except jax.errors.TracerArrayConversionError:  # constant indices inside jax.jit
        _no_host_path(plan, data, "inside jax.jit")


def _no_host_path(plan, data, where: str) -> NoReturn:
    fail(plan.op, "string data, and 64-bit data while jax_enable_x64 is off, take the host "
         f"path, which cannot run {where}", str(data.dtype), plan.shapes, kind=XGatherTypeError)


def clear_caches() -> None:
    """Forget every plan, jitted function and eager call path cached here
    ([`xgather.clear_caches`][xgather.clear_caches] says more)."""
    for cache in (*_apply.CACHES, _plan._take_plan, _plan._nd_plan, _plan._elements_plan):
        cache.cache_clear()
    RUNNERS.clear()


_Op = TypeVar("_Op", bound=Callable[..., Any])


def op(planner: Callable[..., Plan], index_dtypes: tuple, *, spec_default: str = "error",
       gradient: Callable[..., tuple[bool, float]] | None = None,
       run: Callable | None = None) -> Callable[[_Op], _Op]:
    """Declare a frontend op. The decorated function is the declaration (its signature
    and docstring; its body is not run); this decorator makes it the op.

    ``planner`` takes the op's arguments (no arrays needed: anything with ``.shape``
    and ``.dtype``) and returns its plan, every static rule checked; ``index_dtypes``
    are the index dtypes the op takes; ``spec_default`` the mode of ``mode=None``
    where the spec defines out-of-range results (OpenVINO Gather: ``"fill"``);
    ``gradient`` (LabVIEW) takes the plan and the arguments and returns the
    ``(training, coeff)`` that reshape the derivative. ``run`` replaces the plain run
    (``xgather.sharded``): it takes the plan, ``data``, ``indices`` and the other
    arguments by name, and eager calls are not cached.

    A call: the signature's runner where an eager call of it ran before (one dict
    lookup), else the plan, the options resolved (``resolve_call``) and the run, whose
    runner is cached where the call is eager.
    """
    def declare(fn: _Op) -> _Op:
        where = _name(fn)
        params = inspect.signature(fn)
        data_name, indices_name = list(params.parameters)[:2]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            # Only data and indices are inputs to convert: options such as axis= are not
            if len(args) < 2 or not (_plain(args[0]) and _plain(args[1])) or (
                    kwargs and (data_name in kwargs or indices_name in kwargs)):
                args, kwargs = _inputs(where, args, kwargs)
            key = None if run is not None else signature(wrapper, args, kwargs)
            if key is not None:
                try:
                    runner = RUNNERS.get(key)
                except TypeError:  # an unhashable attribute: no signature
                    runner = key = None
                if runner is not None:
                    return runner(args[0], args[1])
            try:
                bound = params.bind(*args, **kwargs)
            except TypeError as err:
                raise TypeError(f"{where}(): {err}") from None
            bound.apply_defaults()
            given = bound.arguments
            data, indices = given[data_name], given[indices_name]
            plan = planner(**given)
            if run is not None:
                return run(plan, **given)
            grad = None if gradient is None else gradient(plan, **given)
            call, idx, check = resolve_call(
                plan, data, indices, index_dtypes, given["mode"], given["fill_value"],
                spec_default=spec_default,
                indices_are_sorted=given.get("indices_are_sorted", False),
                unique_indices=given.get("unique_indices", False), grad=grad,
                out_sharding=given.get("out_sharding"))
            return _run_and_cache(key, call, data, idx, indices, check)

        wrapper.__xgather_plan__ = planner  # type: ignore[attr-defined]
        wrapper.__xgather_spec_default__ = spec_default  # type: ignore[attr-defined]
        return cast(_Op, wrapper)
    return declare


def explain(op, *args, **kwargs) -> Plan:
    """The plan ``op(*args, **kwargs)`` would run, without running it.

    Arrays may be replaced by anything with ``.shape`` and ``.dtype`` (e.g.
    ``jax.ShapeDtypeStruct``). ``print(xgather.explain(...))`` shows the
    normalised attributes, the lowering taken, the ``lax.GatherDimensionNumbers``
    and the slice sizes, then what the call adds to the plan as traced now: the
    bound check of the call's mode (the plan's ``notes``), the form of its flag in
    ``"error"``, none in the other modes. ``mode`` and ``fill_value`` are checked as
    the call checks them.

    Examples:
        >>> import numpy as np, xgather
        >>> p = xgather.explain(xgather.onnx.gather, np.zeros((3, 4)),
        ...                     np.zeros(5, np.int64), axis=1)
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
    args, kwargs = _inputs(f"xgather.explain({_name(op)})", args, kwargs)
    plan = planner(*args, **kwargs)
    # The call's mode and fill_value, checked as the call checks them: the note says
    # which bound check the call runs, if any.
    bound = inspect.signature(op).bind(*args, **kwargs)
    bound.apply_defaults()
    given = bound.arguments
    data, indices = list(given.values())[:2]
    mode, _, spec_rule = mode_and_fill(plan, data, given.get("mode"), given.get("fill_value"),
                                       getattr(op, "__xgather_spec_default__", "error"),
                                       shapes(data, indices))
    note = (_check.flag_text(plan) if mode == "error" else
            f'bound check: none (mode="{mode}": '
            + ("an out-of-range index reads the nearest end)" if mode == "clip" else
               "an out-of-range index gives zeros, the spec's rule)" if spec_rule else
               "an out-of-range index gives fill_value)" if mode == "fill" else
               "you promise that every index is in range)"))
    return dataclasses.replace(plan, notes=(note,))
