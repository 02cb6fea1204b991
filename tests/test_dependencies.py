"""Packages Composer ships that its users' code reaches through torch: ``tabulate``, which
``torch.fx.Graph.print_tabular`` (Composer's export example, llm-foundry's MPT code) needs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_tabulate_is_a_dependency_and_print_tabular_works(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "tabulate" for d in dependencies)
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    traced.graph.print_tabular()
    out = capsys.readouterr().out
    assert "opcode" in out and "call_module" in out
