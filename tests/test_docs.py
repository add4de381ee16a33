"""The README and the docs: every code example runs (and says what it shows), the README
keeps its first screen and its size, and the docs name every public name."""

from __future__ import annotations

import re
import textwrap
import tomllib
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
SOURCES = {"README.md": README, **{f"docs/{k}": v for k, v in PAGES.items()}}
#: (source, index, code) of every ```python block of the README and the docs (a block in a
#: list item dedented).
EXAMPLES = [(name, k, textwrap.dedent(code)) for name, text in SOURCES.items()
            for k, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S))]
BLOCKS = [code for _, _, code in EXAMPLES]
#: What a block needs beyond the test extras' core (skipped, with the reason, where absent).
OPTIONAL = {"xgather.export": "jax2onnx", "register_jaxonnxruntime": "jaxonnxruntime",
            "from flax import nnx": "flax", "import equinox": "equinox", "optax": "optax"}


def _block(needle: str) -> str:
    return next(b for b in BLOCKS if needle in b)


@pytest.mark.parametrize(("source", "k", "code"), EXAMPLES,
                         ids=[f"{s}[{k}]" for s, k, _ in EXAMPLES])
def test_every_example_runs(source, k, code):
    for needle, module in OPTIONAL.items():
        if needle in code:
            pytest.importorskip(module, reason=f"{source}'s example {k} needs {module}")
    # optax mixes int32 step counts with floats: user code runs with JAX's standard
    # promotion, not the suite's strict one.
    promotion = "standard" if "optax" in code else "strict"
    with jax.numpy_dtype_promotion(promotion):
        exec(compile(code, f"{source}[{k}]", "exec"), {})


def _printed(code: str) -> list[str]:
    """What a block says it prints: the comment lines right after each ``print(`` line."""
    said, after_print = [], False
    for line in code.splitlines():
        if line.lstrip().startswith("# ") and after_print:
            said.append(line.lstrip()[2:])
            continue
        after_print = "print(" in line
    return said


@pytest.mark.parametrize("page", ["start.md", "examples.md", "modes.md"])
def test_the_guides_print_what_they_say(page, capsys):
    """Getting started and the examples show each result under the line that prints it."""
    for k, code in enumerate(re.findall(r"```python\n(.*?)```", PAGES[page], re.S)):
        for needle, module in OPTIONAL.items():
            if needle in code:
                pytest.importorskip(module, reason=f"{page}'s example {k} needs {module}")
        with jax.numpy_dtype_promotion("standard"):
            exec(compile(code, f"{page}[{k}]", "exec"), {})
        # compared word for word: a comment may wrap a long printed line
        printed = capsys.readouterr().out.split()
        assert printed == " ".join(_printed(code)).split(), (page, k)


_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def _paragraphs(text: str) -> list[str]:
    """The prose of a Markdown text, one string per paragraph: a run of lines between blank
    lines, each list item on its own. Headings, tables, fenced code and the API page's
    ``:::`` lines are not prose."""
    paragraphs, lines, fenced = [], [], False

    def end():
        if lines:
            paragraphs.append(" ".join(line.strip() for line in lines))
            lines.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            end()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or line.lstrip().startswith(("|", "#", ":::")):
            end()
            continue
        if _LIST_ITEM.match(line):
            end()
        lines.append(line)
    end()
    return paragraphs


def test_paragraphs_are_parsed_as_the_docs_test_counts_them():
    text = "# T\n\nOne\ntwo.\n\n- a\n  b\n- c\n\n| x |\n|---|\n\n```python\nx = 1\n```\n"
    assert _paragraphs(text) == ["One two.", "- a b", "- c"]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_no_paragraph_is_longer_than_1000_characters(source):
    """A paragraph or list item of more than 1000 characters is split: shorter paragraphs,
    or sub-items, read better on a screen."""
    long = [(len(p), " ".join(p.split()[:8])) for p in _paragraphs(SOURCES[source])
            if len(p) > 1000]
    assert not long, (source, long)


def _slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify, markup removed)."""
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]|\[([^\]]*)\]\([^)]*\)", r"\1\2", heading)
    text = re.sub(r"[^\w\s-]", "", text.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_every_link_to_a_section_finds_it():
    """``page.md#section`` and ``#section`` links name a heading that exists."""
    anchors = {name: {_slug(h) for h in re.findall(r"^#+ (.+)$", re.sub(
        r"```.*?```", "", text, flags=re.S), re.M)} for name, text in PAGES.items()}
    anchors["README.md"] = {_slug(h) for h in re.findall(r"^#+ (.+)$", README, re.M)}
    missing = []
    for source, text in SOURCES.items():
        here = source.split("/")[-1]
        for page, anchor in re.findall(r"\]\((?:docs/)?([a-z]*\.md)?#([\w-]+)\)", text):
            if anchor not in anchors[page or here]:
                missing.append((source, f"{page}#{anchor}"))
    assert not missing, missing


#: The widest line a code block may hold: a wider one scrolls, and hides its end.
CODE_WIDTH = 79


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block (``` or ~~~, any
    language, indented in a list too); the fences themselves are not counted."""
    lines, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence is None:
            opening = re.match(r"`{3,}|~{3,}", stripped)
            fence = opening.group(0) if opening else None
        elif stripped.startswith(fence) and not stripped.strip(fence[0]).strip():
            fence = None
        else:
            lines.append((n, line))
    return lines


def _wide_code_lines(source: str, text: str) -> list[str]:
    return [f"{source}:{n} ({len(line)} characters)" for n, line in _code_lines(text)
            if len(line) > CODE_WIDTH]


def test_code_lines_are_found_as_the_width_test_counts_them():
    long = "x" * (CODE_WIDTH + 1)
    text = f"{long}\n\n```bash\n{long}\nok\n```\n{long}\n\n- item\n\n  ```python\n  {long}\n  ```\n"
    assert _code_lines(text) == [(4, long), (5, "ok"), (12, f"  {long}")]
    assert _wide_code_lines("p.md", text) == [f"p.md:4 ({CODE_WIDTH + 1} characters)",
                                              f"p.md:12 ({CODE_WIDTH + 3} characters)"]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_no_code_line_is_wider_than_79_characters(source):
    """Every line of every code block (Python, shell, text) fits a screen of 79
    characters: split a command with ``\\``, Python inside parentheses."""
    wide = _wide_code_lines(source, SOURCES[source])
    assert not wide, f"code lines over {CODE_WIDTH} characters: " + ", ".join(wide)


def test_no_docstring_example_line_is_wider_than_79_characters():
    """The API page shows each docstring's examples as code, prompts included, in the
    same 79 characters (``# doctest: +SKIP`` comments, which it shows too, included)."""
    import inspect

    import xgather
    wide = []
    for path in sorted((ROOT / "xgather").rglob("*.py")):
        for at, line in enumerate(path.read_text().split("\n"), 1):
            text = line.strip()
            if text.startswith((">>>", "...")) and len(text) > CODE_WIDTH:
                wide.append(f"{path.relative_to(ROOT)}:{at} ({len(text)} characters)")
    assert inspect.getdoc(xgather.explain).count(">>>") >= 2  # examples are found
    assert not wide, f"example lines over {CODE_WIDTH} characters: " + ", ".join(wide)


#: The extras ``pyproject.toml`` defines (``pip install -e '.[name]'``).
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
             ["optional-dependencies"])
#: ``pip install`` and what follows it: options, quoted or bare requirements and paths (a
#: backtick, ``&&``, a parenthesis or a double quote ends it).
_PIP_INSTALL = re.compile(r"\bpip install\b((?:\s+(?:'[^']*'|[\w.\-/\[\],<>=!~]+))*)")
_PIP_TOKEN = re.compile(r"'[^']*'|[\w.\-/\[\],<>=!~]+")


def _install_sources() -> dict[str, str]:
    """Where a user reads an install line: the README, the docs, and the library's own
    messages and docstrings."""
    code = {str(path.relative_to(ROOT)): path.read_text()
            for folder in ("xgather", "xgather/onnx")
            for path in sorted((ROOT / folder).glob("*.py"))}
    return {**SOURCES, **code}


def _install_lines(source: str, text: str) -> list[tuple[str, str, list[str]]]:
    """(where, line, arguments) of every ``pip install`` in ``text``."""
    return [(f"{source}:{n}", line, [tok.strip("'") for tok in
                                     _PIP_TOKEN.findall(m.group(1))])
            for n, line in enumerate(text.splitlines(), 1)
            for m in _PIP_INSTALL.finditer(line)]


def _install_problems(source: str, text: str) -> list[str]:
    """What is wrong with the ``pip install`` lines of ``text``: xgather is installed
    from its clone (``pip install -e '.[export]'``), with extras ``pyproject.toml``
    defines, not from a package index (``pip install 'xgather[export]'``), except in
    getting started's one sentence on publishing (a line with "Once published")."""
    problems = []
    for where, line, args in _install_lines(source, text):
        editable = False
        for arg in args:
            if arg in ("-e", "--editable"):
                editable = True
                continue
            if arg.startswith("-"):
                continue
            target, _, extras = arg.partition("[")
            names = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()}
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", target)
            if editable or target.startswith((".", "/")):
                if not (ROOT / target).exists():
                    problems.append(f"{where}: {arg!r} is no path in the clone")
            elif name and re.sub(r"[-_.]+", "-", name.group(0).lower()) == "xgather":
                if not (source == "docs/start.md" and "Once published" in line):
                    problems.append(f"{where}: {arg!r} installs xgather from an index, "
                                    "where it is not published: pip install -e '.[...]'")
            else:
                names = set()  # another package's extras
            editable = False
            unknown = sorted(names - EXTRAS)
            if unknown:
                problems.append(f"{where}: {arg!r} names extras pyproject.toml does not "
                                f"define: {unknown} (it has {sorted(EXTRAS)})")
    return problems


def test_every_install_line_installs_from_the_clone():
    """Every ``pip install`` of the README, the docs and the library's messages runs in
    a clone: xgather is not on a package index, so ``pip install 'xgather[export]'``
    fails; ``pip install -e '.[export]'`` with an extra that exists does not."""
    sources = _install_sources()
    found = [where for name, text in sources.items()
             for where, _, _ in _install_lines(name, text)]
    assert len(found) >= 10, found
    problems = [p for name, text in sources.items() for p in _install_problems(name, text)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("source", "line"), [
    ("docs/onnx.md", "`pip install 'xgather[export]'` (Python 3.11+), then"),
    ("docs/onnx.md", "`pip install 'xgather[jaxonnxruntime]'`, then"),
    ("README.md", "The ONNX export (`pip install 'xgather[export]'`) is tested"),
    ("xgather/export.py",
     "raise ImportError(\"xgather.export needs jax2onnx: pip install 'xgather[export]'\")"),
    ("xgather/onnx/_models.py", "      \"pip install 'xgather[jaxonnxruntime]'\") from err"),
    ("docs/start.md", "python3 -m pip install xgather"),
    ("docs/onnx.md", "Once published on PyPI, `pip install 'xgather[export]'` will do the same."),
    ("docs/start.md", "Once published on PyPI, `pip install 'xgather[exports]'` will do it."),
    ("docs/start.md", "`.venv/bin/pip install -e '.[export,tests]'`"),
    ("docs/start.md", "`pip install -e ./nowhere`"),
])
def test_the_install_check_refuses_an_install_from_an_index(source, line):
    assert _install_problems(source, line), line


def test_the_install_check_takes_the_clone_forms():
    ok = ["`pip install -e .`", "`.venv/bin/pip install -e '.[export]' && xgather-bench`",
          "`pip install -e '.[test,docs]'`", "`pip install 'jax[cuda13]'`",
          "`pip install onnx-ir flax && pip install --no-deps jax2onnx`",
          "f\"pip install 'jax2onnx==0.17.1' 'jax==0.12.0.1' \""]
    for line in ok:
        assert _install_problems("docs/onnx.md", line) == [], line
    published = "Once published on PyPI, `pip install 'xgather[export]'` will do the same."
    assert _install_problems("docs/start.md", published) == []


def _api_names() -> set[str]:
    """Every name the API page documents (a module, or a name in one's ``__all__``)."""
    import importlib

    import xgather
    names = set()
    for module in ("onnx", "openvino", "bnns", "labview", "sharded", "export"):
        mod = importlib.import_module(f"xgather.{module}")
        names |= {f"xgather.{module}"} | {f"xgather.{module}.{n}" for n in mod.__all__}
    return names | {f"xgather.{n}" for n in xgather.__all__}


@pytest.mark.parametrize("page", sorted(set(PAGES) - {"api.md", "changelog.md"}))
def test_every_guide_links_the_api_names_it_mentions(page):
    """A name of the API in backticks (`xgather.checked(f)`) is linked to its entry
    (``[...][xgather.checked]``) at least once on the page."""
    names = _api_names()
    text = re.sub(r"```.*?```", "", PAGES[page], flags=re.S)
    mentioned = set()
    for span in re.findall(r"`(xgather\.[^`]+)`", text):
        parts = re.match(r"xgather(?:\.\w+)+", span).group(0).split(".")
        known = [".".join(parts[:k]) for k in range(len(parts), 1, -1)
                 if ".".join(parts[:k]) in names]
        mentioned |= set(known[:1])
    linked = set(re.findall(r"\]\[(xgather[\w.]*)\]", text))
    assert mentioned <= linked, sorted(mentioned - linked)


def test_docstring_examples_are_sections_the_api_page_renders_as_code():
    """A docstring's ``>>>`` lines sit under an ``Examples:`` section (else the API page
    shows them as a quote), and no Sphinx role is left (it shows as raw text there)."""
    import ast
    for path in sorted((ROOT / "xgather").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                continue
            doc = ast.get_docstring(node, clean=True) or ""
            assert not re.search(r":(func|class|mod|attr|data|meth|exc):`", doc), \
                (path.name, getattr(node, "name", "module"))
            lines = doc.splitlines()
            for k, line in enumerate(lines):
                if line.strip().startswith(">>>"):
                    before = [x for x in lines[:k] if x.strip() and not x.startswith(" ")]
                    assert before and before[-1].strip() == "Examples:", \
                        (path.name, getattr(node, "name", "module"), line)


def test_every_public_constant_has_a_docstring():
    """The API page shows a constant's docstring (the string after it), not a comment."""
    import ast
    for path in sorted((ROOT / "xgather").rglob("*.py")):
        body = ast.parse(path.read_text()).body
        for k, node in enumerate(body):
            target = (node.targets[0] if isinstance(node, ast.Assign) else
                      node.target if isinstance(node, ast.AnnAssign) else None)
            if not isinstance(target, ast.Name) or not target.id.isupper() \
                    or target.id.startswith("_"):
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            public = {m: getattr(__import__(m, fromlist=["x"]), "__all__", ()) for m in
                      ("xgather", "xgather.onnx", "xgather.openvino", "xgather.bnns",
                       "xgather.labview", "xgather.export")}
            if not any(target.id in names for names in public.values()):
                continue
            after = body[k + 1] if k + 1 < len(body) else None
            assert isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str), (module, target.id)


def test_the_examples_are_found():
    assert len(EXAMPLES) >= 7, [(s, k) for s, k, _ in EXAMPLES]


def test_first_gather_prints_what_it_says(capsys):
    """The README's first block, right after the install: each result under its print."""
    first = BLOCKS[0]
    assert first.startswith("import numpy as np, xgather") and len(first.splitlines()) <= 8
    exec(compile(first, "README-first-gather", "exec"), {})
    assert capsys.readouterr().out.splitlines() == _printed(first)


def test_first_example_runs():
    ns: dict = {}
    exec(compile(_block("f(data, np.array([3, -4]))"), "README-example", "exec"), ns)
    np.testing.assert_array_equal(ns["f"](ns["data"], np.array([3, -4])), ns["data"][:, [3, 0]])


def test_gradient_example_runs_and_matches_its_comments():
    ns: dict = {}
    lines = _block("lda_coeff=-2.0").splitlines()
    want = {0: [4.0, 0.0, 2.0], 1: [0.0, 0.0, -2.0], 2: [0.0, 2.0, 0.0]}
    k = 0
    for line in lines:
        exec(line, ns)
        if line.startswith("g = "):
            np.testing.assert_array_equal(ns["g"], want[k])
            k += 1
    assert k == 3


def test_first_screen_has_the_two_commands():
    head = README.split("\n## ")[0]
    assert ".venv/bin/xgather-bench" in head and "-m pytest" in head


def test_readme_is_short_and_speaks_of_the_project_only():
    assert len(README.encode()) <= 12 * 1024
    # The docstrings too: they are what help() and the API page show.
    code = {str(p.relative_to(ROOT)): p.read_text()
            for folder in ("xgather", "bench") for p in sorted((ROOT / folder).rglob("*.py"))}
    for name, text in {**SOURCES, **code}.items():
        found = re.findall(r"\b(?:issue|ticket|task) ?#?\d+", text, re.I)
        assert not found, (name, found)


def test_readme_links_every_guide():
    linked = set(re.findall(r"\]\(docs/([a-z]+\.md)\)", README))
    assert linked == set(PAGES), set(PAGES) ^ linked


def test_every_public_name_is_in_the_api_reference():
    import xgather
    import xgather.export
    api = PAGES["api.md"]
    documented = set(re.findall(r"^::: ([\w.]+)$", api, re.M))
    for module in (xgather.onnx, xgather.openvino, xgather.bnns, xgather.labview,
                   xgather.sharded, xgather.export):
        assert module.__name__ in documented, module.__name__
        assert module.__all__, module.__name__
    modules = {"bnns", "labview", "onnx", "openvino", "sharded", "export"}
    for name in set(xgather.__all__) - modules:
        assert f"xgather.{name}" in documented, name


def test_many_devices_example_runs():
    ns: dict = {}
    exec(compile(_block("xgather.sharded.gather"), "docs-many-devices", "exec"), ns)
    assert ns["rows"].shape == (1024, 256)
    np.testing.assert_array_equal(np.asarray(ns["same"]), np.asarray(ns["rows"]))
    assert ns["same"].sharding.is_equivalent_to(ns["table"].sharding, 2)


def test_onnx_models_example_runs():
    ns: dict = {}
    exec(compile(_block("from_node"), "docs-onnx-models", "exec"), ns)
    data = ns["np"].arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(ns["f"](data, np.array([-1, 0])), [[2.0, 0.0], [5.0, 3.0]])
    np.testing.assert_array_equal(ns["out"], np.ones((2, 2), np.float32))
    assert ns["out"].dtype == np.float32


def test_xgather_export_is_an_attribute_without_an_import():
    import subprocess
    import sys
    code = ("import sys, xgather; assert 'xgather.export' not in sys.modules; "
            "print(xgather.export.to_onnx.__module__, 'jax2onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["xgather.export", "False"]


# -- the tables made from the records (bench/pages.py) ------------------------------------------

def _marked_tables():
    from bench import pages
    for path in pages.page_files(ROOT):
        lines = path.read_text().split("\n")
        for at, line in enumerate(lines):
            m = pages.MARKER.match(line.strip())
            if m:
                rows = []
                for row in lines[at + 2:]:  # after the marker's blank line
                    if not row.startswith("|"):
                        break
                    rows.append([c.strip() for c in row.strip("|").split("|")])
                yield path.name, m["kind"], m["records"].split(), rows


def test_the_marked_tables_are_what_their_records_give():
    from bench import pages
    tables = list(_marked_tables())
    assert {kind for _, kind, _, _ in tables} >= {"cost", "check", "check-summary"}
    for path in pages.page_files(ROOT):
        text = path.read_text()
        assert pages.rewrite(text) == text, f"{path.name}: run `xgather-bench pages`"


def _figure(cell: str) -> float:
    return float(re.match(r"[\d.]+", cell).group())


def test_the_cost_tables_quote_their_records_medians():
    """Read from the record here, not through bench/pages.py: each cell of a ``cost``
    table is its system's median (the faster thread count for the peers), in ms or, for
    W8, in µs, to three figures."""
    import json
    columns = {"default": ["xgather"], "promise": ["xgather[promise]"],
               "`jnp.take`": ["jnp.take"], "torch": ["torch 1t", "torch 2t", "torch-cuda",
                                                  "torch-cuda embedding"],
               "onnxruntime": ["onnxruntime 1t", "onnxruntime 2t"]}
    seen = 0
    for page, kind, records, rows in _marked_tables():
        if kind not in ("cost", "peers"):
            continue
        rec = json.loads((ROOT / "bench" / "results" / records[0]).read_text())
        keep = any(r.get("allocator") == "keep" for r in rec["results"])
        medians = {(r["workload"], r["system"].removesuffix(" @keep")): r["median_s"]
                   for r in rec["results"] if not keep or r.get("allocator") == "keep"}
        head = rows[0]
        for row in rows[2:]:
            for title, cell in zip(head[1:], row[1:], strict=True):
                if cell == "-":
                    assert not any((row[0], s) in medians for s in columns[title])
                    continue
                best = min(medians[row[0], s] for s in columns[title]
                           if (row[0], s) in medians)
                want = best * (1e6 if row[0] == "W8" else 1e3)
                assert _figure(cell) == pytest.approx(want, rel=6e-3, abs=0.6), (
                    page, row[0], title)
                seen += 1
    assert seen >= 50


def test_the_table_check_finds_a_changed_figure(tmp_path):
    from bench import pages
    (tmp_path / "docs").mkdir()
    page = next(p for p in pages.page_files(ROOT) if "<!-- table: cost" in p.read_text())
    text = page.read_text()
    first = re.search(r"<!-- table: cost .*? -->\n\n\|.*\n\|.*\n\| W1 \| ([\d.]+)", text)
    changed = text[:first.start(1)] + "9" + text[first.start(1):]
    (tmp_path / "README.md").write_text(changed)
    assert pages.main(tmp_path, check_only=True) == 1
