"""mkdocs hook: the benchmarks' result figures (``benchmarks/results/*.png``) are served
as ``results/<name>.png``, so docs pages show the figures the benchmarks last wrote instead
of copies that go stale (and strict mode checks that every one a page names exists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Files, config: Any) -> Files:
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{png.name}", abs_src_path=str(png)))
    return files
