"""``benchmarks/algorithms.py`` end to end at a tiny size: each method trains until its
budget (here: after the first step), is scored on held-out batches, and lands in the table
(no perplexity is compared: one step trains nothing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "algorithms.py"


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("cadence_bench_algorithms", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_budget_stops_each_run_and_the_table_lists_every_method(
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script()
    results = bench.main(["--methods", "baseline", "stacked", "--seeds", "1",
                          "--budget-s", "0.001", "--max-batches", "4", "--eval-batches", "1",
                          "--markdown"])
    assert [r["steps"] for r in results["baseline"] + results["stacked"]] == [1.0, 1.0]
    # the stacked run's first step: 8-token rows (warm-up), so fewer tokens than the baseline
    assert 0 < results["stacked"][0]["tokens_s"]
    out = capsys.readouterr().out
    assert "| baseline | " in out and "| stacked | " in out and "vs baseline" in out


def test_run_file_adds_each_method_to_the_quickstart_clipping() -> None:
    bench = load_script()
    args = bench.argparse.Namespace(max_batches=70)
    cfg = bench.run_config(args, "stacked", 3)
    assert set(cfg["algorithms"]) == {"gradient_clipping", "seq_length_warmup",
                                      "label_smoothing", "alibi", "selective_backprop"}
    assert cfg["seed"] == 3 and cfg["max_duration"] == "70ba"
    assert cfg["scheduler"]["t_warmup"] == "10ba"
    assert bench.run_config(args, "baseline", 1)["algorithms"] == {
        "gradient_clipping": {"clipping_type": "norm", "clipping_threshold": 1.0}}
