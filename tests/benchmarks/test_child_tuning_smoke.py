"""``benchmarks/child_tuning.py`` runs its whole protocol end to end at a tiny size: the
learning-rate grid on the dev split, the paired seeds on the test split, the tables, and the
cache that lets an interrupted run resume (no accuracy is asserted: 2 batches train nothing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "child_tuning.py"
TINY = ["--methods", "vanilla", "D", "--lrs", "1e-4", "2e-4", "--grid-seeds", "7",
        "--seeds", "1", "2", "--epochs", "1", "--num-train", "32", "--num-dev", "32",
        "--num-test", "48"]


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("cadence_bench_child_tuning", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# 10 % warmup of 2 batches rounds to none, which the scheduler warns about
@pytest.mark.filterwarnings("ignore:The warmup duration is 0")
def test_protocol_prints_grid_results_and_paired_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_script()
    cache = tmp_path / "runs.jsonl"
    bench.main([*TINY, "--cache", str(cache)])
    out = capsys.readouterr().out
    # 2 methods x 2 rates on the grid seed, then 2 methods x 2 seeds at the chosen rates
    assert len(cache.read_text().splitlines()) == 8
    assert "| vanilla | " in out and "| D | " in out
    assert "| D - vanilla | " in out and "/ 2 |" in out
    grid = next(line for line in out.splitlines() if line.startswith("| D | ") and "%" in line)
    assert grid.count("%") == 2  # one dev accuracy per grid rate, then the chosen rate

    bench.main([*TINY, "--cache", str(cache)])  # a rerun trains nothing: every run is cached
    again = capsys.readouterr().out
    assert again.count(": cached") == 8
    assert len(cache.read_text().splitlines()) == 8
    assert again.split("paired seeds:")[1] == out.split("paired seeds:")[1]
