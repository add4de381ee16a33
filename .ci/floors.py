"""The floors pyproject.toml declares, for CI's oldest leg.

``python .ci/floors.py python`` prints the oldest Python (``3.11``);
``python .ci/floors.py constraints`` prints a pip constraints file that installs every
runtime dependency at its floor (``jax>=0.10.2`` becomes ``jax==0.10.2``), with jaxlib
at jax's floor. Every runtime dependency must declare a floor.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]


def python() -> str:
    m = re.fullmatch(r">=\s*(3\.\d+)", project["requires-python"].strip())
    if not m:
        sys.exit(f"requires-python must be '>=3.N': {project['requires-python']!r}")
    return m.group(1)


def constraints() -> str:
    lines = []
    for dep in project["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", dep.split(";")[0].strip())
        if not m:
            sys.exit(f"every runtime dependency needs a plain floor, 'name>=X.Y': {dep!r}")
        lines.append(f"{m.group(1)}=={m.group(2)}")
        if m.group(1) == "jax":  # jax's own wheel: the same floor
            lines.append(f"jaxlib=={m.group(2)}")
    return "\n".join(lines)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("python", "constraints"):
        sys.exit("usage: python .ci/floors.py python|constraints")
    print(python() if what == "python" else constraints())
