"""Framework steps: ``xgather-bench frameworks``.

One small training step, written three ways as each framework's users write it: an
embedding gather (``xgather.onnx.gather`` of a table by int32 ids), a dense layer, a
mean-square loss and an SGD update.

* ``jax.jit``: ``step(params, ids, y) -> (params, loss)``, the parameters a dict of
  arrays;
* ``nnx.jit``: ``step(model, opt, ids, y) -> loss``, an ``nnx.Module`` of ``nnx.Param``\\ s
  and an ``nnx.Optimizer`` (``optax.sgd``), both updated in place;
* ``eqx.filter_jit``: ``step(model, ids, y) -> (model, loss)``, an ``eqx.Module``.

Each runs as ``xgather.checked(step, jit=J)`` with the op in its default mode (the check
inside the user's own jit) and as ``J(step)`` with the op in ``"promise_in_bounds"`` (no
check), in paired rounds: each sample :data:`PIPELINE` calls, then one wait, as a
training loop runs; the ratio is the median of the per-round ratios, with a limit of
:data:`RATIO_LIMIT`. A call's host time (until it returns, no wait for its result) is
timed for both; the checked call of arrays only (``jax.jit``'s) may take at most
:data:`HOST_LIMIT_US` more than the bare ``jax.jit`` call of the same step.
``eqx.filter_jit`` (equinox 0.13) waits for each call's program itself (it blocks on a
marker output to raise its own runtime errors): its calls are blocked ones, and its host
time is the step's.

Before any timing, :func:`differential` runs each pair 3 steps from the same start: the
parameters and losses are recorded as equal bit for bit, or not.
"""

from __future__ import annotations

import functools
import inspect
import json
import time

import numpy as np

from . import stats, systems

SCHEMA = "xgather-bench-frameworks/1"
#: Calls per pipelined sample, then one wait.
PIPELINE = 10
#: The most ``checked(step, jit=J)`` may take over ``J(step)`` in promise, pipelined.
RATIO_LIMIT = 1.05
#: The most host µs a checked call of arrays only may add to a bare ``jax.jit`` call.
HOST_LIMIT_US = 3.0
FRAMEWORKS = ("jax.jit", "nnx.jit", "eqx.filter_jit")
#: Where the host-time limit applies: the step of arrays only.
ARRAYS_ONLY = "jax.jit"
#: The hand-written check whose host time is timed beside that step's (:class:`LaxChecked`).
HAND = systems.LAX_CHECKED
#: ``vocab`` rows of ``dim`` in the table, ``batch`` ids, ``out`` outputs of the dense layer.
SIZES = {"tiny": {"vocab": 16, "dim": 4, "out": 3, "batch": 8},
         "quick": {"vocab": 512, "dim": 32, "out": 16, "batch": 256},
         "default": {"vocab": 20000, "dim": 128, "out": 64, "batch": 4096},
         "gpu": {"vocab": 1 << 20, "dim": 128, "out": 128, "batch": 1 << 16}}
LR = 0.01
PROMISE = "promise_in_bounds"


def arrays(size: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The step's start: ``table``, ``w``, ``b`` (float32), ``ids`` (int32) and ``y``."""
    s = SIZES[size]
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
    return {"table": normal(s["vocab"], s["dim"]),
            "w": normal(s["dim"], s["out"], scale=1 / np.sqrt(s["dim"])),
            "b": np.zeros(s["out"], np.float32),
            "ids": rng.integers(0, s["vocab"], s["batch"]).astype(np.int32),
            "y": normal(s["batch"], s["out"])}


def _predict(table, w, b, ids, mode):
    import xgather
    return xgather.onnx.gather(table, ids, 0, mode=mode) @ w + b[None, :]


def _loss(pred, y):
    import jax.numpy as jnp
    return jnp.mean((pred - y) ** 2)


def missing(name: str) -> str | None:
    """Why framework ``name`` cannot run here (its package not installed), else None."""
    import importlib.util
    need = {"jax.jit": (), "nnx.jit": ("flax", "optax"), "eqx.filter_jit": ("equinox",)}[name]
    gone = [p for p in need if importlib.util.find_spec(p) is None]
    return f"{', '.join(gone)} not installed" if gone else None


def checked_takes_jit() -> bool:
    """Whether ``xgather.checked`` takes ``jit=`` (the user's own jit)."""
    import xgather
    return "jit" in inspect.signature(xgather.checked).parameters


# -- the three steps --------------------------------------------------------------------------

class Framework:
    """One framework's step and what the bench does with it.

    ``step(mode)``: the step with the op in ``mode`` (None: the spec's default);
    ``jit``: the framework's jit; ``start(arrays, device)``: a fresh state;
    ``call(fn, state, ids, y) -> (state, loss)``: one call, not waited for;
    ``params(state)``: ``{name: array}``, the parameters.
    """

    name: str
    jit_fn: object

    def checked(self, fn):
        import xgather
        return xgather.checked(fn, jit=self.jit_fn)

    def compiled(self, mode):
        """``xgather.checked(step, jit=J)`` in the default mode, ``J(step)`` in any other."""
        step = self.step(mode)
        return self.checked(step) if mode is None else self.jit_fn(step)


class JaxJit(Framework):
    name = "jax.jit"

    @property
    def jit_fn(self):
        import jax
        return jax.jit

    def step(self, mode):
        import jax

        def step(params, ids, y):
            def loss_fn(p):
                return _loss(_predict(p["table"], p["w"], p["b"], ids, mode), y)
            loss, grads = jax.value_and_grad(loss_fn)(params)
            return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss
        return step

    def start(self, a, device):
        import jax
        return {k: jax.device_put(a[k], device) for k in ("table", "w", "b")}

    def call(self, fn, state, ids, y):
        return fn(state, ids, y)

    def params(self, state):
        return dict(state)


class LaxChecked(JaxJit):
    """The ``jax.jit`` step with the check an expert writes by hand (as the check bench's
    ``lax-checked``): the gather in promise, and ``jnp.any`` of the ids' range test as a
    third output, read at the next call (:class:`systems.OutOfRangeFlag` where it was
    set). Timed for its host time only, which holds that read's wait for the program
    before."""

    def compiled(self, mode=None):
        import jax
        import jax.numpy as jnp
        step = self.step(PROMISE)

        def checked_step(params, ids, y):
            rows = params["table"].shape[0]
            return step(params, ids, y), jnp.any((ids < -rows) | (ids >= rows))
        program = jax.jit(checked_step)
        flags = []

        def call(params, ids, y):
            if flags and bool(flags.pop()):  # the previous call's flag, as lax-checked
                raise systems.OutOfRangeFlag(f"{HAND} step: an id out of range in an "
                                             "earlier step")
            out, flag = program(params, ids, y)
            flags.append(flag)
            return out
        return call


@functools.cache
def _nnx_model():
    from flax import nnx

    class Model(nnx.Module):
        """An embedding table and a dense layer, each an ``nnx.Param``."""

        def __init__(self, table, w, b):
            self.table, self.w, self.b = nnx.Param(table), nnx.Param(w), nnx.Param(b)

        def __call__(self, ids, mode):
            return _predict(self.table[...], self.w[...], self.b[...], ids, mode)
    return Model


def nnx_optimizer(model, tx):
    """``nnx.Optimizer`` over the model's ``nnx.Param``\\ s: flax 0.11 made ``wrt=`` a
    required argument (before: optional, ``nnx.Param`` by default)."""
    from flax import nnx
    if "wrt" in inspect.signature(nnx.Optimizer.__init__).parameters:
        return nnx.Optimizer(model, tx, wrt=nnx.Param)
    return nnx.Optimizer(model, tx)


def nnx_update(opt, model, grads) -> None:
    """``opt.update``: ``(model, grads)`` since flax 0.11, ``(grads)`` before."""
    import flax.nnx as nnx
    if "model" in inspect.signature(nnx.Optimizer.update).parameters:
        opt.update(model, grads)
    else:
        opt.update(grads)


class NnxJit(Framework):
    name = "nnx.jit"

    @property
    def jit_fn(self):
        from flax import nnx
        return nnx.jit

    def step(self, mode):
        from flax import nnx

        def step(model, opt, ids, y):
            loss, grads = nnx.value_and_grad(lambda m: _loss(m(ids, mode), y))(model)
            nnx_update(opt, model, grads)
            return loss
        return step

    def start(self, a, device):
        import jax
        import optax
        model = _nnx_model()(*(jax.device_put(a[k], device) for k in ("table", "w", "b")))
        return model, nnx_optimizer(model, optax.sgd(LR))

    def call(self, fn, state, ids, y):
        return state, fn(*state, ids, y)

    def params(self, state):
        model = state[0]
        return {k: getattr(model, k)[...] for k in ("table", "w", "b")}


@functools.cache
def _eqx_model():
    import equinox as eqx
    import jax

    class Model(eqx.Module):
        """An embedding table and a dense layer, arrays as the module's fields."""

        table: jax.Array
        w: jax.Array
        b: jax.Array
    return Model


class EqxFilterJit(Framework):
    name = "eqx.filter_jit"

    @property
    def jit_fn(self):
        import equinox as eqx
        return eqx.filter_jit

    def step(self, mode):
        import equinox as eqx
        import jax

        def step(model, ids, y):
            def loss_fn(m):
                return _loss(_predict(m.table, m.w, m.b, ids, mode), y)
            loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
            return jax.tree.map(lambda p, g: p - LR * g, model, grads), loss
        return step

    def start(self, a, device):
        import jax
        return _eqx_model()(*(jax.device_put(a[k], device) for k in ("table", "w", "b")))

    def call(self, fn, state, ids, y):
        return fn(state, ids, y)

    def params(self, state):
        return {k: getattr(state, k) for k in ("table", "w", "b")}


def framework(name: str) -> Framework:
    return {"jax.jit": JaxJit, "nnx.jit": NnxJit, "eqx.filter_jit": EqxFilterJit}[name]()


# -- the runs ---------------------------------------------------------------------------------

class Loop:
    """A training loop of one compiled step from its own start: ``loop()`` one call (its
    loss, not waited for), ``loop.pipelined()`` :data:`PIPELINE` calls then one wait."""

    def __init__(self, fw: Framework, fn, a: dict, device):
        import jax
        self.fw, self.fn = fw, fn
        self.state = fw.start(a, device)
        self.ids, self.y = (jax.device_put(a[k], device) for k in ("ids", "y"))

    def __call__(self):
        self.state, loss = self.fw.call(self.fn, self.state, self.ids, self.y)
        return loss

    def pipelined(self):
        import jax
        loss = None
        for _ in range(PIPELINE):
            loss = self()
        return jax.block_until_ready((loss, self.fw.params(self.state)))


def differential(fw: Framework, a: dict, device, steps: int = 3):
    """``{"checked"|"promise": (losses, params)}`` after ``steps`` steps of each from the
    same start, as NumPy arrays (the checked one's flags read: a bad id raises)."""
    import xgather
    out = {}
    for name, mode in (("checked", None), ("promise", PROMISE)):
        loop = Loop(fw, fw.compiled(mode), a, device)
        losses = [np.asarray(loop()) for _ in range(steps)]
        out[name] = (losses, {k: np.asarray(v) for k, v in fw.params(loop.state).items()})
    xgather.raise_if_error()
    return out


def bitwise_equal(result: dict) -> bool:
    """Whether :func:`differential`'s two runs gave the same bits."""
    (lc, pc), (lp, pp) = result["checked"], result["promise"]
    return (all(np.array_equal(x, z) for x, z in zip(lc, lp, strict=True))
            and all(np.array_equal(pc[k], pp[k]) for k in pc))


def _host_times(loops: dict[str, Loop], calls: int) -> dict[str, float]:
    """Median host seconds of one call returning (no wait), per loop, over ``calls`` calls
    in rounds of :data:`PIPELINE`, each round then waited for."""
    import jax
    times: dict[str, list[float]] = {k: [] for k in loops}
    for _ in range(max(1, calls // PIPELINE)):
        for name, loop in loops.items():
            loss = None
            for _ in range(PIPELINE):
                t0 = time.perf_counter()
                loss = loop()
                times[name].append(time.perf_counter() - t0)
            jax.block_until_ready(loss)
    return {k: stats.median(v) for k, v in times.items()}


def run(size: str | None = None, device=None, timing=None, names=None,
        progress=print) -> dict:
    """Each framework's pair timed (:mod:`bench.frameworks`); ``names``: which (default
    :data:`FRAMEWORKS`); one not installed is recorded as skipped, with why."""
    import jax

    import xgather
    if not checked_takes_jit():
        raise SystemExit("xgather-bench frameworks: xgather.checked takes no jit= here (the "
                         "framework steps run as xgather.checked(step, jit=J))")
    device = device or jax.devices()[0]
    size = size or ("gpu" if device.platform == "gpu" else "default")
    timing = timing or {"sample_s": 0.02, "budget_s": 2.0, "least": 15, "most": 100}
    a = arrays(size)
    results = []
    for n, name in enumerate(names or FRAMEWORKS, 1):
        t_start = time.perf_counter()
        why = missing(name)
        if why:
            results.append({"framework": name, "skipped": why})
            progress(f"[{n}] {name}: skipped, {why}")
            continue
        fw = framework(name)
        same = bitwise_equal(differential(fw, arrays("tiny"), device)) and bitwise_equal(
            differential(fw, a, device))
        loops = {"checked": Loop(fw, fw.compiled(None), a, device),
                 "promise": Loop(fw, fw.compiled(PROMISE), a, device)}
        fns = {k: loop.pipelined for k, loop in loops.items()}
        for f in fns.values():
            f()
        reps = stats.common_reps(fns, "promise", timing["sample_s"])
        samples = stats.timed_rounds(fns, reps, timing["least"], timing["budget_s"],
                                     timing["most"])
        if name == ARRAYS_ONLY:  # the hand-written check's host time beside them
            loops[HAND] = Loop(fw, LaxChecked().compiled(), a, device)
        host = _host_times(loops, 20 * PIPELINE)
        xgather.raise_if_error()  # every flag read: no id was out of range
        per_call = {k: [s / PIPELINE for s in v] for k, v in samples.items()}
        ratio = stats.paired_ratio(samples["checked"], samples["promise"])
        extra_us = (host["checked"] - host["promise"]) * 1e6
        results.append({
            "framework": name, "bitwise_equal": same, "reps": reps,
            "rounds": len(samples["promise"]), "samples_s": per_call,
            "median_s": {k: stats.median(v) for k, v in per_call.items()},
            "ratio": ratio, "spread": stats.paired_spread(samples["checked"],
                                                          samples["promise"]),
            "over": ratio > RATIO_LIMIT, "host_call_s": host, "host_extra_us": extra_us,
            "host_over": name == ARRAYS_ONLY and extra_us > HOST_LIMIT_US})
        if HAND in host:
            results[-1]["host_hand_extra_us"] = (host[HAND] - host["promise"]) * 1e6
        del loops, fns
        progress(f"[{n}] {name}: {results[-1]['rounds']} rounds, "
                 f"{time.perf_counter() - t_start:.1f} s")
    return {"size": size, "shapes": SIZES[size], "pipeline": PIPELINE, "rounds": timing,
            "limits": {"ratio": RATIO_LIMIT, "host_extra_us": HOST_LIMIT_US,
                       "host_limit_applies_to": ARRAYS_ONLY},
            "results": results}


def table(record: dict) -> str:
    s, lim = record["shapes"], record["limits"]
    lines = [f"framework steps: {record['device'].get('kind', record['device'])}, size "
             f"{record['size']} (table {s['vocab']} x {s['dim']}, {s['batch']} int32 ids, "
             f"dense {s['dim']} -> {s['out']}, mean-square loss, SGD); pipelined = "
             f"{record['pipeline']} calls then one wait",
             "ratio: xgather.checked(step, jit=J), default mode, over J(step), promise: the "
             f"median of per-round ratios, limit {lim['ratio']:.2f}; host us: a call until "
             f"it returns, checked's extra limited to +{lim['host_extra_us']:.0f} us for "
             f"{lim['host_limit_applies_to']} (arrays only)",
             f"{'framework':<16} {'promise us':>10} {'checked/J':>9} {'':4} {'spread':>6} "
             f"{'host us: J':>10} {'checked':>8} {'+us':>6} {'':4} {'bitwise':>7}"]
    for r in record["results"]:
        if "skipped" in r:
            lines.append(f"{r['framework']:<16} skipped: {r['skipped']}")
            continue
        host = r["host_call_s"]
        lines.append(
            f"{r['framework']:<16} {r['median_s']['promise'] * 1e6:10.1f} {r['ratio']:9.3f} "
            f"{'over' if r['over'] else '':4} {100 * r['spread']:5.1f}% "
            f"{host['promise'] * 1e6:10.1f} {host['checked'] * 1e6:8.1f} "
            f"{r['host_extra_us']:+6.1f} {'over' if r['host_over'] else '':4} "
            f"{'same' if r['bitwise_equal'] else 'DIFFER':>7}")
    for r in record["results"]:
        if "host_hand_extra_us" in r:
            lines.append(f"{r['framework']} with the check written by hand ({HAND}: its flag "
                         "a third output, read at the next call): host us "
                         f"{r['host_call_s'][HAND] * 1e6:.1f}, "
                         f"{r['host_hand_extra_us']:+.1f} over J")
    lines.append("bitwise: 3 steps of each from the same start, the parameters and losses "
                 "the same bits (same) or not (DIFFER)")
    return "\n".join(lines)


def save(record: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
