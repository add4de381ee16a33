"""The JSON record of a run, the table, and the comparison of two records."""

from __future__ import annotations

import json

from . import stats

SCHEMA = "xgather-bench/2"
# /2 adds "check_cost" (below), "workloads" (shapes, dtype, how indices were drawn),
# "first_call", and "device" fields: memory_bytes and platform_version (required on
# a GPU, null where the device does not tell), gpu_name (torch's name, on CUDA).
# /1 records still load. Since the GPU run of 2026-11-26 (still /2: an added field, optional
# to read): "pct_roof_of", which copy of "roof" each "% of roof" figure divides by, for
# the systems on the device and the host peers ({"device": name, "host": name}), and in
# each result the one its "pct_roof" used. Records without it read as before: %roof of
# the fastest copy of its side.
SCHEMAS = ("xgather-bench/1", SCHEMA)
RESULT_KEYS = ("workload", "title", "system", "samples_s", "median_s", "spread", "gbps",
               "pct_roof", "ratio_to_best", "first_call_s", "reps")
CHECK_COST_KEYS = ("workload", "system", "baseline", "ratio", "spread", "rounds",
                   "first_call_ratio")
DEVICE_KEYS = ("kind", "platform", "backend", "cores")
GPU_DEVICE_KEYS = ("memory_bytes", "platform_version")  # values may be null
DEFAULT, PROMISE = "xgather", "xgather[promise]"


def validate(record: dict) -> dict:
    """Raise ValueError unless ``record`` has its schema's fields."""
    if record.get("schema") not in SCHEMAS:
        raise ValueError(f"not an xgather-bench record ({', '.join(SCHEMAS)}): "
                         f"schema={record.get('schema')!r}")
    required = ["date", "device", "roof", "versions", "environment", "allocator", "results",
                "size"]
    if record["schema"] != SCHEMAS[0]:
        required.append("check_cost")
    for key in required:
        if key not in record:
            raise ValueError(f"record lacks {key!r}")
    if record["schema"] != SCHEMAS[0]:
        device_keys = DEVICE_KEYS + (GPU_DEVICE_KEYS if record["device"].get("platform") == "gpu"
                                     else ())
        missing = [k for k in device_keys if k not in record["device"]]
        if missing:
            raise ValueError(f"record's device lacks {missing}")
    unknown = sorted({*record.get("pct_roof_of", {}).values(),
                      *(r["pct_roof_of"] for r in record["results"] if "pct_roof_of" in r)}
                     - set(record["roof"]))
    if unknown:
        raise ValueError(f"pct_roof_of names copies the roof lacks: {unknown}")
    for r in record["results"]:
        missing = [k for k in RESULT_KEYS if k not in r]
        if missing:
            raise ValueError(f"result {r.get('workload')}/{r.get('system')} lacks {missing}")
    for c in record.get("check_cost", ()):
        missing = [k for k in CHECK_COST_KEYS if k not in c]
        if missing:
            raise ValueError(f"check_cost {c.get('workload')}/{c.get('system')} lacks {missing}")
    return record


def check_costs(results: list[dict]) -> list[dict]:
    """What the spec's default costs over promise mode, per workload, from paired rounds.

    For each workload that ran both ``xgather`` and ``xgather[promise]`` (with the
    same suffix, e.g. `` @keep``): ``ratio`` is the median over rounds of the
    per-round ratio default / promise (the two ran in the same interleaved rounds),
    ``spread`` the relative interquartile range of those ratios, and
    ``first_call_ratio`` the ratio of their first calls (trace, compile, run).
    Where the run also timed the two in rounds of their own (``check_samples_s``:
    with other systems in the run, whose threads and allocations between the two
    samples of a round add noise that does not cancel), those samples are used,
    and ``rounds_of`` says so (``"the pair alone"``, else ``"every system"``).
    ``ratio_pipelined``: the same from rounds of ``PIPELINE`` calls then one wait
    (where the run timed them), as a training loop runs.
    ``context``: ``"model step"`` where the gather runs inside a step (``M1``-``M4``),
    the cost a model pays; ``"op alone"`` for a gather timed back to back with itself.
    """
    by = {(r["workload"], r["system"]): r for r in results}
    out = []
    for (workload, system), r in by.items():
        if not system.startswith(DEFAULT + " ") and system != DEFAULT:
            continue
        baseline = PROMISE + system[len(DEFAULT):]
        b = by.get((workload, baseline))
        alone = b is not None and "check_samples_s" in r and "check_samples_s" in b
        key = "check_samples_s" if alone else "samples_s"
        if b is None or len(b[key]) != len(r[key]) or not r[key]:
            continue
        out.append({"workload": workload, "system": system, "baseline": baseline,
                    "ratio": stats.paired_ratio(r[key], b[key]),
                    "spread": stats.paired_spread(r[key], b[key]),
                    "rounds": len(r[key]),
                    "rounds_of": "the pair alone" if alone else "every system",
                    "context": "model step" if r.get("step") else "op alone",
                    "first_call_ratio": r["first_call_s"] / b["first_call_s"],
                    **({"ratio_pipelined": stats.paired_ratio(r["pipelined_samples_s"],
                                                              b["pipelined_samples_s"]),
                        "spread_pipelined": stats.paired_spread(r["pipelined_samples_s"],
                                                                b["pipelined_samples_s"])}
                       if "pipelined_samples_s" in r and "pipelined_samples_s" in b
                       else {})})
    return out


def record_check_costs(record: dict) -> list[dict]:
    """The record's ``check_cost``, or (a /1 record) computed from its samples."""
    if "check_cost" in record:
        return record["check_cost"]
    return check_costs(record["results"])


def load(path) -> dict:
    with open(path) as f:
        record = json.load(f)
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    return validate(record)


def save(record: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(validate(record), f, indent=1)


def _ms(s):
    return f"{s * 1e3:9.3f}"


def _system_width(*records: dict) -> int:
    """The system column's width: 18, or the longest name (``onnxruntime 2t @default``)."""
    return max([18] + [len(r["system"]) for rec in records for r in rec["results"]])


def roof_line(roofs: dict[str, float], roof_of: dict[str, str] | None) -> str:
    """Each library's copy bandwidth by name, and which one the "% of roof" figures divide
    by (``roof_of``: ``{"device": name, "host": name}``, None for a record made before
    it was kept)."""
    text = "copy roof: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in roofs.items())
    if roof_of is None:
        return text + "; %roof divides by the fastest copy of its side"
    sides: dict[str, list[str]] = {}
    for side, name in roof_of.items():
        sides.setdefault(name, []).append(side)
    return text + "; %roof divides by " + ", ".join(
        f"{name} ({' and '.join(s)})" for name, s in sides.items())


def table(record: dict) -> str:
    """One line per workload and system: median, spread, GB/s, % of roof, ratio to best."""
    sw = _system_width(record)
    lines = [f"device: {record['device']['kind']} ({record['device']['platform']}), "
             f"{record['device']['cores']} cores, size={record['size']}; "
             + roof_line(record["roof"], record.get("pct_roof_of")),
             f"{'workload':<34} {'system':<{sw}} {'median ms':>9} {'p90 ms':>9} {'spread':>7} "
             f"{'GB/s':>7} {'%roof':>6} {'/best':>6} {'1st ms':>8}"]
    last = None
    for r in record["results"]:
        name = f"{r['workload']} {r['title']}" if r["workload"] != last else ""
        last = r["workload"]
        p90 = _ms(r["p90_s"]) if "p90_s" in r else f"{'-':>9}"
        lines.append(f"{name:<34} {r['system']:<{sw}} {_ms(r['median_s'])} {p90} "
                     f"{100 * r['spread']:6.1f}% {r['gbps']:7.1f} {r['pct_roof']:6.1f} "
                     f"{r['ratio_to_best']:6.2f} {r['first_call_s'] * 1e3:8.1f}")
    lines.append("p90: the 90th percentile of the samples; spread: interquartile range / "
                 "median; GB/s: the bytes a gather must move (a model step: its gather's; "
                 "int32 indices where JAX runs without x64) / median; %roof: of the copy "
                 "named above for the system's side (device or host); /best: median / the "
                 "fastest system's; 1st: the first call (JAX: trace, compile and run; peers: "
                 "their first run, after an untimed build)")
    costs = record_check_costs(record)
    if costs:
        alone = any(c.get("rounds_of") == "the pair alone" for c in costs)
        lines += ["", f"check cost: {DEFAULT} (the spec's default) / {PROMISE}, median of "
                  "per-round ratios" + (" (rounds of the pair alone)" if alone else "")
                  + "; first call: trace, compile and run",
                  f"{'workload':<34} {'system':<{sw}} {'blocked':>8} {'spread':>7} "
                  f"{'pipelined':>9} {'spread':>7} {'first call':>10}  context"]
        titles = {r["workload"]: r["title"] for r in record["results"]}
        for c in costs:
            name = f"{c['workload']} {titles.get(c['workload'], '')}"
            piped = (f"{c['ratio_pipelined']:9.2f} {100 * c['spread_pipelined']:6.1f}%"
                     if "ratio_pipelined" in c else f"{'':>9} {'':>7}")
            lines.append(f"{name:<34} {c['system']:<{sw}} {c['ratio']:8.2f} "
                         f"{100 * c['spread']:6.1f}% {piped} {c['first_call_ratio']:10.2f}  "
                         f"{c.get('context', 'op alone')}")
        lines.append("blocked: each call waits for its result; pipelined: 10 calls, then one "
                     "wait, as a training loop runs")
    piped = [r for r in record["results"] if "wrap_pipelined_samples_s" in r]
    if piped:
        lines += ["", "the negative wrap: where each program wraps, and a call's time blocked "
                  "and pipelined (10 calls, then one wait)",
                  f"{'workload':<34} {'system':<{sw}} {'blocked ms':>10} {'pipelined ms':>12}  "
                  "wrap"]
        last = None
        for r in piped:
            name = f"{r['workload']} {r['title']}" if r["workload"] != last else ""
            last = r["workload"]
            low = r.get("lowering")
            how = (f"{low['wrap_pass']}{' (a branch)' if low['branch'] else ''}, "
                   f"{low['indices']} indices" if low else "none (negative_indices=False)")
            lines.append(f"{name:<34} {r['system']:<{sw}} {r['median_s'] * 1e3:10.3f} "
                         f"{stats.median(r['wrap_pipelined_samples_s']) * 1e3:12.3f}  {how}")
    return "\n".join(lines)


def _shape(record: dict, workload: str):
    """What a workload ran on: its shapes and dtype where the record holds them, else the
    record's size name."""
    w = record.get("workloads", {}).get(workload)
    return (w["data"], w["indices"], w.get("dtype")) if w else record["size"]


def _same_shapes(a: dict, b: dict, workload: str) -> bool:
    if "workloads" in a and "workloads" in b:
        return _shape(a, workload) == _shape(b, workload)
    return a["size"] == b["size"]


def _settings(record: dict) -> dict:
    return {"size": record["size"], "x64": record.get("x64"),
            "allocator": record.get("allocator")}


def compare(a: dict, b: dict) -> str:
    """Median of B over median of A for every (workload, system) both records have, where
    the workload ran on the same shapes in both (the others are listed, not compared)."""
    sw = _system_width(a, b)
    ia = {(r["workload"], r["system"]): r for r in a["results"]}
    lines = [f"B/A median ratios (A: {a['device']['kind']} {a['date']} size={a['size']}, "
             f"B: {b['device']['kind']} {b['date']} size={b['size']}); < 1 means B is faster"]
    sa, sb = _settings(a), _settings(b)
    differ = [f"{k} (A {sa[k]}, B {sb[k]})" for k in sa if sa[k] != sb[k]]
    if differ:
        lines.append("the records differ in " + "; ".join(differ))
    lines.append(f"{'workload':<8} {'system':<{sw}} {'A ms':>9} {'B ms':>9} {'B/A':>6}")
    shared, unlike = 0, []
    for r in b["results"]:
        key = (r["workload"], r["system"])
        if key in ia:
            if not _same_shapes(a, b, key[0]):
                if key[0] not in unlike:
                    unlike.append(key[0])
                continue
            shared += 1
            ra = ia[key]
            lines.append(f"{key[0]:<8} {key[1]:<{sw}} {_ms(ra['median_s'])} {_ms(r['median_s'])} "
                         f"{r['median_s'] / ra['median_s']:6.2f}")
    if not shared:
        lines.append("(no workload/system pair in common on the same shapes)")
    for w in unlike:
        lines.append(f"not compared: {w} ran on other shapes (A {_shape(a, w)}, "
                     f"B {_shape(b, w)})")
    ca = {(c["workload"], c["system"]): c for c in record_check_costs(a)}
    both = [(ca[(c["workload"], c["system"])], c) for c in record_check_costs(b)
            if (c["workload"], c["system"]) in ca and _same_shapes(a, b, c["workload"])]
    if both:
        lines += ["", f"check cost ({DEFAULT} / {PROMISE}, paired rounds) in A and B",
                  f"{'workload':<8} {'system':<{sw}} {'A':>6} {'B':>6} {'1st A':>6} {'1st B':>6}"]
        for ca_, cb in both:
            lines.append(f"{cb['workload']:<8} {cb['system']:<{sw}} {ca_['ratio']:6.2f} "
                         f"{cb['ratio']:6.2f} {ca_['first_call_ratio']:6.2f} "
                         f"{cb['first_call_ratio']:6.2f}")
    return "\n".join(lines)


def figure(record: dict):
    """The record as a matplotlib Figure (needs matplotlib; no pyplot state).

    Top: median time over the best system's, per workload and system, on a log
    axis, so that a 200x on a tiny workload does not flatten the 1.2x elsewhere.
    Below, where the record has both modes: the check cost (default / promise)
    per workload, steady state and first call, on a log axis too.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    def times(y, _pos):
        return f"{y:g}x"

    results = record["results"]
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    systems = list(dict.fromkeys(r["system"] for r in results))
    val = {(r["workload"], r["system"]): r["ratio_to_best"] for r in results}
    costs = record_check_costs(record)
    fig = Figure(figsize=(max(8, len(workloads) * 1.4), 8 if costs else 5))
    axes = fig.subplots(2 if costs else 1, 1, squeeze=False)[:, 0]
    ax = axes[0]
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        xs = [i + j * width for i, w in enumerate(workloads) if (w, s) in val]
        ys = [val[(w, s)] for w in workloads if (w, s) in val]
        ax.bar(xs, ys, width, label=s)
    ax.set_yscale("log")
    top = max(val.values())
    ax.set_ylim(0.9, max(2.0, top * 1.5))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("median time / best system (log; lower is better)")
    ax.set_title(f"xgather bench on {record['device']['kind']} ({record['date']})")
    ax.legend(fontsize=7, ncol=2)
    if costs:
        ax = axes[1]
        names = [f"{c['workload']} {c['system'][len(DEFAULT):]}".strip()
                 + (" (step)" if c.get("context") == "model step" else "") for c in costs]
        xs = range(len(costs))
        ax.bar([x - 0.2 for x in xs], [c["ratio"] for c in costs], 0.4,
               label="steady state (median of per-round ratios)")
        ax.bar([x + 0.2 for x in xs], [c["first_call_ratio"] for c in costs], 0.4,
               label="first call (trace, compile, run)")
        ax.set_yscale("log")
        ax.set_ylim(min(0.9, 0.9 * min(min(c["ratio"], c["first_call_ratio"]) for c in costs)),
                    max(2.0, 1.5 * max(max(c["ratio"], c["first_call_ratio"]) for c in costs)))
        ax.set_xticks(list(xs), names)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel(f"{DEFAULT} / {PROMISE} (log)")
        ax.set_title("check cost: the spec's default mode over promise_in_bounds")
        ax.legend(fontsize=7)
    for ax in axes:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(times))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, pos: ""))
    fig.tight_layout()
    return fig


def plot(record: dict, out: str) -> None:
    """Write :func:`figure` to ``out`` (PNG, SVG, PDF: by the file's extension)."""
    figure(record).savefig(out, dpi=120)
