"""The light index of registered components (cadence.config.registry_index) is in sync with
the registries, and the run-file check's first stage reads it instead of importing."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import pytest

from cadence.config import registry_index
from cadence.registry import registry
from cadence.config.registry_index import (
    DATA_FILE, REGENERATE, build_index, component_spec, load_index, render_index,
)


def test_checked_in_index_matches_the_registries() -> None:
    current = DATA_FILE.read_text()
    assert render_index(build_index()) == current, (
        f"{DATA_FILE.name} is out of date (a component was registered, removed or its "
        f"signature changed); regenerate it with: {REGENERATE}")


def test_loaded_index_is_the_generated_one() -> None:
    index = load_index()
    assert set(index) == set(registry_index.REGISTRIES)
    for kind, attr in registry_index.REGISTRIES.items():
        assert sorted(index[kind]) == getattr(registry, attr).names()
    assert index["model"]["gpt2"] == component_spec(registry.models.get("gpt2"))


def test_a_new_or_changed_component_puts_the_index_out_of_date(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def test_index_callback(window: int = 3, test_mode: Literal["a", "b"] = "a",
                            label: Optional[str] = None) -> None: ...

    monkeypatch.setitem(registry.callbacks._entries, "test_index_callback", test_index_callback)
    text = render_index(build_index())
    assert text != DATA_FILE.read_text()
    line = next(line for line in text.splitlines() if "'name': 'test_mode'" in line)
    assert "'accept': ['a', 'b']" in line and "'choices': ['a', 'b']" in line


def test_check_mode_names_the_regenerate_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "registry_index_data.py"
    stale.write_text('INDEX = {}\n')
    monkeypatch.setattr(registry_index, "DATA_FILE", stale)
    assert registry_index.main(["--check"]) == 1
    assert f"run: {REGENERATE}" in capsys.readouterr().err
    assert registry_index.main(["--write"]) == 0
    assert registry_index.main(["--check"]) == 0
    assert stale.read_text() == DATA_FILE.read_text()


def test_a_component_without_a_signature_is_not_checked() -> None:
    # some builtins have none: their arguments are left to the constructor
    from cadence.config.schema import SINGLE_SECTIONS, argument_problems

    spec = component_spec(max)
    assert spec == {"target": "builtins.max", "params": None}
    assert argument_problems("model", "model", "max", spec, {"anything": 1},
                             SINGLE_SECTIONS["model"]) == []
