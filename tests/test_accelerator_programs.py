"""No accelerator program holds a host round trip: every program xgather traces with the GPU's
or the TPU's lowering choices (``xgather._lower.TABLE``) is free of conditionals, loops, host
callbacks and host transfers.

Why: XLA:GPU reads a conditional's predicate (and a while loop's condition) on the host, so
a branch in a program makes the host wait for the device in its middle; a host callback
copies its operands to the host and back. The CPU's choices may branch (``wrap="by_size"``:
the negative wrap of larger gathers of narrow slices in a branch taken only when some index
is negative); the accelerators' take ``wrap="fused"``: the wrap inside the gather, at every
size.

How: each program is traced here, on the CPU, inside ``xgather.lowering("gpu")`` (or
``"tpu"``), from ``jax.ShapeDtypeStruct`` arguments (nothing is allocated, so the GPU sizes of
``bench/workloads.py`` cost no more than small ones), and lowered for ``cuda`` (or ``tpu``)
alone: ``jax.jit(f).trace(*structs).lower(lowering_platforms=(...))``, the lowering
``jax.jit`` runs on that device. (``jax.export`` for one platform finds the same, as
``test_an_export_holds_what_the_lowering_holds`` shows on both JAX versions, at two to three
times the cost.) The StableHLO text must hold no ``stablehlo.case``, ``stablehlo.if``,
``stablehlo.while``, no ``send``/``recv``/``infeed``/``outfeed`` and no ``custom_call`` whose
target names a callback (``xla_ffi_python_gpu_callback`` and the like). A host callback
cannot even be lowered for another platform than this machine's (JAX lowers it through the
local backend): that refusal is reported as a host callback (``lowered``). Nothing is
compiled or run, except in the value tests at the end.

What is lowered, per op (every op of every frontend, small and GPU-sized, with 32-bit and
64-bit indices), with the ``"gpu"`` and the ``"tpu"`` choices:

* ``"clip"``, ``"fill"``, ``"promise_in_bounds"``: ``jax.jit(op)``, which is also what an
  eager call of these modes runs (``xgather._apply.program(call, False)``);
* ``"error"`` under a transformation: the program that ``xgather.checked(jax.jit(op))``
  compiles itself, taken from the checked function (``checked_program``): the op under
  ``checkify`` with xgather's compact report, and ``_pack``'s flag. A ``checkify`` of our
  own would lower a near relative (the device-side report instead of the compact one) and
  miss ``_pack``: the program read from the closure is the one that runs;
* ``"error"`` eagerly on device indices: the flag program (``xgather._apply.program(call,
  True)``), which returns the flag beside the gather;
* the gradient (``jax.grad`` of the sum w.r.t. ``data``) in every mode (``"error"`` under
  ``checked``; LabVIEW with ``training=True`` and an ``lda_coeff``);
* with the ``"linear"`` element lowering too, where a gather of single elements takes it
  (``xgather.lowering(element_gather="linear")``: ``.ci/gpu`` times both);
* ``xgather.sharded.gather`` on a one-device mesh (Auto and Explicit axes, indices
  replicated or sharded over the rows' axis), every mode and its gradient;
* the bench's programs (``bench/systems.py``): every workload (W1-W10, and W9r-bf16 for
  W9's variants, whose programs are W9's or W9r-bf16's) and model step (M1-M4,
  ``bench/steps.py``) at its ``tiny`` and ``gpu`` sizes, as the bench's ``xgather`` (the
  spec's default, ``checked`` where it checks), ``xgather[promise]`` and ``xgather[linear]``
  systems build them, and in ``"promise_in_bounds"`` with negative indices on (the fused
  wrap inside each step);
* ``checked``'s own small programs: the stacking of a group's flags (``_heads``) and the
  check of indices other processes hold part of (``_device_checker``).

No exemptions, with 64-bit indices too: ``xgather._indices.saturate_64`` saturates them
into int32 with a plain clamp on every platform (XLA:CPU and XLA:GPU both keep only the low
32 bits of a 64-bit index), so no ``lax.platform_dependent`` and none of its cases are left
in any program, and the GPU's programs hold the clamp
(``test_64_bit_indices_are_saturated_on_every_platform``).

The negative controls (``test_the_cpu_choices_do_branch``, ``test_the_detector_sees_...``)
show that the check fails where a program does branch, loop or call the host, with 64-bit
indices too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import xgather
from tests import reference as ref
from xgather import _apply, _check, _checked, _gather
from xgather_bench import steps, systems
from xgather_bench.workloads import WORKLOADS

S = jax.ShapeDtypeStruct
ACCELERATORS = ("gpu", "tpu")
#: The name JAX lowers each platform's programs for.
RUNTIME = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}
MODES = ("error", "clip", "fill", "promise_in_bounds")
FILL = -1.5


# -- what a program must not hold ------------------------------------------------------------

#: Ops that make the host take part while the program runs: a conditional's or a loop's
#: predicate is read on the host by XLA:GPU; the others move data to or from the host.
FORBIDDEN = ("stablehlo.case", "stablehlo.if", "stablehlo.while", "stablehlo.send",
             "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed")
_TARGET = re.compile(r'custom_call\s*@([\w.$-]+)|call_target_name\s*=\s*"([^"]+)"')


def round_trips(text: str) -> list[str]:
    """What in the StableHLO ``text`` makes a host round trip, one entry per op found
    (every ``stablehlo.case``, whatever its branch index)."""
    found = []
    for op in FORBIDDEN:
        found += [op] * len(re.findall(re.escape(op) + r"\b", text))
    for target in (a or b for a, b in _TARGET.findall(text)):
        if "callback" in target.lower():
            found.append(f"host callback {target}")
    return found


def lowered(fn, structs, platform: str) -> str:
    """``fn`` (jitted) lowered for ``platform`` alone from ``structs``: its StableHLO text."""
    try:
        low = fn.trace(*structs).lower(lowering_platforms=(RUNTIME[platform],))
    except ValueError as err:
        # A host callback is lowered through the local backend (this machine's CPU).
        if "is different from the lowering platform" in str(err):
            raise AssertionError(f"a host callback in the program, lowered for {platform}: "
                                 f"{err}") from err
        raise
    return low.as_text()


@dataclasses.dataclass(frozen=True)
class Program:
    label: str
    fn: Callable  # a jitted function
    structs: tuple


def assert_no_round_trips(programs: list[Program], platform: str) -> int:
    """Lower every program for ``platform``; fail with every finding. Returns how many were
    lowered."""
    failures = {}
    for p in programs:
        found = round_trips(lowered(p.fn, p.structs, platform))
        if found:
            failures[p.label] = sorted(set(found))
    assert not failures, (f"host round trips in {len(failures)} of {len(programs)} programs "
                          f"lowered for {platform}: {failures}")
    return len(programs)


def checked_program(fn):
    """The jitted program that ``xgather.checked(fn)`` compiles (its ``program``, the
    default ``jax.jit`` of ``fn`` under checkify with the compact report, and the packed
    flag)."""
    wrapper = xgather.checked(fn)
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or (), strict=True))
    assert "program" in cells, ("xgather.checked no longer keeps its program as `program`: "
                                "update checked_program to lower what it compiles")
    return cells["program"].cell_contents


# -- the ops ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """An op and its attributes at a small size and at a GPU size (``bench/workloads.py``'s
    shapes, or shapes near them where the CPU's choices take a branch: slices of fewer than
    ``ROW_SLICE`` elements)."""

    name: str
    op: Callable
    args: tuple
    small: tuple
    large: tuple
    grad: dict = dataclasses.field(default_factory=dict)  # LabVIEW's gradient parameters
    cpu_pass: str | None = None  # the CPU's wrap_pass at the large size (None: none wraps)

    def structs(self, size: str, index=np.int32):
        d, i = self.small if size == "small" else self.large
        return S(d, np.float32), S(i, index)


_ELEMENTS = ((6, 9), (6, 9)), ((8192, 32768), (8192, 8192))  # W10
_ND = ((9, 10), (17, 2)), ((16384, 16384), (1 << 22, 2))  # W4
_ND_BATCH = ((3, 9, 4), (3, 5, 1)), ((128, 16384, 4), (128, 4096, 1))  # W6, rows of 4

CASES = [
    Case("onnx.gather-last-axis", xgather.onnx.gather, (-1,),  # W3
         ((5, 12), (6,)), ((1 << 18, 1024), (512,)), cpu_pass="separate"),
    Case("onnx.gather_nd", xgather.onnx.gather_nd, (), *_ND, cpu_pass="gather"),
    Case("onnx.gather_nd-batch_dims", xgather.onnx.gather_nd, (1,), *_ND_BATCH,
         cpu_pass="separate"),
    Case("onnx.gather_elements", xgather.onnx.gather_elements, (1,), *_ELEMENTS,
         cpu_pass="gather"),
    # the axis as an input (an array known when tracing), batch_dims=-1 (indices.ndim - 1)
    Case("openvino.gather-axis-input", xgather.openvino.gather, (np.array(1), -1),
         ((3, 11, 2), (3, 4)), ((128, 16384, 2), (128, 4096)), cpu_pass="gather"),
    Case("openvino.gather_nd-batch_dims", xgather.openvino.gather_nd, (1,), *_ND_BATCH,
         cpu_pass="separate"),
    Case("openvino.gather_elements", xgather.openvino.gather_elements, (-1,), *_ELEMENTS,
         cpu_pass="gather"),
    # BNNS: negative indices are out of range, so nothing wraps (no pass on any platform)
    Case("bnns.gather_nd", xgather.bnns.gather_nd, (0,), *_ND),
    Case("bnns.gather", xgather.bnns.gather, (1, 1),  # W7
         ((3, 11, 2), (3, 4)), ((128, 16384, 128), (128, 4096))),
    Case("bnns.gather_along_axis", xgather.bnns.gather_along_axis, (1,), *_ELEMENTS),
    Case("labview.gather", xgather.labview.gather, (0,),  # rows of 4
         ((50, 8), (13,)), ((1 << 20, 4), (1 << 20,)),
         grad=dict(training=True, lda_coeff=0.5), cpu_pass="separate"),
]
CASE_IDS = [c.name for c in CASES]


def _options(mode):
    return dict(mode=mode, fill_value=FILL) if mode == "fill" else dict(mode=mode)


def op_programs(case: Case, structs, modes=MODES, grads=True) -> list[Program]:
    """Every program of ``case``'s op (see the module docstring), traced by the caller's
    ``xgather.lowering``."""
    op, args, grad = case.op, case.args, case.grad

    def forward(mode):
        return lambda d, i: op(d, i, *args, **_options(mode), **grad)

    def loss(mode):
        return jax.grad(lambda d, i: op(d, i, *args, **_options(mode), **grad).sum())

    out = []
    for mode in modes:
        if mode == "error":
            plan = xgather.explain(op, *structs, *args)
            call = _gather.Call(plan, "promise_in_bounds",
                                grad=(grad["training"], grad["lda_coeff"]) if grad else None)
            out += [Program("error, xgather.checked", checked_program(jax.jit(forward(mode))),
                            structs),
                    Program("error, eager on device indices (the flag program)",
                            _apply.program(call, True), structs)]
            if grads:
                out.append(Program("grad, error, xgather.checked",
                                   checked_program(jax.jit(loss(mode))), structs))
            continue
        out.append(Program(mode, jax.jit(forward(mode)), structs))
        if grads:
            out.append(Program(f"grad, {mode}", jax.jit(loss(mode)), structs))
    return out


def _element_lowerings(case: Case, structs, size: str):
    """``None`` (the platform's), and at the GPU size (where ``.ci/gpu`` times it)
    ``"linear"``, where it applies to ``case``."""
    if size != "gpu":
        return (None,)
    with xgather.lowering(element_gather="linear"):
        linear = xgather.explain(case.op, *structs, *case.args).lowering == "linear"
    return (None, "linear") if linear else (None,)


@pytest.mark.parametrize("size", ["small", "gpu"])
@pytest.mark.parametrize("platform", ACCELERATORS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_every_program_of_every_op_stays_on_the_device(case, platform, size):
    structs = case.structs("small" if size == "small" else "large")
    for element in _element_lowerings(case, structs, size):
        with xgather.lowering(platform, element_gather=element):
            plan = xgather.explain(case.op, *structs, *case.args)
            assert (plan.platform, plan.wrap, plan.wrap_pass) == (platform, "fused", "fused")
            assert_no_round_trips(op_programs(case, structs), platform)


@pytest.fixture
def x64():
    """64-bit indices: x64 on for the test (its traces are its own)."""
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("platform", ACCELERATORS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_sixty_four_bit_indices_stay_on_the_device(case, platform, x64):
    """int64 indices are saturated by a plain clamp (``saturate_64``): no ``stablehlo.case``
    or any other round trip, at the GPU size."""
    structs = case.structs("large", np.int64)
    with xgather.lowering(platform):
        programs = op_programs(case, structs, grads=False)
        # and a gradient (fill's: the scatter-add drops the slots out of range)
        programs += [p for p in op_programs(case, structs, modes=("fill",))
                     if p.label.startswith("grad")]
        assert_no_round_trips(programs, platform)


def test_64_bit_indices_are_saturated_on_every_platform(x64):
    """``saturate_64`` clamps on every platform (XLA:CPU and XLA:GPU both keep only the low
    32 bits of a 64-bit index): the same trace, with each platform's choices, lowered for
    each platform, holds the clamp and no case."""
    structs = (S((6, 9), np.float32), S((6, 9), np.int64))
    for choices in ("cpu", *ACCELERATORS):
        with xgather.lowering(choices):
            f = jax.jit(lambda d, i: xgather.onnx.gather_elements(d, i, 1,
                                                                  mode="promise_in_bounds"))
            texts = {p: lowered(f, structs, p) for p in RUNTIME}
        assert {p: "stablehlo.clamp" in t for p, t in texts.items()} == dict.fromkeys(
            RUNTIME, True), choices
        assert {p: round_trips(t) for p, t in texts.items()} == dict.fromkeys(RUNTIME, []), \
            choices


# -- the sharded gather -----------------------------------------------------------------------

def sharded_programs(structs) -> list[Program]:
    """Every mode and its gradient: on Auto axes with the indices replicated (a ``psum``)
    and sharded over the rows' axis (an ``all_gather``, then a ``psum_scatter``), and on
    Explicit axes (``reshard`` in place of sharding constraints)."""
    out = []
    for kind, batch in ((AxisType.Auto, None), (AxisType.Auto, "x"), (AxisType.Explicit, None)):
        mesh = jax.make_mesh((1,), ("x",), axis_types=(kind,))
        for mode in MODES:
            def forward(d, i, mesh=mesh, batch=batch, mode=mode):
                return xgather.sharded.gather(d, i, mesh, "x", batch, **_options(mode))

            f = jax.jit(forward)
            g = jax.jit(jax.grad(lambda d, i, forward=forward: forward(d, i).sum()))
            if mode == "error":
                f, g = checked_program(f), checked_program(g)
            label = f"{kind.name} mesh, indices {batch or 'replicated'}, {mode}"
            out += [Program(label, f, structs), Program(f"grad, {label}", g, structs)]
    return out


@pytest.mark.parametrize("size", ["small", "gpu"])
@pytest.mark.parametrize("platform", ACCELERATORS)
def test_the_sharded_gather_stays_on_the_device(platform, size):
    d, i = ((8, 4), (5,)) if size == "small" else ((1 << 21, 128), (1 << 18,))  # W1
    with xgather.lowering(platform):
        assert_no_round_trips(sharded_programs((S(d, np.float32), S(i, np.int32))), platform)


# -- the bench's programs ---------------------------------------------------------------------

def bench_programs(w, size: str) -> list[tuple[str | None, Program]]:
    """``(element lowering, program)`` for each xgather system of the bench on workload
    ``w`` (``bench/systems.py``: ``xgather_runner``'s function, ``checked`` where it
    checks), with int32 indices, as the bench passes them without x64."""
    dshape, ishape = w.shapes(size)
    structs = (S(dshape, w.np_dtype()), S(ishape, np.int32))
    if w.step is not None:
        structs += (S(steps.weight_shape(w, dshape, ishape), np.float32),)
    systems_ = [("xgather", None, None, {}),
                ("xgather[promise]", None, "promise_in_bounds", dict(negative_indices=False)),
                # promise with negative indices wrapped: the accelerators' fused wrap
                ("xgather promise, negative indices on", None, "promise_in_bounds", {})]
    if systems.linear_applies(w, *structs[:2]):
        systems_.append((systems.LINEAR, "linear", "promise_in_bounds",
                         dict(negative_indices=False)))
    out = []
    for name, element, mode, kw in systems_:
        f = jax.jit(systems._xgather_fn(w, mode, **kw))
        if systems.checks(w, mode):
            f = checked_program(f)
        out.append((element, Program(f"{w.key} {size}: {name}", f, structs)))
    return out


def _distinct_workloads() -> list[str]:
    """The workloads whose programs differ (W9r and W9u are W9's program with other
    indices drawn; W9u-bf16 is W9r-bf16's)."""
    seen, keys = set(), []
    for key, w in sorted(WORKLOADS.items()):
        program = (w.op, tuple(w.sizes.items()), w.axis, w.batch_dims, w.dtype, w.step)
        if program not in seen:
            seen.add(program)
            keys.append(key)
    return keys


@pytest.mark.parametrize("platform", ACCELERATORS)
@pytest.mark.parametrize("key", _distinct_workloads())
def test_the_bench_programs_stay_on_the_device(key, platform):
    w = WORKLOADS[key]
    for size in ("tiny", "gpu") if w.shapes("gpu") != w.shapes("tiny") else ("tiny",):
        for element in (None, "linear"):
            with xgather.lowering(platform, element_gather=element):
                programs = [p for e, p in bench_programs(w, size) if e == element]
                if programs:
                    assert_no_round_trips(programs, platform)


def test_checkeds_own_programs_stay_on_the_device():
    """The stacking of a group of flags, read together on an accelerator, and the check of
    indices that other processes hold part of."""
    flags = (S((2,), np.int32),) * _checked.READ_GROUP
    for platform in ACCELERATORS:
        with xgather.lowering(platform):
            plan = xgather.explain(xgather.onnx.gather, S((1 << 21, 128), np.float32),
                                   S((1 << 18,), np.int32))
            assert_no_round_trips([
                Program("_heads", _checked._heads, flags),
                Program("_device_checker", _check._device_checker(plan).program,
                        (S((1 << 18,), np.int32),))], platform)


def test_an_export_holds_what_the_lowering_holds(x64):
    """``jax.export`` for one platform (a serialised program) holds the same findings as the
    lowering the tests read: none, with 32-bit and with 64-bit indices."""
    case = CASES[CASE_IDS.index("onnx.gather_elements")]
    for index in (np.int32, np.int64):
        structs = case.structs("large", index)
        for platform in ACCELERATORS:
            with xgather.lowering(platform):
                for p in op_programs(case, structs, modes=("error", "clip")):
                    exported = jax.export.export(p.fn, platforms=[RUNTIME[platform]])(
                        *p.structs).mlir_module()
                    found = round_trips(exported)
                    assert found == [], (platform, index, p.label, found)
                    assert round_trips(lowered(p.fn, p.structs, platform)) == []


# -- the negative controls: the check fails where a program branches --------------------------

@pytest.mark.parametrize("bits", [32, 64])
def test_the_cpu_choices_do_branch(bits):
    """At the GPU size, the CPU's choices put the wrap in a branch (a real one: its index is
    computed from the indices), and the check says so; with 64-bit indices too (their
    saturation adds no case of its own)."""
    case = CASES[CASE_IDS.index("onnx.gather_elements")]
    with jax.enable_x64(bits == 64):
        structs = case.structs("large", np.int64 if bits == 64 else np.int32)
        with xgather.lowering("cpu"):
            assert xgather.explain(case.op, *structs, *case.args).wrap_pass == "gather"
            clip = jax.jit(lambda d, i: case.op(d, i, *case.args, mode="clip"))
            text = lowered(clip, structs, "cpu")
            assert round_trips(text) == ["stablehlo.case"]  # the wrap's branch alone
            assert ("stablehlo.clamp" in text) == (bits == 64)  # saturate_64
            with pytest.raises(AssertionError, match=r"host round trips in 1 of 1 .*"
                                                     r"\['stablehlo\.case'\]"):
                assert_no_round_trips([Program("clip", clip, structs)], "cpu")


def test_the_detector_sees_branches_loops_and_callbacks():
    def f(x):
        y = jax.pure_callback(lambda a: a, S(x.shape, x.dtype), x)
        y = jax.lax.cond(x.sum() > 0, lambda: y, lambda: -y)
        return jax.lax.fori_loop(0, x.shape[0] + jnp.int32(x[0] > 0), lambda k, v: v * 2, y)

    structs = (S((4,), np.float32),)
    # lowered for this machine's backend (a callback lowers only there); its target's
    # name differs per backend (xla_ffi_python_cpu_callback, ..._gpu_callback)
    found = round_trips(jax.jit(f).trace(*structs).lower().as_text())
    assert "stablehlo.case" in found and "stablehlo.while" in found
    assert any(re.fullmatch(r"host callback \S*python\S*callback", f) for f in found), found
    # lowered for a GPU: on a machine without one, the callback cannot lower (a finding);
    # on a GPU machine it lowers, and the detector names it in the text
    try:
        text = lowered(jax.jit(f), structs, "gpu")
    except AssertionError as err:
        assert jax.default_backend() != "gpu"
        assert "a host callback in the program" in str(err)
    else:
        assert jax.default_backend() == "gpu"
        assert any(f.startswith("host callback ") for f in round_trips(text))


# -- the platform choice itself, and its values -----------------------------------------------

# (op, data shape, indices shape, the CPU's wrap_pass there, the NumPy loops)
LARGE = {
    "gather_elements": (xgather.onnx.gather_elements, (256, 256), (256, 256), "gather",
                        ref.gather_elements),
    "gather_nd": (xgather.onnx.gather_nd, (64, 64, 4), (8192, 2), "separate", ref.gather_nd),
}


@pytest.mark.parametrize("platform", ACCELERATORS)
@pytest.mark.parametrize("name", sorted(LARGE))
def test_accelerators_wrap_inside_the_gather_where_the_cpu_branches(name, platform):
    op, dshape, ishape, cpu_pass, _ = LARGE[name]
    structs = (S(dshape, np.float32), S(ishape, np.int32))
    with xgather.lowering("cpu"):
        cpu = xgather.explain(op, *structs)
    assert (cpu.wrap, cpu.wrap_pass) == ("by_size", cpu_pass)
    assert ("the cpu platform's wrap: fused for small gathers and wide slices, else a branch"
            in str(cpu))
    with xgather.lowering(platform):
        plan = xgather.explain(op, *structs)
    assert (plan.platform, plan.wrap, plan.wrap_pass) == (platform, "fused", "fused")
    assert (f"negative indices wrap (inside the gather; the {platform} platform's wrap: "
            "fused at every size, no branch)") in str(plan)


@pytest.mark.parametrize("platform", ACCELERATORS)
def test_the_cases_are_where_the_cpu_branches(platform):
    """The GPU sizes above are sizes where the CPU's choices take a branch (for the ops that
    wrap), so that the accelerators' ``"fused"`` is what keeps it out."""
    for case in CASES:
        structs = case.structs("large")
        with xgather.lowering("cpu"):
            cpu = xgather.explain(case.op, *structs, *case.args)
        with xgather.lowering(platform):
            plan = xgather.explain(case.op, *structs, *case.args)
        assert cpu.negative == plan.negative == (case.cpu_pass is not None), case.name
        if case.cpu_pass is not None:
            assert (cpu.wrap_pass, plan.wrap_pass) == (case.cpu_pass, "fused"), case.name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LARGE))
def test_the_gpu_choices_give_the_loops_values(name, mode):
    """At the sizes where the CPU branches, the GPU's fused wrap (run here: every choice is
    exact on every platform) gives the spec's values for negative indices, and for
    out-of-range ones in ``"clip"`` and ``"fill"``: eagerly (NumPy and device indices) and
    under ``jax.jit`` (``checked`` in ``"error"``)."""
    op, dshape, ishape, _, loops = LARGE[name]
    s = dshape[0]  # every index component addresses an axis of s
    rng = np.random.default_rng(11)
    data = rng.standard_normal(dshape).astype(np.float32)
    lo, hi = (-s, s) if mode in ("error", "promise_in_bounds") else (-s - 3, s + 3)
    idx = rng.integers(lo, hi, ishape).astype(np.int32)
    flat = idx.reshape(-1)
    flat[:2] = (-1, -s)  # in range, counted from the end
    if mode in ("clip", "fill"):
        flat[2:4] = (-s - 1, s)  # out of range on either side
    assert (idx < 0).any()
    oob = {"error": "error", "promise_in_bounds": "error"}.get(mode, mode)
    want = loops(data, idx, oob=oob, fill=FILL)
    with xgather.lowering("gpu"):
        assert xgather.explain(op, data, idx).wrap_pass == "fused"
        f = jax.jit(lambda d, i: op(d, i, **_options(mode)))
        if mode == "error":
            f = xgather.checked(f, sync=True)
        got = {"eager, NumPy indices": op(data, idx, **_options(mode)),
               "eager, device indices": op(data, jnp.asarray(idx), **_options(mode)),
               "jit": f(data, idx)}
    for how, value in got.items():
        value = np.asarray(value)
        assert (value.shape, value.dtype) == (want.shape, want.dtype), how
        np.testing.assert_array_equal(value, want, err_msg=how)


def test_lowering_refuses_an_unknown_wrap():
    with pytest.raises(xgather.XGatherError, match=r"wrap must be one of .*'bogus'"):
        with xgather.lowering(wrap="bogus"):
            pass
