"""The docs' tables, made from the records: ``xgather-bench pages [--check]``.

A table in ``README.md`` or ``docs/*.md`` that starts after a marker line
``<!-- table: KIND RECORD... [key=value] -->`` is made by :data:`KINDS` [KIND] from the
named records under ``bench/results/`` (with the options given); ``xgather-bench pages``
writes each such table again from its records, and ``--check`` (and
``tests/test_docs.py``) fails where one differs. So a figure
in a marked table has one source, its record, and pages that quote the same record agree.

Kinds:

* ``cost RECORD``: a call's time in ms (W8 in µs) per workload, each call waiting for its
  result: the default, promise, ``jnp.take`` (or ``take_along_axis``, indexing: JAX's
  own gather in its default mode), torch and onnxruntime (the faster of 1 and 2 threads;
  on a GPU torch-cuda), from a main-job record;
* ``peers RECORD``: the same without the default (a record whose default is not
  today's check);
* ``check-times RECORD``: a ``check`` record's default and promise in ms, blocked and
  pipelined;
* ``check RECORD RECORD``: the default over promise per workload, blocked and pipelined,
  from two main-job records' ``check_cost`` (a CPU's two JAX versions);
* ``lax-checked RECORD...``: the default against a hand-written checked program;
* ``frameworks RECORD...``: the framework steps, checked over bare, and their host time;
* ``check-summary CPU CPU GPU``: the same as ranges over classes of workloads, the GPU's
  from a ``check`` record.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re

from . import record as _record

RESULTS = pathlib.Path(__file__).parent / "results"
PAGES = ("README.md", "docs")
MARKER = re.compile(r"^<!-- table: (?P<kind>[\w-]+) (?P<records>[^>]*?) -->$")
#: The workload classes of ``check-summary``, as a user meets them.
CLASSES = (("a row gather, or its gradient", ("W1", "W2", "W3", "W5", "W6", "W9")),
           ("an element gather (GatherND of elements, GatherElements)", ("W4", "W10")),
           ("a gather of 10 indices", ("W8",)),
           ("a model step around a gather", ("M1", "M2", "M3", "M4")))


def _load(name: str) -> dict:
    """Record ``name`` under ``bench/results/`` (a main job's is validated)."""
    with open(RESULTS / name) as f:
        rec = json.load(f)
    return _record.validate(rec) if rec.get("schema", "").startswith("xgather-bench/") else rec


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:#.3g}"


def _time(workload: str, seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{_number(seconds * 1e6)} µs" if workload == "W8" else _number(seconds * 1e3)


#: The columns of each time table: a title, and the systems it takes the fastest of
#: (threads named as ``(2t)``); a column no workload of the record has is left out.
COLUMNS = {
    "cost": (("default", ("xgather",)), ("promise", ("xgather[promise]",)),
             ("`jnp.take`", ("jnp.take",)),
             ("torch", ("torch 1t", "torch 2t", "torch-cuda", "torch-cuda embedding")),
             ("onnxruntime", ("onnxruntime 1t", "onnxruntime 2t"))),
    "more": (("`lax`", ("lax",)), ("OpenVINO", ("openvino 1t", "openvino 2t")),
             ("NumPy", ("numpy",)), ("CuPy", ("cupy",))),
}


def _tuned(entries: list[dict]) -> list[dict]:
    """A record's results (or ``check_cost``) as the tuned allocator gave them, where it
    ran both (``--allocator both``: systems named ``... @keep`` and ``... @default``),
    under their plain names."""
    if not any(e["system"].endswith(" @keep") for e in entries):
        return entries
    return [{**e, "system": e["system"].removesuffix(" @keep")} for e in entries
            if e["system"].endswith(" @keep")]


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: the header, its rule, the rows."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(row) + " |" for row in rows])


def _jax_version(rec: dict) -> str:
    return rec["versions"]["jax"]


def cost(name: str, columns: str = "cost", workloads: str = "") -> str:
    """A call's time per workload, each call waiting for its result, from main-job
    record ``name``: the :data:`COLUMNS` named ``columns`` (``cost`` without ``default``:
    ``peers``), and the workloads named (comma-separated; else all)."""
    rec = _load(name)
    rows: dict[str, dict[str, float]] = {}
    only = set(workloads.split(",")) - {""}
    for r in _tuned(rec["results"]):
        if not only or r["workload"] in only:
            rows.setdefault(r["workload"], {})[r["system"]] = r["median_s"]
    held = {s for systems in rows.values() for s in systems}
    chosen = COLUMNS["cost"][1:] if columns == "peers" else COLUMNS[columns]
    cols = [(t, names) for t, names in chosen if any(n in held for n in names)]
    table = []
    for w, systems in rows.items():
        cells = [w]
        for _, names in cols:
            found = sorted((systems[n], n) for n in names if n in systems)
            cells.append("-" if not found else _time(w, found[0][0]) + (
                f" ({found[0][1][-2:]})" if found[0][1].endswith("t") else ""))
        table.append(cells)
    return _table(["workload"] + [t for t, _ in cols], table)


def check(*names: str) -> str:
    """The default over promise per workload from main-job records' ``check_cost``:
    blocked and pipelined (spread in brackets), per record; then the first calls'."""
    recs = [_load(n) for n in names]
    head = ["workload"] + [f"{how}, jax {_jax_version(r)}" for r in recs
                           for how in ("blocked", "pipelined")] + [
        f"first call, jax {_jax_version(r)}" for r in recs]
    costs = [{c["workload"]: c for c in _tuned(_record.record_check_costs(r))} for r in recs]
    rows = []
    for w in costs[0]:
        cells = [w]
        for c in costs:
            got = c.get(w)
            cells += ["-", "-"] if got is None else [
                f"{got['ratio']:.2f} ({100 * got['spread']:.0f}%)",
                f"{got['ratio_pipelined']:.2f} ({100 * got['spread_pipelined']:.0f}%)"]
        cells += [f"{c[w]['first_call_ratio']:.2f}" if w in c else "-" for c in costs]
        rows.append(cells)
    return _table(head, rows)


def _span(values: list[float], workloads: list[str], members: tuple) -> str:
    """``low-high x`` over ``values``; where one workload of several gave them, its name."""
    if not values:
        return "-"
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    text = f"{low}x" if low == high else f"{low}-{high}x"
    named = set(workloads)
    return text + (f" ({named.pop()})" if len(named) == 1 < len(members) else "")


def check_summary(cpu_a: str, cpu_b: str, gpu: str) -> str:
    """The default over promise as ranges per class of workload: two CPU main-job
    records (both JAX versions) and one GPU ``check`` record."""
    cpu = [c for n in (cpu_a, cpu_b) for c in _tuned(_record.record_check_costs(_load(n)))]
    g = _load(gpu)
    dev = g["device"].get("kind", "GPU").replace("NVIDIA ", "").split()[0]
    rows = []
    for title, members in CLASSES:
        mine = [c for c in cpu if c["workload"] in members]
        on_gpu = [r for r in g.get("results", []) if r["workload"] in members]
        here = [c["workload"] for c in mine], members
        there = [r["workload"] for r in on_gpu], members
        rows.append([title, _span([c["ratio"] for c in mine], *here),
                     _span([c["ratio_pipelined"] for c in mine], *here),
                     _span([r["default/promise blocked"] for r in on_gpu], *there),
                     _span([r["default/promise pipelined"] for r in on_gpu], *there)])
    return _table(["workload", "CPU, blocked", "CPU, pipelined", f"{dev}, blocked",
                   f"{dev}, pipelined"], rows)


def check_times(name: str) -> str:
    """A ``check`` record's times in ms (W8 in µs): the default and promise, blocked and
    pipelined (a call's share of 10 calls and one wait)."""
    keys = ("default blocked", "promise blocked", "default pipelined", "promise pipelined")
    return _table(["workload"] + [k.replace(" ", ", ") for k in keys],
                  [[r["workload"]] + [_time(r["workload"], r["median_s"][k]) for k in keys]
                   for r in _load(name)["results"]])


def _by_version(names, key: str, first: str, titles: tuple, cells, label=str) -> str:
    """A table of records of one kind, one per JAX version: a row per ``key`` of the
    first record's results (``label`` of it), and per record the cells ``cells(entry)``
    gives under ``titles`` (None, or an entry the record lacks: dashes)."""
    recs = [_load(n) for n in names]
    head = [first] + [f"{t}, jax {_jax_version(r)}" for r in recs for t in titles]
    tables = [{x[key]: x for x in r["results"]} for r in recs]
    rows = []
    for k in tables[0]:
        row = [label(k)]
        for table in tables:
            got = cells(table[k]) if k in table else None
            row += ["-"] * len(titles) if got is None else got
        rows.append(row)
    return _table(head, rows)


def lax_checked(*names: str) -> str:
    """``xgather-bench check`` records (one per JAX version): per workload, the default's
    time over ``lax-checked``'s (a hand-written program of ``lax.gather`` and ``jnp.any``
    of its out-of-range test, its flag read at the next call), blocked / pipelined, and
    ``lax-checked``'s over promise's (where it is 1.5x or more, it is no floor)."""
    def cells(x):
        if "default/lax-checked blocked" not in x:
            return None
        return [f"{x[f'{of} blocked']:.2f} / {x[f'{of} pipelined']:.2f}"
                for of in ("default/lax-checked", "lax-checked/promise")]
    return _by_version(names, "workload", "workload",
                       ("default / lax-checked", "lax-checked / promise"), cells)


def frameworks(*names: str) -> str:
    """``xgather-bench frameworks`` records (one per JAX version): per framework, the
    checked step over the bare one in promise, pipelined (spread in brackets), and a
    call's host time in µs, bare / checked (and the check written by hand, where timed)."""
    def cells(x):
        if "ratio" not in x:
            return None
        host = x["host_call_s"]
        hand = f" ({host['lax-checked'] * 1e6:.0f} by hand)" if "lax-checked" in host else ""
        return [f"{x['ratio']:.2f} ({100 * x['spread']:.0f}%)",
                f"{host['promise'] * 1e6:.0f} / {host['checked'] * 1e6:.0f}{hand}"]
    return _by_version(names, "framework", "step", ("checked / bare", "host µs"), cells,
                       label=lambda name: f"`{name}`")


KINDS = {"cost": cost, "peers": functools.partial(cost, columns="peers"),
         "more": functools.partial(cost, columns="more"), "check": check,
         "check-times": check_times, "check-summary": check_summary,
         "lax-checked": lax_checked, "frameworks": frameworks}


def page_files(root: pathlib.Path) -> list[pathlib.Path]:
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def rewrite(text: str) -> str:
    """``text`` with each marked table made again from its records."""
    lines, out, at = text.split("\n"), [], 0
    while at < len(lines):
        line = lines[at]
        out.append(line)
        at += 1
        m = MARKER.match(line.strip())
        if m is None:
            continue
        words = m["records"].split()
        options = dict(w.split("=", 1) for w in words if "=" in w)
        out.append("")  # a blank line: the comment and the table are two blocks
        out.extend(KINDS[m["kind"]](*[w for w in words if "=" not in w],
                                    **options).split("\n"))
        if at < len(lines) and not lines[at].strip():
            at += 1
        while at < len(lines) and lines[at].startswith("|"):
            at += 1  # the old table
    return "\n".join(out)


def main(root: pathlib.Path, check_only: bool) -> int:
    """Write (or with ``check_only``, compare) every page's marked tables; the count of
    pages that differ."""
    stale = 0
    for path in page_files(root):
        text = path.read_text()
        if "<!-- table: " not in text:
            continue
        new = rewrite(text)
        if new != text:
            stale += 1
            print(f"{path}: {'differs from its records' if check_only else 'written'}")
            if not check_only:
                path.write_text(new)
    return stale
