"""Inputs in: index dtypes, and data that a jax.Array cannot hold exactly.

Device path: anything JAX holds exactly (every numeric type when
``jax_enable_x64`` is on; every type of 32 bits or fewer when it is off).

Host path: NumPy string/object arrays, and NumPy arrays of 64-bit types
(int64, uint64, float64, complex128) while x64 is off, where ``jnp.asarray``
would silently truncate them to 32 bits. The same plan gathers the flat
*positions* of ``data`` on the device (an int32 iota), with the same modes,
checks and errors; the positions then index the host array, and the result is
a NumPy array of the original dtype, bit for bit.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from xgather import _jaxprivate
from xgather._errors import XGatherError, XGatherTypeError, fail

#: What the ops take for ``data`` and ``indices``: arrays and scalars
#: (``jax.typing.ArrayLike``), and nested Python sequences, which NumPy converts.
ArrayLike = Union[jax.typing.ArrayLike, Sequence[Any]]  # noqa: UP007 (a runtime alias)
#: What the ops give: a ``jax.Array``, or on the host path (strings; 64-bit data
#: while x64 is off) a NumPy array of the data's dtype.
Result = Union[jax.Array, np.ndarray]  # noqa: UP007
#: Where a result lives (``out_sharding=``): None, or a sharding JAX's ``reshard`` takes.
Sharding = Optional[Union[jax.sharding.NamedSharding, jax.sharding.PartitionSpec]]  # noqa: UP007,UP045

INT32_INDICES = ("int32", "int64")
ANY_INTEGER = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

_WIDE = frozenset({"int64", "uint64", "float64", "complex128"})

#: ONNX's type constraint T of Gather, GatherND and GatherElements up to version 12
#: (``onnx.defs``): every tensor type of ONNX but bfloat16, the 8-bit floats and the 4-bit
#: types; version 13 adds bfloat16 (and the LabVIEW block lists the same).
ONNX_DATA = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                       "uint64", "float16", "float32", "float64", "complex64", "complex128",
                       "string"})
ONNX_DATA_13 = ONNX_DATA | {"bfloat16"}


def foreign_input(op: str, name: str, x):
    """``x`` as an input the ops read exactly, or a clear error.

    * NumPy arrays in another byte order (``>f4`` on a little-endian machine) are
      converted to the native order: the same values.
    * NumPy masked arrays are refused: a mask means nothing to these specs, and
      dropping it would gather the masked raw values.
    * Other array objects, such as torch tensors, are read through ``__dlpack__``
      (on a CPU, as a NumPy array without a copy, so that 64-bit values stay exact with
      x64 off) or ``__array__``; a GPU tensor becomes a JAX array on its device.
    NumPy and JAX arrays in native order, tracers, scalars and lists pass unchanged
    (``shape_of`` checks lists).
    """
    kind = type(x)
    if kind is np.ndarray:
        return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))
    if isinstance(x, jax.Array | jax.core.Tracer | int | float | complex | np.generic):
        return x
    if isinstance(x, np.ma.MaskedArray):
        fail(op, f"{name} is a NumPy masked array: a mask means nothing to this spec, and "
             f"the masked values would be read; pass {name}.filled(value) or "
             f"{name}.data", f"a masked array of shape {x.shape}", kind=XGatherTypeError)
    if isinstance(x, np.ndarray):  # another ndarray subclass (np.matrix, a memmap)
        return foreign_input(op, name, np.asarray(x))
    if hasattr(x, "__dlpack__") or hasattr(x, "__array__"):
        return _from_array_object(op, name, x)
    if isinstance(x, list | tuple) and _holds_tracers(x):
        return jnp.asarray(x)  # traced values in a list (a list argument under jax.jit)
    return x  # not an array: the frontend's check names it


def _holds_tracers(x: list | tuple) -> bool:
    """Whether a (nested) list holds traced values, as a list argument of a jitted function
    does. A list whose first value is a number is taken for a list of numbers, without
    reading the rest: every list given to an op passes here."""
    first = x
    while isinstance(first, list | tuple) and first:
        first = first[0]
    return not isinstance(first, int | float | complex | np.generic) and \
        is_traced(*jax.tree.leaves(x))


def _from_array_object(op: str, name: str, x):
    """A torch tensor (or another object with ``__dlpack__`` or ``__array__``) as a NumPy
    array where it is on the host (exact at any width; torch's bfloat16 and float8 as
    ml_dtypes' types), else as a JAX array (data on an accelerator, which stays there)."""
    what = f"{type(x).__module__}.{type(x).__qualname__}"
    detach = getattr(x, "detach", None)
    if getattr(x, "requires_grad", False) and callable(detach):
        x = detach()  # the values only: xgather's gradient is JAX's
    if getattr(x, "is_meta", False):
        fail(op, f"{name} is a {what} on the meta device, which has a shape and no values",
             f"shape {tuple(getattr(x, 'shape', ()))}", kind=XGatherTypeError)
    # torch's lazy negation and conjugation are bits that DLPack does not carry: resolved
    # here (a copy where a bit is set, else the tensor itself), so the values are read
    for resolve in ("resolve_neg", "resolve_conj"):
        if callable(getattr(x, resolve, None)):
            x = getattr(x, resolve)()
    device = getattr(x, "__dlpack_device__", None)
    on_cpu = not callable(device) or int(device()[0]) == 1  # DLPack's kDLCPU
    errors = (TypeError, BufferError, RuntimeError, ValueError)
    if on_cpu:
        try:
            return np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.asarray(x)
        except errors:
            pass  # a dtype NumPy holds only through ml_dtypes (bfloat16), or none
        host = _torch_ml_dtype(x)
        if host is not None:
            return host
    try:
        out = jax.dlpack.from_dlpack(x) if hasattr(x, "__dlpack__") else jnp.asarray(x)
    except errors as err:
        fail(op, f"{name}: a {what} could not be read as an array (through __dlpack__ or "
             "__array__)", f"{type(err).__name__}: {_short(str(err))}", kind=XGatherTypeError)
    width = getattr(getattr(x, "dtype", None), "itemsize", None)
    if isinstance(width, int) and width > np.dtype(out.dtype).itemsize:
        # JAX's DLPack import narrows 64-bit values while x64 is off
        fail(op, f"{name}: a 64-bit {what} off the CPU cannot be read exactly while "
             "jax_enable_x64 is off (enable it, or move the tensor to the CPU)",
             str(x.dtype), kind=XGatherTypeError)
    return out


def _torch_ml_dtype(x) -> np.ndarray | None:
    """A torch tensor on the CPU whose type NumPy holds through ml_dtypes only (bfloat16,
    the float8 types) as a NumPy array of that type, without a copy: its bits viewed as
    integers of the same width; None for anything else.

    Not through JAX's DLPack import, which needs JAX's CPU backend (absent where
    ``JAX_PLATFORMS=cuda``) and would leave the data there instead of on the default device.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    kind = getattr(ml_dtypes, str(x.dtype).removeprefix("torch."), None)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}.get(x.dtype.itemsize)
    if kind is None or bits is None:
        return None
    return np.from_dlpack(x.view(bits)).view(kind)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


#: JAX's config, read by attribute (typed on some JAX versions only).
_CONFIG: Any = jax.config


def x64() -> bool:
    """Whether x64 is on here (``jax.enable_x64`` blocks too): read on every eager call,
    by attribute, which costs half of ``jax.config.read``."""
    return bool(_CONFIG.jax_enable_x64)


def is_traced(*xs) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def shape_of(x, op: str = "xgather", name: str = "input") -> tuple[int, ...]:
    if hasattr(x, "shape"):
        shape = x.shape
    else:
        try:
            shape = np.shape(x)
        except ValueError as e:  # a ragged nested list
            raise XGatherError(f"{op}: {name} must be a rectangular nested list ({e})") from None
        if isinstance(x, list | tuple) and np.asarray(x).dtype == object:  # None inside
            fail(op, f"{name} as a list must hold numbers (integers within 64 bits) or "
                 "strings only", _short(repr(x)),
                 kind=XGatherTypeError)
    # jax.export's symbolic dims ("B") stay as they are: the plan says where a number is
    # needed (the sizes of the axes the indices address, the length of index tuples)
    dims = tuple(int(n) if isinstance(n, int | np.integer) else _symbolic(op, name, shape, n)
                 for n in shape)
    if any(isinstance(n, int) and n < 0 for n in dims):  # an impostor's, or a struct's
        fail(op, f"every dim of {name} must be >= 0", f"{name}.shape={dims}")
    return dims


def _symbolic(op: str, name: str, shape, n):
    if not jax.export.is_symbolic_dim(n):
        fail(op, f"every dim of {name} must be an int or a symbolic dimension (jax.export)",
             f"{name}.shape=({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})")
    return n


def as_int(value) -> int | None:
    """``value`` as an int where it is a Python int or NumPy integer (a 0-d integer array
    too), not a bool; else None."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        return None
    return int(value)


def index_dtype(indices) -> np.dtype:
    dtype = getattr(indices, "dtype", None)
    if dtype is None:
        arr = np.asarray(indices)
        return np.dtype(np.int64) if arr.dtype.kind in "iu" or arr.size == 0 else arr.dtype
    return np.dtype(dtype)


def _check_list_ints(op: str, indices, shapes) -> None:
    """Python ints (lists, scalars) are int64 indices: one beyond int64 is an error (NumPy
    would hold such a list as uint64, which wraps into int64, or as float64)."""
    if hasattr(indices, "dtype") or np.asarray(indices).dtype.kind not in "uOf":
        return
    flat = np.asarray(indices, dtype=object).ravel()
    if flat.size and all(isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)
                         for v in flat):
        info = np.iinfo(np.int64)
        beyond = [int(v) for v in flat if not info.min <= int(v) <= info.max]
        if beyond:  # (a list of NumPy unsigned scalars in range is uint too: it fits)
            fail(op, "Python int indices are int64 and must fit it",
                 f"index value {max(beyond, key=abs)}", shapes)


def check_index_dtype(op: str, indices, allowed, shapes=None) -> None:
    """Indices of a dtype outside ``allowed`` (floats, bools, ...) are a TypeError."""
    _check_list_ints(op, indices, shapes)
    dtype = index_dtype(indices)
    if dtype.name not in allowed:
        fail(op, f"indices must be {' or '.join(allowed)}", str(dtype), shapes,
             kind=XGatherTypeError)


def data_type(data) -> str | None:
    """``data``'s type as a spec names it (``"string"`` for text and object arrays), or None
    for lists and scalars (they take JAX's default types)."""
    dtype = getattr(data, "dtype", None)
    if dtype is None:
        return None
    dtype = np.dtype(dtype)
    return "string" if dtype.kind in "USO" else dtype.name


def check_data_type(op: str, data, allowed, shapes=None, note: str = "") -> None:
    """``data`` of a type in ``allowed`` (a spec's type constraint), else a TypeError."""
    name = data_type(data)
    if name is not None and name not in allowed:
        fail(op, f"data must be of a type the spec allows ({', '.join(sorted(allowed))}){note}",
             name, shapes, kind=XGatherTypeError)


def fill_scalar(op: str, fill_value, dtype, shapes=None):
    """``fill_value`` checked against ``data``'s dtype, as a Python scalar (it keys caches).

    A concrete scalar that the dtype holds: exactly for bool and integer data
    (1.7, NaN, 300 into uint8 are errors, not a silent cast), rounded to the
    nearest value for floating data (a finite value must stay finite), real
    for real data; a ``str`` for text data (``bytes`` for NumPy bytes arrays).
    """
    if fill_value is None:
        return None
    if is_traced(fill_value):
        fail(op, "fill_value must be a concrete scalar (an attribute of the op, fixed when "
             "it is traced)", type(fill_value).__name__, shapes, kind=XGatherTypeError)
    dtype = np.dtype(dtype)
    try:
        arr = np.asarray(fill_value)
    except Exception:  # noqa: BLE001 - anything NumPy cannot hold is no scalar
        arr = np.asarray(None)
    if arr.ndim:
        fail(op, "fill_value must be a scalar", f"an array of shape {arr.shape}", shapes,
             kind=XGatherTypeError)
    value = arr.item() if arr.dtype.kind != "O" else fill_value
    text = {"U": str, "O": str, "S": bytes}.get(dtype.kind)
    if text is not None:
        if not isinstance(value, text):
            fail(op, f"fill_value for {dtype} data must be a {text.__name__}", repr(fill_value),
                 shapes, kind=XGatherTypeError)
        return value
    if isinstance(value, bool | np.bool_):
        value = bool(value)
    elif not isinstance(value, int | float | complex) or isinstance(value, str):
        fail(op, f"fill_value for {dtype} data must be a number", repr(fill_value), shapes,
             kind=XGatherTypeError)
    if isinstance(value, complex) and not jnp.issubdtype(dtype, jnp.complexfloating):
        fail(op, f"fill_value for real {dtype} data must be real", repr(fill_value), shapes)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            held = np.asarray(value).astype(dtype).item()
        except OverflowError:
            held = None
    if jnp.issubdtype(dtype, jnp.inexact):
        ok = held is not None and (np.isfinite(held) or not np.isfinite(value))
        rule = f"fill_value must lie within {dtype}'s range (a finite value stays finite)"
    else:  # bool and integer data hold a value exactly, or not at all
        ok = held is not None and held == value
        rule = f"fill_value must be a value {dtype} holds exactly"
    if not ok:
        fail(op, rule, repr(fill_value), shapes)
    if isinstance(value, float) and signed_zero_or_nan(value):
        return ExactFloat(value)
    if isinstance(value, complex) and signed_zero_or_nan(value):
        return ExactComplex(value)
    return value


def signed_zero_or_nan(value) -> bool:
    """Whether ``value`` (a float or complex) has a -0.0 or NaN part: as a dict key it is
    equal to another value (``-0.0 == 0.0``) or to nothing (``nan != nan``)."""
    return value != value or negative_zero(value)


def negative_zero(value) -> bool:
    """Whether ``value`` (a float or complex, Python or NumPy) has a part that is -0.0."""
    parts = (value.real, value.imag) if isinstance(value, complex | np.complexfloating) \
        else (value,)
    return any(p == 0 and math.copysign(1.0, p) < 0 for p in parts)


class _Exact:
    """A fill value equal only to one of the same bits: ``-0.0`` keys its own cache
    entries (``-0.0 == 0.0`` in Python), and a NaN equals itself."""

    def __eq__(self, other):
        return type(other) is type(self) and repr(other) == repr(self)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((type(self).__name__, repr(self)))


class ExactFloat(_Exact, float):
    """A float fill value that is -0.0 or NaN (see ``_Exact``)."""


class ExactComplex(_Exact, complex):
    """A complex fill value with a -0.0 or NaN part (see ``_Exact``)."""


def index_array(op: str, indices, allowed=INT32_INDICES, shapes=None, check=None):
    """Indices as an integer array (NumPy or JAX) of an allowed dtype, never wrapped.

    Python lists of ints become int64. With x64 off, 64-bit NumPy indices become
    32-bit; values beyond the 32-bit type are saturated into it, so that they
    stay out of range on the same side (with x64 off no axis reaches ``2**31``:
    ``xgather._frontend.check_addressable``) and every mode treats them as
    the out-of-range indices they are. ``check`` (the ``"error"`` mode's host
    check) sees such indices first, as given, so that its report names the
    value given.
    """
    check_index_dtype(op, indices, allowed, shapes)
    if not hasattr(indices, "dtype"):
        indices = np.asarray(indices).astype(index_dtype(indices))
    elif isinstance(indices, np.generic):  # a NumPy scalar: converted below as arrays are
        indices = np.asarray(indices)
    if isinstance(indices, np.ndarray) and int32_conversion(indices.dtype) is not None:
        indices = saturated_int32(indices, check)
    return indices


def int32_conversion(dtype):
    """How NumPy indices of ``dtype`` are converted before a gather: ``saturated_int32``
    where they are 64-bit and x64 is off, else None (they go as they are).

    A cached eager call (``xgather._frontend``) resolves this once: its signature
    fixes the dtype and the x64 flag, and its first call checked the dtype.
    """
    return saturated_int32 if np.dtype(dtype).itemsize == 8 and not x64() else None


def _narrow(dtype) -> np.dtype:
    """The 32-bit integer type of a 64-bit one's kind: what JAX makes of it with x64 off."""
    return np.dtype(np.int32 if np.dtype(dtype).kind == "i" else np.uint32)


def _fits(x: np.ndarray, narrow: np.dtype) -> bool:
    """Whether every value of ``x`` lies in ``narrow``'s range."""
    info = np.iinfo(narrow)
    return not x.size or (x.min() >= info.min and x.max() <= info.max)


def saturated_int32(indices: np.ndarray, check=None) -> np.ndarray:
    """64-bit NumPy indices as 32-bit ones, values beyond the 32-bit type saturated into
    it (``check`` sees them first, as given: see ``index_array``)."""
    int32 = _narrow(indices.dtype)
    if not _fits(indices, int32):
        if check is not None:
            check(indices)
        info = np.iinfo(int32)
        indices = np.clip(indices, info.min, info.max)
    return indices.astype(int32)


def _cut_by_jit(x) -> tuple[int, tuple[int, ...]] | None:
    """The first value of a 64-bit NumPy integer ``x`` that the 32-bit type of its kind
    cannot hold, and its position (None where all fit)."""
    narrow = _narrow(x.dtype)
    if _fits(x, narrow):
        return None
    info = np.iinfo(narrow)
    flat = np.flatnonzero((x < info.min) | (x > info.max))[0]
    return int(x.ravel()[flat]), tuple(int(k) for k in np.unravel_index(flat, x.shape))


def jit_arguments(fn_name: str, args, kwargs, static=()):
    """A checked function's arguments as the eager ops would read them, or their errors,
    before the user's jit sees them: ``(args, kwargs, wait)``.

    Arguments at the top level are looked at, and the values of a dict, list or tuple
    there (a batch of ids in a dict), not deeper: a whole tree's leaves would cost every
    call a flatten. JAX arrays go through as they are (the common call: one type test
    each). Torch tensors and other array objects are read as arrays at each call
    (``foreign_input``), NumPy arrays in another byte order are converted, masked arrays
    and strings are refused, and so are integers that the jit would cut: with x64 off,
    ``jax.jit`` cuts a 64-bit NumPy integer to 32 bits (``2**32 + 1`` becomes ``1``, a
    valid row) without a word. ``static``: positions and names the jit does not trace.

    A jit reads a NumPy argument in place on a CPU, after the call has returned (JAX
    aliases the buffer): the check would pass values that the gather then does not read.
    So NumPy arrays (torch tensors on the host among them) are copied, up to
    ``COPY_MAX`` bytes, as an eager call copies them; for a larger one ``wait`` is true,
    and the caller waits for the program before it returns.
    """
    for x in args:  # the common call: arrays, dicts, lists or tuples of arrays, modules
        kind = type(x)
        if kind is _JAX_ARRAY or kind in _NOT_ARRAYS:
            continue
        if kind is dict:
            x = x.values()
        elif kind is not list and kind is not tuple:
            break
        for value in x:
            if type(value) is not _JAX_ARRAY:
                break
        else:
            continue
        break
    else:
        if not kwargs:
            return args, kwargs, False
    where = f"xgather.checked({fn_name})"
    large: list = []
    args = tuple(x if i in static else _jit_argument(where, i, x, large)
                 for i, x in enumerate(args))
    kwargs = {k: x if k in static else _jit_argument(where, k, x, large)
              for k, x in kwargs.items()}
    return args, kwargs, bool(large)


#: NumPy arrays of up to this many bytes are copied before a call that would read them in
#: place after it returns; a call given a larger one waits for its program instead.
COPY_MAX = 1 << 20


_JAX_ARRAY = _jaxprivate.ARRAY_IMPL
_CONTAINERS = frozenset({dict, list, tuple})
_AS_IS = frozenset({_JAX_ARRAY, float, bool, complex, str, type(None), np.float32, np.bool_})
#: Types seen to be no array and no int (an nnx or equinox module, an optimizer): passed
#: by type alone from then on, as ``hasattr`` on a module can cost microseconds.
_NOT_ARRAYS: set[type] = set()


def _jit_argument(where: str, at, x, large: list):
    """One argument (``at``: its position or name) as ``jit_arguments`` passes it; NumPy
    arrays too large to copy go into ``large``."""
    kind = type(x)
    if kind in _AS_IS:
        return x
    if kind in _CONTAINERS:
        items = list(x.items() if kind is dict else enumerate(x))
        values = [_jit_value(where, (at, k), v, large) for k, v in items]
        if all(v is w for (_, v), w in zip(items, values, strict=True)):
            return x
        return dict(zip(x, values, strict=True)) if kind is dict else kind(values)
    return _jit_value(where, (at,), x, large)


def _argument_name(at: tuple) -> str:
    """``argument 0`` or ``argument 'ids'``, then ``[key]`` where in a container."""
    return f"argument {at[0]!r}" + "".join(f"[{k!r}]" for k in at[1:])


def _jit_value(where: str, at: tuple, x, large: list):
    if type(x) in _AS_IS or type(x) in _NOT_ARRAYS or isinstance(x, jax.core.Tracer):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        bits = 64 if x64() else 32
        if not -2**(bits - 1) <= x < 2**(bits - 1):
            fail(where, f"{_argument_name(at)}, a Python int, does not fit int{bits}, the "
                 "type jax.jit gives it" + (" while jax_enable_x64 is off (turn it on, or "
                                             "pass values that fit)" if bits == 32 else ""),
                 repr(x), kind=XGatherTypeError)
        return x
    if not (isinstance(x, np.ndarray | np.generic) or hasattr(x, "__dlpack__")
            or hasattr(x, "__array__")):
        if len(_NOT_ARRAYS) < 256:
            _NOT_ARRAYS.add(type(x))
        return x  # not an array (a module, a function): the jit's own rules
    name = _argument_name(at)
    x = foreign_input(where, name, x)
    if isinstance(x, np.ndarray | np.generic):
        if x.dtype.kind in "USO":
            fail(where, f"{name}, a NumPy array of {x.dtype}, cannot be traced by a jit; "
                 "gather such data eagerly (the ops take it outside a jit, on the host)",
                 str(x.dtype), kind=XGatherTypeError)
        if isinstance(x, np.ndarray):
            if x.nbytes <= COPY_MAX:
                x = np.array(x)
            else:
                large.append(x)
        _check_cut(where, name, x)
    return x


def _check_cut(where: str, name: str, x) -> None:
    """Raise where ``x`` is a 64-bit NumPy integer that ``jax.jit`` would cut."""
    if x.dtype.itemsize == 8 and x.dtype.kind in "iu" and not x64():
        bad = _cut_by_jit(np.asarray(x))
        if bad is not None:
            value, at = bad
            cut = int(np.asarray(value, x.dtype).astype(_narrow(x.dtype)))
            kind = f"NumPy {x.dtype} array" if isinstance(x, np.ndarray) else f"NumPy {x.dtype}"
            fail(where, f"{name}, a {kind}, is cut to 32 bits by "
                 "jax.jit while jax_enable_x64 is off, and its value "
                 f"{value}{f' at {list(at)}' if at else ''} would become {cut}. Pass it as "
                 "int32 or as a JAX array, or turn jax_enable_x64 on",
                 kind=XGatherTypeError)


def needs_host(data) -> bool:
    """True for NumPy data that JAX cannot hold exactly (strings, 64-bit without x64)."""
    if is_traced(data) or isinstance(data, jax.Array):
        return False
    dtype = getattr(data, "dtype", None)
    if dtype is None:
        return False
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return True
    if dtype.kind == "V":  # ml_dtypes (bfloat16, float8) are JAX types; other records are not
        try:
            jnp.zeros((), dtype)
        except TypeError:
            return True
        return False
    return dtype.name in _WIDE and not x64()


def check_data(op: str, data, shapes=None):
    """Data for the device path: a jax.Array (or tracer) of a dtype JAX supports."""
    if is_traced(data) or isinstance(data, jax.Array):
        return data
    try:
        if isinstance(data, (np.ndarray, np.generic)):
            # A transfer; jnp.asarray (jax 0.10) compiles an identity program per
            # shape and dtype first, as long as a gather's compile on XLA:CPU. The
            # program places its result as for the NumPy data of a cached call.
            return jax.device_put(data)
        return jnp.asarray(data)
    except OverflowError as e:  # a list's integer beyond JAX's default integer type
        advice = ("a NumPy uint64 array" if x64() else "a NumPy int64 array (gathered "
                  "exactly on the host), or turn jax_enable_x64 on")
        raise XGatherTypeError(f"{op}: data as a list holds an integer that JAX's default "
                               f"integer type cannot hold ({e}); pass it as {advice}") from None
    except TypeError as e:
        raise XGatherTypeError(f"{op}: data has a dtype JAX cannot hold; got "
                               f"{getattr(data, 'dtype', type(data))}" + (f" ({e})")) from e


def host_gather(op: str, data: np.ndarray, run_positions, fill_value):
    """Gather ``data`` on the host at positions computed on the device.

    ``run_positions(iota, fill)`` runs the op's plan on an int32 array of flat
    positions shaped like ``data``; ``-1`` marks a filled slot.
    """
    if data.size >= 2**31 - 1:
        raise XGatherError(f"{op}: host-path data must have fewer than 2**31 - 1 elements; "
                           f"got {data.size} (enable jax_enable_x64 to keep it on the device)")
    iota = np.arange(data.size, dtype=np.int32).reshape(data.shape)
    positions = np.asarray(run_positions(iota, -1))
    flat = data.reshape(-1)
    out = flat[np.where(positions < 0, 0, positions)] if flat.size else \
        np.empty(positions.shape, data.dtype)
    dtype = data.dtype
    if (positions < 0).any():
        if fill_value is None:
            # a string tensor's zero: "" ("" in bytes for bytes data, which keeps its dtype)
            fill_value = b"" if data.dtype.kind == "S" else "" if data.dtype.kind in "UO" else 0
        fill = np.asarray(fill_value)
        if data.dtype.kind in "US":  # a longer fill string widens the result, never cut
            dtype = np.promote_types(data.dtype, fill.dtype)
        else:
            fill = np.asarray(fill_value, dtype=data.dtype)
        out = np.where(positions < 0, fill, out)
    return np.asarray(out, dtype=dtype)  # a 0-d result too (indexing gives a NumPy scalar)
