"""The JSON record of a run, the table, and the comparison of two records."""

from __future__ import annotations

import json

SCHEMA = "xgather-bench/1"
RESULT_KEYS = ("workload", "title", "system", "samples_s", "median_s", "spread", "gbps",
               "pct_roof", "ratio_to_best", "first_call_s", "reps")


def validate(record: dict) -> dict:
    """Raise ValueError unless ``record`` has the schema's fields."""
    if record.get("schema") != SCHEMA:
        raise ValueError(f"not an {SCHEMA} record: schema={record.get('schema')!r}")
    for key in ("date", "device", "roof", "versions", "environment", "allocator", "results",
                "size"):
        if key not in record:
            raise ValueError(f"record lacks {key!r}")
    for r in record["results"]:
        missing = [k for k in RESULT_KEYS if k not in r]
        if missing:
            raise ValueError(f"result {r.get('workload')}/{r.get('system')} lacks {missing}")
    return record


def load(path) -> dict:
    with open(path) as f:
        return validate(json.load(f))


def save(record: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(validate(record), f, indent=1)


def _ms(s):
    return f"{s * 1e3:9.3f}"


def table(record: dict) -> str:
    """One line per workload and system: median, spread, GB/s, % of roof, ratio to best."""
    lines = [f"device: {record['device']['kind']} ({record['device']['platform']}), "
             f"{record['device']['cores']} cores, size={record['size']}, roof: "
             + ", ".join(f"{k} {v:.1f} GB/s" for k, v in record["roof"].items()),
             f"{'workload':<34} {'system':<18} {'median ms':>9} {'spread':>7} {'GB/s':>7} "
             f"{'%roof':>6} {'/best':>6} {'1st ms':>8}"]
    last = None
    for r in record["results"]:
        name = f"{r['workload']} {r['title']}" if r["workload"] != last else ""
        last = r["workload"]
        lines.append(f"{name:<34} {r['system']:<18} {_ms(r['median_s'])} "
                     f"{100 * r['spread']:6.1f}% {r['gbps']:7.1f} {r['pct_roof']:6.1f} "
                     f"{r['ratio_to_best']:6.2f} {r['first_call_s'] * 1e3:8.1f}")
    return "\n".join(lines)


def compare(a: dict, b: dict) -> str:
    """Median of B over median of A for every (workload, system) both records have."""
    ia = {(r["workload"], r["system"]): r for r in a["results"]}
    lines = [f"B/A median ratios (A: {a['device']['kind']} {a['date']}, "
             f"B: {b['device']['kind']} {b['date']}); < 1 means B is faster",
             f"{'workload':<8} {'system':<18} {'A ms':>9} {'B ms':>9} {'B/A':>6}"]
    shared = 0
    for r in b["results"]:
        key = (r["workload"], r["system"])
        if key in ia:
            shared += 1
            ra = ia[key]
            lines.append(f"{key[0]:<8} {key[1]:<18} {_ms(ra['median_s'])} {_ms(r['median_s'])} "
                         f"{r['median_s'] / ra['median_s']:6.2f}")
    if not shared:
        lines.append("(no workload/system pair in common)")
    return "\n".join(lines)


def plot(record: dict, out: str) -> None:
    """Bars of ratio-to-best per workload and system (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workloads = list(dict.fromkeys(r["workload"] for r in record["results"]))
    systems = list(dict.fromkeys(r["system"] for r in record["results"]))
    val = {(r["workload"], r["system"]): r["ratio_to_best"] for r in record["results"]}
    fig, ax = plt.subplots(figsize=(max(8, len(workloads) * 1.4), 5))
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        xs = [i + j * width for i, w in enumerate(workloads) if (w, s) in val]
        ys = [val[(w, s)] for w in workloads if (w, s) in val]
        ax.bar(xs, ys, width, label=s)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("median time / best system (lower is better)")
    ax.set_title(f"xgather bench on {record['device']['kind']} ({record['date']})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
