"""``docs/architecture.md`` matches the tree: every file and folder under ``cadence/`` has
its line in the Layout section, and every line names something that exists.

The format (stated in the doc itself): inside the section ``## Layout``, a line
``- `cadence/PATH` — description`` (any indentation; ``--`` may stand for the em dash) is one
entry. A folder's path ends with ``/`` and stands for its ``__init__.py``; every other
``.py`` file has its own entry.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "cadence"

#: ``- `cadence/...` — description``: the path, then the description.
ENTRY = re.compile(r"^\s*- `(?P<path>cadence/[^`]*)` (?:—|--) (?P<text>\S.*)$")


def layout_section(text: str) -> list[str]:
    """The lines of the ``## Layout`` section (up to the next ``## `` heading).

    Raises:
        AssertionError: the doc has no Layout section.
    """
    lines = text.splitlines()
    assert "## Layout" in lines, "docs/architecture.md has no '## Layout' section"
    start = lines.index("## Layout") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def documented_paths(text: str) -> list[str]:
    """Every entry's path, in order (duplicates kept)."""
    return [m.group("path") for line in layout_section(text) if (m := ENTRY.match(line))]


def tree_paths(package: Path) -> set[str]:
    """What must be documented: each folder holding a ``.py`` file (``cadence/x/``) and each
    ``.py`` file other than ``__init__.py``, relative to the repository root."""
    root = package.parent
    paths: set[str] = set()
    for path in package.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        folder = path.parent.relative_to(root).as_posix() + "/"
        paths.add(folder)
        if path.name != "__init__.py":
            paths.add(path.relative_to(root).as_posix())
    return paths


def problems(doc_text: str, package: Path) -> list[str]:
    """What is wrong between the doc and the tree, one line each (empty: they agree)."""
    listed = documented_paths(doc_text)
    documented = set(listed)
    actual = tree_paths(package)
    root = package.parent
    out = [f"missing from docs/architecture.md: {p}" for p in sorted(actual - documented)]
    for path in sorted(documented - actual):
        exists = (root / path).exists()
        out.append(f"docs/architecture.md names {path}, which "
                   + ("is not a module or package folder" if exists else "does not exist"))
    out += [f"listed {n} times: {p}" for p, n in sorted(Counter(listed).items()) if n > 1]
    return out


def test_layout_matches_the_tree() -> None:
    found = problems(DOC.read_text(encoding="utf-8"), PACKAGE)
    assert not found, "\n".join(found) + (
        "\n(one line per folder and file in the Layout section: "
        "'- `cadence/PATH` — what it holds')")


def test_every_entry_is_described() -> None:
    short = [line.strip() for line in layout_section(DOC.read_text(encoding="utf-8"))
             if (m := ENTRY.match(line)) and len(m.group("text")) < 8]
    assert not short, "entries without a description:\n" + "\n".join(short)


# ----------------------------------------------------------------------------- the checker
@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    for name in ("cadence/__init__.py", "cadence/cli.py", "cadence/core/__init__.py",
                 "cadence/core/time.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("", encoding="utf-8")
    return tmp_path / "cadence"


DOC_OK = """# x

## Layout

- `cadence/` — the package
  - `cadence/cli.py` — the command line
- `cadence/core/` -- the core
  - `cadence/core/time.py` — time

## Other

- `cadence/gone.py` — outside the section: not an entry
"""


def test_checker_accepts_a_matching_doc(tree: Path) -> None:
    assert problems(DOC_OK, tree) == []


def test_checker_reports_a_missing_file(tree: Path) -> None:
    (tree / "core" / "state.py").write_text("", encoding="utf-8")
    (tree / "loggers").mkdir()
    (tree / "loggers" / "__init__.py").write_text("", encoding="utf-8")
    assert problems(DOC_OK, tree) == [
        "missing from docs/architecture.md: cadence/core/state.py",
        "missing from docs/architecture.md: cadence/loggers/"]


def test_checker_reports_a_module_that_does_not_exist(tree: Path) -> None:
    doc = DOC_OK.replace("## Other", "- `cadence/core/event.py` — events\n"
                                     "- `cadence/core/time.py` — again\n\n## Other")
    assert problems(doc, tree) == [
        "docs/architecture.md names cadence/core/event.py, which does not exist",
        "listed 2 times: cadence/core/time.py"]
