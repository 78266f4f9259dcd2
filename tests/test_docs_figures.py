"""Every figure the README and docs/ link to a results file is in that file.

A figure in prose is written as a link to the committed ``benchmarks/results/<name>.md`` it comes
from (``[0.9424](../benchmarks/results/toollens_toolgen_gpu.md)``). This test reads each such link
whose text holds a number and checks that every number in the text appears in the linked ``.md``
or in the ``.json`` beside it, as written or as a rounding of a number there: a re-run that moves
a figure, or a figure typed by hand, fails here until the prose is brought in line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def figures(label: str) -> list[str]:
    """The numbers of a link text; none for a link that names a file (``toollens_dense_minilm``)."""
    if "_" in label or label.endswith(".md"):
        return []
    return [n.replace(",", "") for n in NUMBER.findall(label)]


def found(figure: str, text: str) -> bool:
    """Some number of ``text`` (a whole token, thousands commas dropped) is ``figure`` as written or
    rounds to it: 0.9424 is found in "0.94236" but not in "0.94256", 95 not in "0.9546"."""
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    value = float(figure)
    for token in re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?", text):
        number = token.replace(",", "")
        if number == figure or round(float(number), decimals) == value:
            return True
    return False


def linked_figures() -> list[tuple[str, str, str]]:
    out = []
    for doc in DOCS:
        for label, target in LINK.findall(doc.read_text()):
            path = (doc.parent / target).resolve()
            if "benchmarks/results" in str(path):
                out += [(f"{doc.relative_to(ROOT)}: [{label}]", str(path), f) for f in figures(label)]
    return out


def test_each_linked_figure_is_in_its_results_file():
    checked = linked_figures()
    assert len(checked) > 100  # the README's results table alone links dozens
    wrong = []
    for where, path, figure in checked:
        md = Path(path)
        if not md.exists():
            wrong.append(f"{where} links to {md.relative_to(ROOT)}, which is not committed")
            continue
        text = md.read_text()
        if md.with_suffix(".json").exists():
            text += md.with_suffix(".json").read_text()
        if not found(figure, text):
            wrong.append(f"{where}: {figure} is not in {md.relative_to(ROOT)} or its .json")
    assert not wrong, "\n".join(wrong)


def test_a_figure_typed_by_hand_is_caught():
    assert found("0.9424", "recall@3 0.94236") and found("1309", "train_seconds 1,309.3")
    assert not found("0.9425", "recall@3 0.94256") and not found("95", "recall 0.9546")
    assert not found("12.3", "p50 12.39 ms")
    assert figures("toollens_dense_minilm") == [] and figures("1,309 s") == ["1309"]
