"""MkDocs hook: the README is the site's home page (one text, not two).

Its links into ``docs/`` are made relative to the site's root.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    readme = (Path(config["config_file_path"]).parent / "README.md").read_text()
    readme = re.sub(r"\]\(docs/([^)]*)\)", r"](\1)", readme)
    readme = readme.replace("](docs/)", "](index.md)")
    files.append(File.generated(config, "index.md", content=readme))
    return files
