"""The layering of the code base: import-linter's contracts (pyproject.toml) and no import cycles.

A new upward arrow (a method importing serving, training importing a method, one method package
importing another) fails here, in the default test run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout


def test_no_import_cycles_between_modules():
    graph = grimp.build_graph("components", "workflows", cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            # Package __init__ files re-exporting their own modules are not cycles between files.
            if imported.startswith(module + ".") or module.startswith(imported + "."):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append((module, imported, back))
    assert not cycles, cycles[:5]


def test_no_library_file_over_300_lines():
    generated = {"components/data/quickstart_catalog.py"}  # catalog data, not logic
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*ROOT.glob("components/**/*.py"), *ROOT.glob("workflows/**/*.py")]
        if str(p.relative_to(ROOT)) not in generated and (n := len(p.read_text().splitlines())) > 300
    }
    assert not long, long
