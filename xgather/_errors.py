"""The error classes of xgather and their one message format.

Every static error reads ``<op>: <rule>; got <value> [<shapes>]`` so that a user
porting a model sees which node failed, which rule it broke and with what.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping
from typing import NoReturn


class XGatherError(ValueError):
    """A static rule of an operator's spec was broken (raised at trace time)."""


class XGatherTypeError(XGatherError, TypeError):
    """An input has a dtype or kind the operator does not accept."""


class OutOfBoundsError(XGatherError, IndexError):
    """An index lies outside the range its spec allows (``mode="error"``).

    What the message says is also in attributes, for a loop that handles the failure
    (None where not known): ``op`` (``"onnx.Gather-13"``), ``index`` (the first bad
    value, as given), ``position`` (its place in the indices, a tuple), ``valid_range``
    (``(low, high)``, both included), ``axis`` and ``size`` (the data axis it indexes),
    ``count`` (how many indices are out of range), ``file`` and ``line`` (where the
    gather was traced), and, for a call of a [`checked`][xgather.checked] function,
    ``call`` (its number in this thread, from 1, as the message says) and
    ``call_index`` (from 0, as a loop counts); ``node``, the ONNX node's name where the op
    runs one (``from_node``, ``reference_ops``, jaxonnxruntime's handlers).
    """

    op: str | None = None
    index: int | None = None
    position: tuple[int, ...] | None = None
    valid_range: tuple[int, int] | None = None
    axis: int | None = None
    size: int | None = None
    count: int | None = None
    file: str | None = None
    line: int | None = None
    call: int | None = None
    call_index: int | None = None
    node: str | None = None


class UncheckedWarning(UserWarning):
    """A ``mode="error"`` check that JAX will drop: an out-of-range index there goes
    unreported (a ``lax.scan`` or loop body under a reverse-mode derivative, where JAX
    drops checkify checks), or a failure still unread at exit (docs/checks.md)."""


def describe(shapes: Mapping[str, tuple[int, ...]] | None) -> str:
    if not shapes:
        return ""
    return " [" + ", ".join(f"{k}.shape={tuple(v)}" for k, v in shapes.items()) + "]"


def message(op: str, rule: str, got: str | None = None, shapes=None) -> str:
    text = f"{op}: {rule}"
    if got is not None:
        text += f"; got {got}"
    return text + describe(shapes)


def fail(op: str, rule: str, got: str | None = None, shapes=None, *,
         kind: type[Exception] = XGatherError) -> NoReturn:
    """Raise ``kind`` with the project's message format."""
    raise kind(message(op, rule, got, shapes))


def choice(op: str, name: str, value, allowed: Iterable) -> None:
    """Check that ``value`` is one of ``allowed``; the error lists them."""
    allowed = tuple(allowed)
    if value not in allowed:
        fail(op, f"{name} must be one of {', '.join(map(repr, allowed))}", repr(value))


#: The name of the ONNX node an op runs for, while it runs or is traced (``for_node``).
NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("xgather_onnx_node",
                                                                  default=None)


def named(msg: str, node: str) -> str:
    """``msg`` (``"<op>: <rule>..."``) with the ONNX node named after the op, as
    onnxruntime names the node that failed: ``onnx.Gather-13 (node 'g1'): ...``."""
    op, sep, rest = msg.partition(": ")
    return f"{op} (node {node!r}){sep}{rest}" if sep else f"{msg} (node {node!r})"


class for_node:  # noqa: N801 - used as a function: ``with for_node(name):``
    """Run an op for the ONNX node ``node``: its errors, raised now or reported later
    (a traced check's report), name the node. A class, not a generator: an eager call of
    a node's function pays for it at every call."""
    __slots__ = ("node", "token")
    token: contextvars.Token[str | None] | None

    def __init__(self, node: str | None):
        self.node, self.token = node or None, None

    def __enter__(self) -> None:
        if self.node:
            self.token = NODE.set(self.node)

    def __exit__(self, kind, err, tb) -> None:
        node, token = self.node, self.token
        if not node or token is None:
            return
        NODE.reset(token)
        if isinstance(err, XGatherError):
            if err.args and isinstance(err.args[0], str) and \
                    f"(node {node!r})" not in err.args[0]:
                err.args = (named(err.args[0], node), *err.args[1:])
            if isinstance(err, OutOfBoundsError):
                err.node = node
