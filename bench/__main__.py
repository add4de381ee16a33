"""``xgather-bench``: run the workload table on the default JAX device beside the peers.

Usage::

    xgather-bench [--quick | --large | --size gpu] [--workloads W1,W3]
                  [--systems xgather,lax,jnp.take,torch] [--device cpu|gpu] [--repeats N]
                  [--allocator keep|default|both] [--json run.json]
    xgather-bench compare A.json B.json
    xgather-bench plot RECORD.json --out ratios.png
    xgather-bench pages [--check] [--root .]
    xgather-bench sharded [--devices 8] [--quick]
    xgather-bench eager [--repeats 25] [--calls 200] [--json eager.json]
    xgather-bench crowding [--repeats 40] [--peers onnxruntime,openvino] [--json c.json]
    xgather-bench check [--workloads W1,M1] [--device gpu] [--quick] [--json check.json]
    xgather-bench readers [--workloads W1,M1] [--device gpu] [--quick] [--json readers.json]
    xgather-bench frameworks [--frameworks jax.jit,nnx.jit,eqx.filter_jit] [--device gpu]
                             [--quick] [--repeats N] [--json frameworks.json]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from . import record as rec
from . import roof, stats, systems
from .workloads import SIZES, WORKLOADS, default_keys, default_size

# How long one sample lasts (calls per sample set by lax), about how long a JAX system's
# samples take in all (a peer's: half that), and the least and most rounds: as many
# rounds as fit the budget. 15 rounds of 0.06 s left W6's paired ratio anywhere in
# 0.74-1.10 from run to run, 150 of 0.02 s in 1.04-1.08 (docs/benchmark.md).
TIMING = {"sample_s": 0.02, "budget_s": 2.0, "least": 15, "most": 100}
QUICK = {"sample_s": 0.003, "budget_s": 0.1, "least": 7, "most": 30}
#: Each process of ``--allocator both`` (the CPU's default): a quarter of the budget and at
#: least 5 rounds, so that both settings together take about as long as one did with
#: TIMING (8-10 minutes on 2 cores; docs/benchmark.md). ``--repeats`` overrides it.
BOTH = {**TIMING, "budget_s": TIMING["budget_s"] / 4, "least": 5}
#: Calls per pipelined sample of the check cost, then one wait (as a training loop runs).
PIPELINE = 10
#: First calls timed per JAX system and workload (each after JAX's caches are emptied).
FIRST_CALLS = 3


class _Progress:
    """Progress on stderr: rewritten in place on a terminal, one line per step in a log.

    ``note`` is a passing state (a first call, a round), shown only on a terminal;
    ``done`` ends a step (a workload) and is the one line a log gets for it.
    """

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def note(self, msg: str) -> None:
        if self.tty:
            print(f"{msg:<100}", end="\r", file=self.stream, flush=True)

    def done(self, msg: str) -> None:
        print(f"{msg:<100}" if self.tty else msg, end="\r" if self.tty else "\n",
              file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            print(" " * 100, end="\r", file=self.stream, flush=True)


_PACKAGES = ("xgather", "jax", "jaxlib", "ml_dtypes", "numpy", "onnxruntime", "openvino",
             "torch", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
             "jax-cuda13-pjrt", "cupy", "cupy-cuda12x", "cupy-cuda13x")


#: How to add a peer that is not installed, from the clone. torch is an extra of its
#: own: on Python 3.12 and later pip would take a CUDA build of several GB.
_INSTALL = {
    None: "pip install -e '.[bench]' in the clone",
    "torch": "pip install -e '.[torch]' in the clone; on a machine without a GPU, take "
             "the CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu",
}


def _versions(gpu: bool) -> dict:
    """Python's and the installed packages' versions; on a GPU, torch's CUDA too."""
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    if gpu and "torch" in sys.modules:
        out["torch.version.cuda"] = sys.modules["torch"].version.cuda
    return out


def _device_info(device, gpu_ok: dict) -> dict:
    """What the record says about the device: kind, backend, memory, runtime version."""
    import jax
    stats_ = device.memory_stats() or {}  # None on CPU
    info = {"kind": device.device_kind, "platform": device.platform,
            "backend": jax.default_backend(), "cores": systems.cores(),
            "machine": platform.machine(), "memory_bytes": stats_.get("bytes_limit"),
            "platform_version": getattr(getattr(device, "client", None), "platform_version",
                                        None)}
    if gpu_ok.get("torch-cuda"):
        import torch
        info["gpu_name"] = torch.cuda.get_device_name()
    return info


def _gpu_requested(args) -> bool:
    """Whether JAX will run on a GPU: ``--device gpu``, JAX_PLATFORMS naming cuda or rocm
    first, or neither and a GPU plugin that JAX would pick (:func:`_expected_platform`;
    JAX_PLATFORMS=cpu on a machine with the CUDA plugin runs on the CPU)."""
    return _expected_platform(args.device) == "gpu"


def _no_fork() -> None:
    """Start any ``multiprocessing`` child by spawning a fresh interpreter, not by fork.

    ``import openvino`` sends a telemetry event (``openvino_telemetry``) from a
    ``multiprocessing.Process``; under Linux's default start method that forks this
    process, which by then runs JAX's threads (and JAX warns: a fork of a
    multithreaded process can deadlock). A spawned child shares no state, so
    there is nothing to warn about. Only the default is set, and only where no one
    chose one: the bench itself starts its children with ``subprocess``.
    """
    import multiprocessing
    if multiprocessing.get_start_method(allow_none=True) is None:
        multiprocessing.set_start_method("spawn")


def _expected_platform(device: str | None) -> str:
    """The platform the run will use, known before JAX starts its backends."""
    import importlib.util
    named = device or os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip()
    if named:
        return "gpu" if named in ("cuda", "rocm") else named
    plugins = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_rocm60_plugin", "libtpu")
    return "gpu" if any(importlib.util.find_spec(p) for p in plugins[:3]) else \
        "tpu" if importlib.util.find_spec(plugins[3]) else "cpu"


def _set_cpu_dispatch(how: str) -> None:
    """``"inline"``: XLA's CPU client runs every program on the calling thread (JAX's
    ``jax_cpu_enable_async_dispatch=False``, read when the client starts); ``"async"``
    (JAX's default): only those under 1000 flops, any other on its worker threads."""
    import jax

    from . import _alloc as alloc
    if how == "inline":
        if alloc._backends_started():
            raise SystemExit("xgather-bench: --cpu-dispatch inline must be set before JAX "
                             "starts its CPU client; it has started in this process")
        jax.config.update("jax_cpu_enable_async_dispatch", False)


def _cpu_dispatch() -> str:
    """What the CPU client was started with (JAX's flag, read back)."""
    import jax
    return "async" if jax.config.read("jax_cpu_enable_async_dispatch") else "inline"


def run(args) -> dict:
    # OpenMP pools (torch) sleep when idle rather than spin into the next system's time.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if _gpu_requested(args):
        # JAX would take 75% of the GPU's memory at start, leaving torch and CuPy
        # too little for a 1 GiB table each.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    _no_fork()
    peers = systems.available()
    chosen = set(args.systems.split(",")) if args.systems else None
    import jax

    from . import _alloc as alloc
    if args.allocator is None:  # malloc's large blocks matter where XLA allocates with it
        args.allocator = "keep" if _expected_platform(args.device) == "cpu" else "default"
    if args.allocator == "keep":
        alloc.keep_large_allocations()
    # Imported after the allocator is set (their threads then share its one arena) and
    # before JAX starts, so that what an import starts (openvino's telemetry
    # child) is under way before anything is timed.
    systems.import_peers(peers, chosen)
    _set_cpu_dispatch(args.cpu_dispatch)
    try:
        device = jax.devices(args.device)[0] if args.device else jax.devices()[0]
    except RuntimeError as e:  # e.g. --device gpu where JAX has no GPU backend
        raise SystemExit(f"xgather-bench: no {args.device} device for JAX: {e}") from None
    gpu = device.platform == "gpu"
    size = args.size or ("quick" if args.quick else "large" if args.large
                         else default_size(device.platform))
    for name, ok in peers.items():
        if not ok:
            print(f"skipping {name}: not installed ({_INSTALL.get(name, _INSTALL[None])})",
                  file=sys.stderr)
    gpu_ok = {}
    if gpu:
        for name, reason in systems.gpu_peers().items():
            gpu_ok[name] = reason is None
            if reason and (chosen is None or name in chosen):
                print(f"skipping {name}: {reason}", file=sys.stderr)
        if chosen is None:
            print("host peers (numpy, onnxruntime, openvino, torch on the CPU) run on a GPU "
                  "only where --systems names them", file=sys.stderr)
    else:
        for name in sorted(set(chosen or ()) & set(systems.GPU_PEERS)):
            print(f"skipping {name}: JAX runs on {device.platform}, and the GPU peers run "
                  "only beside a GPU", file=sys.stderr)
    keys = args.workloads.split(",") if args.workloads else default_keys(device.platform)
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    roof_bytes = {"quick": 64, "gpu": 1024}.get(size, 256) << 20
    progress = _Progress()
    progress.done("measuring the copy roof")
    device_roofs = {f"jax copy ({device.platform})": roof.jax_copy_gbps(device, roof_bytes)}
    if gpu_ok.get("torch-cuda"):
        device_roofs["torch copy_ (cuda)"] = roof.torch_cuda_copy_gbps(roof_bytes)
    if gpu_ok.get("cupy"):
        device_roofs["cupy copyto (cuda)"] = roof.cupy_copy_gbps(roof_bytes)
    host_bytes = min(roof_bytes, 256 << 20)
    host_roofs = {"numpy copy 1t": roof.numpy_copy_gbps(host_bytes, 1)}
    if systems.cores() > 1:
        host_roofs[f"numpy copy {systems.cores()}t"] = roof.numpy_copy_gbps(
            host_bytes, systems.cores())
    roofs = {**device_roofs, **host_roofs}
    roof_of = roof.basis(device_roofs, host_roofs, device.platform)
    progress.done(rec.roof_line(roofs, roof_of))  # each library's copy, and which %roof uses
    on_device = (*systems.JAX_SYSTEMS, *systems.GPU_PEERS)
    timing = dict(QUICK if args.quick else BOTH if args.timing == "both" else TIMING)
    if args.repeats:  # rounds asked for: exactly that many
        timing.update(least=args.repeats, most=args.repeats)
    rounds = {k: timing[k] for k in ("least", "budget_s", "most")}

    def budget_of(library: str) -> float:  # the peers' figures need less precision
        return timing["budget_s"] * (1.0 if library == "jax" else 0.5)
    results = []
    shapes = {}
    for n, key in enumerate(keys, 1):
        w = WORKLOADS[key]
        t_workload = time.perf_counter()
        data, idx = w.arrays(size)
        shapes[key] = {"data": list(data.shape), "indices": list(idx.shape),
                       "dtype": w.dtype, "indices_drawn": w.indices}
        fns = systems.build(w, data, idx, device, {**peers, **gpu_ok}, chosen)
        if not fns:
            progress.done(f"[{n}/{len(keys)}] {key} {w.title}: skipped, no chosen system "
                          "runs it")
            continue
        # Each JAX system runs once at other shapes first, so that what a process pays
        # once (imports, first traces of a code path) is not charged to whichever
        # system's first call comes first: first calls then compare per-shape costs.
        warm_chosen = {n for n in (chosen or {"xgather", "lax", systems.JNP})
                       if systems.library(n) == "jax"}
        for fn in systems.build(w, *w.warmup_arrays(size), device, {}, warm_chosen).values():
            fn()
        prefix = f"[{n}/{len(keys)}] {key} {w.title}: "  # of every progress line

        def before_first(name, prefix=prefix):
            progress.note(f"{prefix}first call of {name}")
            # What earlier work left to collect is not charged to this first call: a
            # full collection (40-55 ms here) otherwise lands inside whichever trace
            # crosses the threshold.
            gc.collect()
        first_samples = stats.first_calls(
            fns, {k for k in fns if systems.library(k) == "jax"}, FIRST_CALLS,
            jax.clear_caches, before_first)
        first = {k: stats.median(v) for k, v in first_samples.items()}
        ref_system = "lax" if "lax" in fns else next(iter(fns))
        reps = stats.common_reps(fns, ref_system, timing["sample_s"])

        def rounds_note(what, prefix=prefix):
            return lambda r: progress.note(f"{prefix}{what} {r}")

        # Each library's systems in a block of their own: a figure does not depend on which
        # other libraries share the run (their threads and allocations between two samples
        # of a round slowed the checked program most; see docs/benchmark.md).
        samples = stats.by_library(
            fns, reps, systems.library, **{**rounds, "budget_s": budget_of},
            on_block=lambda n, total, p=prefix: progress.note(f"{p}library {n}/{total}"))
        pair = (rec.DEFAULT, rec.PROMISE)
        check_samples, pipelined_samples = {}, {}
        if set(pair) <= set(fns):
            # The check cost: the pair alone, in interleaved rounds, so that noise that
            # hits a round hits both and cancels in the per-round ratio.
            check_samples = stats.timed_rounds({k: fns[k] for k in pair}, reps, **rounds,
                                               on_round=rounds_note("check-cost round"))
            # ... and pipelined: PIPELINE calls, then one wait, as a training loop runs.
            piped = {k: (lambda f=fns[k]: f.pipelined(PIPELINE)) for k in pair}
            piped_reps = {k: max(1, reps[k] // PIPELINE) for k in pair}
            pipelined_samples = {
                k: [s / PIPELINE for s in v] for k, v in stats.timed_rounds(
                    piped, piped_reps, **rounds,
                    on_round=rounds_note("pipelined check-cost round")).items()}
        wrap_piped = {}
        wrapped = [k for k in fns if hasattr(fns[k], "lowering")]
        if wrapped:
            # The wraps pipelined too (PIPELINE calls, one wait), beside promise where it
            # runs: a branch whose predicate the host reads makes it wait mid-program.
            names = ([rec.PROMISE] if rec.PROMISE in fns else []) + wrapped
            wrap_piped = {k: [s / PIPELINE for s in v] for k, v in stats.timed_rounds(
                {k: (lambda f=fns[k]: f.pipelined(PIPELINE)) for k in names},
                {k: max(1, reps[k] // PIPELINE) for k in names}, **rounds,
                on_round=rounds_note("pipelined wrap round")).items()}
        medians = {k: stats.median(v) for k, v in samples.items()}
        best = stats.ratios_to_best(medians)
        for name in fns:
            # JAX reads int32 indices without x64 (jax_inputs); the peers read int64 ones
            jax32 = systems.library(name) == "jax" and not jax.config.jax_enable_x64
            gbps = w.moved_bytes(size, 4 if jax32 else 8) / medians[name] / 1e9
            r_roof = roof_of["device" if name.startswith(on_device) else "host"]
            results.append({"workload": key, "title": w.title, "system": name,
                            "step": w.step,
                            "samples_s": samples[name], "median_s": medians[name],
                            "spread": stats.spread(samples[name]),
                            "p90_s": stats.p90(samples[name]), "gbps": gbps,
                            "pct_roof": 100 * gbps / roofs[r_roof], "pct_roof_of": r_roof,
                            "ratio_to_best": best[name],
                            "first_call_s": first[name],
                            "first_call_samples_s": first_samples[name], "reps": reps[name],
                            "allocator": args.allocator,
                            # what the program holds, where the system says (the wraps')
                            **({"lowering": fns[name].lowering}
                               if hasattr(fns[name], "lowering") else {}),
                            **({"wrap_pipelined_samples_s": wrap_piped[name]}
                               if name in wrap_piped else {}),
                            **({"check_samples_s": check_samples[name],
                                "pipelined_samples_s": pipelined_samples[name]}
                               if name in check_samples else {})})
        del fns, data, idx  # a GPU's memory holds one workload's copies at a time
        progress.done(f"{prefix}{len(set(samples))} systems, "
                      f"{min(map(len, samples.values()))}-{max(map(len, samples.values()))} "
                      f"rounds, {time.perf_counter() - t_workload:.1f} s")
    progress.close()
    return {
        "schema": rec.SCHEMA,
        "date": _now(),
        "size": size,
        "device": _device_info(device, gpu_ok),
        "roof": roofs,
        "pct_roof_of": roof_of,
        "versions": _versions(gpu),
        "environment": {k: v for k, v in os.environ.items()
                        if k.startswith(("XLA_", "JAX_", "OMP_", "MKL_", "XGATHER_"))},
        "allocator": alloc.allocator_settings(),
        "x64": bool(jax.config.jax_enable_x64),
        "cpu_dispatch": _cpu_dispatch(),
        "first_call": f"the median of {FIRST_CALLS} for JAX's systems, each after "
                      "jax.clear_caches() and gc.collect(), in an order rotated each "
                      "time; after one call of each JAX system at other shapes",
        "samples": "each library's systems in a block of their own (JAX: xgather's modes, "
                   "lax and jnp.take), two untimed rounds, then shuffled rounds of that library "
                   "alone, as many as fit the budget; the check cost from interleaved "
                   "rounds of the default and promise alone, the same way, blocked (each "
                   f"call waits) and pipelined ({PIPELINE} calls, then one wait)",
        "rounds": timing,
        "workloads": shapes,
        "results": results,
        "check_cost": rec.check_costs(results),
    }


def _run_both(args, argv) -> dict:
    """Each allocator setting in its own process; one merged record. Without ``--repeats``
    or ``--quick``, each process takes :data:`BOTH`'s rounds."""
    merged = None
    timing = [] if args.repeats or args.quick else ["--timing", "both"]
    for n, setting in enumerate(("default", "keep"), 1):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "run.json")
            child, skip = [], False
            for a in argv:  # drop "--allocator X", "--json X" (and their "=X" forms)
                if skip or a.startswith(("--allocator", "--json", "--timing")):
                    skip = a in ("--allocator", "--json", "--timing")
                    continue
                child.append(a)
            cmd = [sys.executable, "-m", __package__, *child, "--allocator", setting, "--json", out,
                   "--no-table", *timing]
            print(f"allocator {setting} ({n}/2): glibc "
                  f"{'as it comes' if setting == 'default' else 'keeps large blocks'}, "
                  "in a process of its own", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
            r = rec.load(out)
        for res in r["results"]:
            res["system"] += f" @{setting}"
            res["pct_roof_of"] += f" @{setting}"
        roofs = {f"{k} @{setting}": v for k, v in r["roof"].items()}  # each row's own
        roof_of = {f"{k} @{setting}": f"{v} @{setting}" for k, v in r["pct_roof_of"].items()}
        if merged is None:
            merged = r
            merged["allocator"] = {"both": True, setting: r["allocator"]}
            merged["roof"], merged["pct_roof_of"] = roofs, roof_of
        else:
            merged["results"] += r["results"]
            merged["allocator"][setting] = r["allocator"]
            merged["roof"].update(roofs)
            merged["pct_roof_of"].update(roof_of)
    by_w = {}
    for res in merged["results"]:
        by_w.setdefault(res["workload"], []).append(res)
    for group in by_w.values():
        best = min(r["median_s"] for r in group)
        for r in group:
            r["ratio_to_best"] = r["median_s"] / best
    merged["results"] = [r for g in by_w.values() for r in g]
    merged["check_cost"] = rec.check_costs(merged["results"])  # pairs within each setting
    return merged


def _rounds(text: str) -> int:
    n = int(text)
    if n < 2:
        raise argparse.ArgumentTypeError(f"needs 2 or more rounds for a median and a spread; "
                                         f"got {n}")
    return n


def _check_json_folder(parser, path: str | None) -> None:
    """A ``--json`` path in no writable folder: found out now, not after a long run."""
    if path:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"--json {path}: no writable folder {folder}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _report(module, fields: dict, path: str | None) -> int:
    """A side command's record (``module``: eager, crowding): its schema, the date, the
    device and versions, then ``fields``; its table printed, the record written to
    ``path`` where one is named."""
    import jax
    record = {"schema": module.SCHEMA, "date": _now(),
              "device": _device_info(jax.devices()[0], {}), "versions": _versions(False),
              **fields}
    print(module.table(record))
    if path:
        module.save(record, path)
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _load(parser, path: str) -> dict:
    """A record, or the parser's one-line error (exit code 2) naming the file and why."""
    try:
        return rec.load(path)
    except OSError as e:
        parser.error(f"cannot read {path}: {e.strerror or e}")
    except ValueError as e:  # json.JSONDecodeError too
        parser.error(f"{path} is not an xgather-bench record: {e}")


def _side_options(p) -> None:
    """The options every timing side command (``check``, ``readers``, ``frameworks``)
    takes: ``--device``, ``--quick``, ``--repeats`` and ``--json``."""
    p.add_argument("--device", help="JAX platform to run on (default: JAX's)")
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    p.add_argument("--repeats", type=_rounds, default=None, help="exactly this many rounds")
    p.add_argument("--json", help="write the run as a JSON record")


def _side_run_start(p, a):
    """What a side command that times workloads (``check``, ``readers``) does first: its
    ``--json`` folder and ``--workloads`` checked (``(keys, the allocator module)``), and
    on a CPU the main job's allocator setting, before JAX starts."""
    _check_json_folder(p, a.json)
    keys = a.workloads.split(",") if a.workloads else None
    unknown = sorted(set(keys or ()) - set(WORKLOADS))
    if unknown:
        p.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    from . import _alloc as alloc
    if _expected_platform(a.device) == "cpu" and not alloc._backends_started():
        alloc.keep_large_allocations()  # before JAX starts, as in the main job
    return keys, alloc


def _side_device_and_timing(a):
    """A timing side command's device (``--device``, else JAX's first) and its timing
    (``--quick``, ``--repeats``); JAX starts here, after ``_side_run_start``."""
    import jax
    try:
        device = jax.devices(a.device)[0] if a.device else jax.devices()[0]
    except RuntimeError as e:
        raise SystemExit(f"xgather-bench: no {a.device} device for JAX: {e}") from None
    timing = dict(QUICK if a.quick else TIMING)
    if a.repeats:
        timing.update(least=a.repeats, most=a.repeats)
    return device, timing


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        p = argparse.ArgumentParser(prog="xgather-bench compare")
        p.add_argument("a")
        p.add_argument("b")
        a = p.parse_args(argv[1:])
        print(rec.compare(_load(p, a.a), _load(p, a.b)))
        return 0
    if argv[:1] == ["sharded"]:
        p = argparse.ArgumentParser(prog="xgather-bench sharded")
        p.add_argument("--devices", type=int, default=8)
        p.add_argument("--quick", action="store_true")
        p.add_argument("--platform", default="cpu",
                       help="cpu (the default): that many fake host devices; another platform "
                            "(gpu, tpu): its own devices")
        a = p.parse_args(argv[1:])
        rows = 8192 if a.quick else 65536
        if a.devices < 1 or rows % a.devices:
            p.error(f"--devices must divide the table's {rows} rows (1, 2, 4, 8, ...); "
                    f"got {a.devices}")
        if "jax" not in sys.modules:  # the platform and device count precede JAX's start
            os.environ["JAX_PLATFORMS"] = a.platform  # also where it says cuda (.ci/gpu)
            if a.platform == "cpu":
                flags = os.environ.get("XLA_FLAGS", "")
                os.environ["XLA_FLAGS"] = (
                    f"{flags} --xla_force_host_platform_device_count={a.devices}").strip()
        from . import sharded
        kw = dict(rows=8192, width=64, lookups=2048, repeats=5) if a.quick else {}
        print(sharded.run(a.devices, **kw))
        return 0
    if argv[:1] == ["eager"]:
        p = argparse.ArgumentParser(
            prog="xgather-bench eager", description="every op called eagerly at W8's shapes, "
            "both modes, on device and NumPy indices, against jnp.take")
        p.add_argument("--repeats", type=_rounds, default=25, help="shuffled rounds (default 25)")
        p.add_argument("--calls", type=int, default=200, help="calls per sample (default 200)")
        p.add_argument("--json", help="write the run as a JSON record")
        a = p.parse_args(argv[1:])
        if a.calls < 1:
            p.error(f"--calls must be 1 or more; got {a.calls}")
        _check_json_folder(p, a.json)

        from . import eager
        return _report(eager, eager.run(a.repeats, a.calls), a.json)
    if argv[:1] == ["crowding"]:
        p = argparse.ArgumentParser(
            prog="xgather-bench crowding", description="W1 beside one peer library at a "
            "time: the checked default, promise, lax and a plain JAX flag + gather")
        p.add_argument("--repeats", type=_rounds, default=40, help="shuffled rounds "
                       "(default 40)")
        p.add_argument("--peers", help="comma-separated: numpy, onnxruntime, openvino, "
                       "torch (default: all installed)")
        p.add_argument("--quick", action="store_true", help="small sizes")
        p.add_argument("--cpu-dispatch", choices=("async", "inline"), default="async",
                       help="as for the main job")
        p.add_argument("--json", help="write the run as a JSON record")
        a = p.parse_args(argv[1:])
        _check_json_folder(p, a.json)
        from . import crowding
        peers = tuple(a.peers.split(",")) if a.peers else None
        unknown = sorted(set(peers or ()) - set(crowding.PEERS))
        if unknown:
            p.error(f"unknown peers {unknown}; choose from {', '.join(crowding.PEERS)}")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as in the main job
        _no_fork()

        from . import _alloc as alloc
        if _expected_platform(None) == "cpu" and not alloc._backends_started():
            alloc.keep_large_allocations()  # before JAX starts, as in the main job
        _set_cpu_dispatch(a.cpu_dispatch)
        run_ = crowding.run(a.repeats, peers, "quick" if a.quick else "default")
        return _report(crowding, {"cpu_dispatch": _cpu_dispatch(), **run_}, a.json)
    if argv[:1] == ["check"]:
        p = argparse.ArgumentParser(
            prog="xgather-bench check", description="what the spec's default check costs: "
            "promise, the deferred default and sync=True, blocked and pipelined, first calls "
            "and a call's host time")
        p.add_argument("--workloads", help="comma-separated keys (default: the main job's)")
        _side_options(p)
        p.add_argument("--cpu-dispatch", choices=("async", "inline"), default="async",
                       help="as for the main job")
        a = p.parse_args(argv[1:])
        keys, alloc = _side_run_start(p, a)
        _set_cpu_dispatch(a.cpu_dispatch)
        from . import check
        device, timing = _side_device_and_timing(a)
        run_ = check.run(keys, "quick" if a.quick else None, device, timing,
                         lambda msg: print(msg, file=sys.stderr))
        return _report(check, {"cpu_dispatch": _cpu_dispatch(),
                               "allocator": alloc.allocator_settings(), **run_}, a.json)
    if argv[:1] == ["readers"]:
        from . import readers
        p = argparse.ArgumentParser(
            prog="xgather-bench readers", description="how xgather.checked reads an "
            "accelerator's flags: per-flag reads (READ_GROUP 1), groups of 8, and promise "
            "(no check), pipelined, and a call's host time")
        p.add_argument("--workloads", help="comma-separated keys (default: "
                       f"{','.join(readers.DEFAULT_KEYS)})")
        _side_options(p)
        a = p.parse_args(argv[1:])
        keys, alloc = _side_run_start(p, a)
        device, timing = _side_device_and_timing(a)
        run_ = readers.run(keys, "quick" if a.quick else None, device, timing,
                           lambda msg: print(msg, file=sys.stderr))
        return _report(readers, {"allocator": alloc.allocator_settings(), **run_}, a.json)
    if argv[:1] == ["frameworks"]:
        from . import frameworks
        p = argparse.ArgumentParser(
            prog="xgather-bench frameworks", description="a training step (an embedding "
            "gather, a dense layer, a mean-square loss, SGD) in jax.jit, flax's nnx.jit and "
            "equinox's filter_jit: xgather.checked(step, jit=J) in the default mode against "
            "J(step) in promise, pipelined in paired rounds, and a call's host time")
        p.add_argument("--frameworks", help="comma-separated (default: "
                       f"{','.join(frameworks.FRAMEWORKS)})")
        _side_options(p)
        a = p.parse_args(argv[1:])
        _check_json_folder(p, a.json)
        names = a.frameworks.split(",") if a.frameworks else None
        unknown = sorted(set(names or ()) - set(frameworks.FRAMEWORKS))
        if unknown:
            p.error(f"unknown frameworks {unknown}; choose from "
                    f"{', '.join(frameworks.FRAMEWORKS)}")
        from . import _alloc as alloc
        if _expected_platform(a.device) == "cpu" and not alloc._backends_started():
            alloc.keep_large_allocations()  # before JAX starts, as in the main job
        device, timing = _side_device_and_timing(a)
        run_ = frameworks.run("quick" if a.quick else None, device, timing, names,
                              lambda msg: print(msg, file=sys.stderr))
        return _report(frameworks, {"allocator": alloc.allocator_settings(), **run_}, a.json)
    if argv[:1] == ["pages"]:
        from . import pages
        p = argparse.ArgumentParser(prog="xgather-bench pages",
                                    description="the docs' marked tables, from the records")
        p.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
        p.add_argument("--root", default=".", help="the clone (README.md and docs/)")
        a = p.parse_args(argv[1:])
        stale = pages.main(pathlib.Path(a.root), a.check)
        return 1 if stale and a.check else 0
    if argv[:1] == ["plot"]:
        p = argparse.ArgumentParser(prog="xgather-bench plot")
        p.add_argument("record")
        p.add_argument("--out", required=True)
        a = p.parse_args(argv[1:])
        record = _load(p, a.record)
        try:
            rec.plot(record, a.out)
        except (OSError, ValueError) as e:  # no such folder, a format matplotlib lacks
            p.error(f"cannot write {a.out}: {e}")
        print(f"wrote {a.out}")
        return 0
    p = argparse.ArgumentParser(prog="xgather-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="small sizes, done in under a minute")
    g.add_argument("--large", action="store_true", help="larger sizes")
    g.add_argument("--size", choices=[s for s in SIZES if s != "tiny"],
                   help="the sizes by name (default: gpu on a GPU, else default)")
    p.add_argument("--workloads", help="comma-separated keys (default: W1-W10; on a GPU also "
                   "W9r, W9u, W9r-bf16, W9u-bf16)")
    p.add_argument("--systems", help="comma-separated: xgather, lax, jnp.take, numpy, onnxruntime, "
                   "openvino, torch; on a GPU torch-cuda, cupy (default: all installed, "
                   "on a GPU those on the GPU); where named: xgather[promise] alone, "
                   "xgather[linear], xgather[branched-wrap], xgather[fused-wrap], "
                   "lax-checked (lax's gather and a flag of the spec's test, read at the "
                   "next call)")
    p.add_argument("--device", help="JAX platform to run on (cpu, gpu, tpu; default: JAX's)")
    p.add_argument("--repeats", type=_rounds, default=None,
                   help="rounds (samples per system), 2 or more (default: as many as fit "
                        "about 2 s of samples a JAX system and 1 s a peer, 15 to 100; with "
                        "--quick a twentieth of that, 7 to 30)")
    p.add_argument("--allocator", choices=("keep", "default", "both"), default=None,
                   help="keep: glibc keeps large blocks, set first (bench/_alloc.py); "
                        "default: glibc as it comes (what a process gets unless it sets "
                        "MALLOC_* itself); both: each in its own process, with a quarter of "
                        "the rounds' budget each unless --repeats is given (the default on "
                        "a CPU; with --quick there, keep; elsewhere, default)")
    p.add_argument("--cpu-dispatch", choices=("async", "inline"), default="async",
                   help="async (JAX's default): XLA's CPU client runs a program of 1000 "
                        "flops or more on its worker threads; inline: every program on the "
                        "calling thread (jax_cpu_enable_async_dispatch=False)")
    p.add_argument("--json", help="write the run as a JSON record")
    p.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--timing", choices=("both",), help=argparse.SUPPRESS)  # _run_both's
    args = p.parse_args(argv)
    if args.allocator is None and _expected_platform(args.device) == "cpu":
        # what a user's process gets (glibc as it comes) beside what keeping large blocks
        # gives; a quick run, a quick look: keep alone
        args.allocator = "keep" if args.quick or args.size == "quick" else "both"
    if args.systems:
        unknown = sorted(set(args.systems.split(",")) - set(systems.NAMES))
        if unknown:
            p.error(f"unknown systems {unknown}; choose from {', '.join(systems.NAMES)}")
    _check_json_folder(p, args.json)
    record = _run_both(args, argv) if args.allocator == "both" else run(args)
    if not args.no_table:
        print(rec.table(record))
    if args.json:
        rec.save(record, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
