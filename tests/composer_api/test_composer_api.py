"""Composer 0.32.1's public names against cadence, from the checked-in table.

``composer_0_32_1.json`` (written from Composer itself by ``dump_composer_api.py``) holds
every public name of the modules a Composer user imports from, with its parameter names;
``docs/composer_api.md`` marks each "in cadence" or "left out" with a reason. A name in
cadence must import from Composer's path with the package renamed, and take Composer's
parameters: each of Composer's parameter names, in Composer's order (cadence may add its own
between or after them), with Composer's required parameters at Composer's positions.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = json.loads(Path(__file__).with_name("composer_0_32_1.json").read_text())
TABLE_FILE = ROOT / "docs" / "composer_api.md"
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<status>in cadence|left out) \|(?P<notes>.*)\|$")


def _table() -> dict[tuple[str, str], tuple[str, str]]:
    """``{(composer_module, name): (status, notes)}`` from docs/composer_api.md."""
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    module: Optional[str] = None
    for line in TABLE_FILE.read_text().splitlines():
        heading = re.match(r"^## `(composer[\w.]*)`$", line)
        if heading:
            module = heading.group(1)
            continue
        row = ROW.match(line)
        if row and module is not None:
            key = (module, row["name"])
            assert key not in rows, f"docs/composer_api.md lists {key} twice"
            rows[key] = (row["status"], row["notes"].strip())
    return rows


TABLE = _table()
ENTRIES = API["names"]


def _id(entry: dict[str, Any]) -> str:
    return f"{entry['module']}.{entry['name']}"


def _param_names(obj: Any) -> Optional[list[str]]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    names = [p.name for p in signature.parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names[1:] if inspect.isclass(obj) and names[:1] == ["self"] else names


def test_table_has_exactly_composers_names() -> None:
    expected = {(e["module"], e["name"]) for e in ENTRIES}
    assert not expected - set(TABLE), f"names missing from docs/composer_api.md: {sorted(expected - set(TABLE))}"
    assert not set(TABLE) - expected, f"rows not in Composer 0.32.1: {sorted(set(TABLE) - expected)}"


def test_version_is_composers_last() -> None:
    assert API["composer_version"] == "0.32.1"


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_name(entry: dict[str, Any]) -> None:
    status, notes = TABLE[(entry["module"], entry["name"])]
    if status == "left out":
        assert len(notes) > 15, f"{_id(entry)} is left out without a reason"
        return
    module_name = "cadence" + entry["module"][len("composer"):]
    module = importlib.import_module(module_name)
    assert hasattr(module, entry["name"]), f"{module_name} has no {entry['name']}"
    if entry.get("in_all", True):  # a private name llm-foundry imports is in no __all__
        assert entry["name"] in getattr(module, "__all__", ()), (
            f"{entry['name']} is not in {module_name}.__all__")
    obj = getattr(module, entry["name"])
    composer_params = entry.get("params")
    if not composer_params:
        return
    ours = _param_names(obj)
    assert ours is not None, f"{module_name}.{entry['name']} has no signature to compare"
    missing = [p for p in composer_params if p not in ours]
    assert not missing, f"{module_name}.{entry['name']} lacks Composer's parameters {missing}"
    positions = [ours.index(p) for p in composer_params]
    assert positions == sorted(positions), (
        f"{module_name}.{entry['name']} takes Composer's parameters in another order: "
        f"{[ours[i] for i in sorted(positions)]} (Composer: {composer_params})")
    required = [p for p in composer_params if p in (entry.get("required") or [])]
    for index, name in enumerate(composer_params):
        if name in required:
            assert ours.index(name) == index, (
                f"{module_name}.{entry['name']}: required parameter {name!r} is not at "
                f"Composer's position {index}")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.get("used_by")], ids=_id)
def test_llm_foundry_names_are_in_cadence_and_marked(entry: dict[str, Any]) -> None:
    """Every name llm-foundry 0.22.0 imports from Composer is in cadence (checked by
    :func:`test_name`) and its row says so."""
    status, notes = TABLE[(entry["module"], entry["name"])]
    assert status == "in cadence", f"{_id(entry)}: llm-foundry imports it, but it is left out"
    assert "used by llm-foundry" in notes, f"{_id(entry)}: its row lacks 'used by llm-foundry'"


def test_llm_foundry_imports_109_names() -> None:
    """llm-foundry 0.22.0's source imports 109 names from Composer (issue 33's count)."""
    assert sum(1 for e in ENTRIES if e.get("used_by")) == 109


def test_readme_lists_what_is_left_out() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Coming from Composer", 1)[1].split("\n## ", 1)[0]
    left_out = sorted(name for (_, name), (status, _) in TABLE.items() if status == "left out")
    missing = [name for name in left_out if f"`{name}`" not in section]
    assert not missing, f"README's 'Coming from Composer' does not name left-out {missing}"
