"""``benchmarks/recovery.py`` (time to recovery after a preemption): its run files, and one
real cycle end to end (a quickstart run started, SIGTERM'd, relaunched with autoresume); no
timing is asserted, only that the figures exist and the checkpoint holds what it must."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "recovery.py"


def load_script() -> Any:
    name = "cadence_bench_recovery"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses need it
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_run_files_and_model_sizes(tmp_path: Path) -> None:
    bench = load_script()
    small = bench.run_config("quickstart", "full", 1, tmp_path / "run")
    assert small["autoresume"] is True and small["save_state_dict_type"] == "full"
    assert small["log_interval"] == "1ba" and "eval_loader" not in small
    assert "parallelism_config" not in small and "variables" not in small
    big = bench.run_config("100m", "sharded", 2, tmp_path / "run")
    assert big["model"]["n_layer"] == 12 and big["model"]["n_embd"] == 768
    assert big["device_train_microbatch_size"] == 1  # 2 sequences a batch over 2 ranks
    assert big["parallelism_config"] == {"fsdp": {"sharding_strategy": "FULL_SHARD"}}
    # the GPT-2s of the quickstart (2.6 M) and of benchmarks/checkpoint.py (92 M)
    assert round(bench.parameter_count("quickstart") / 1e6, 1) == 2.6
    assert round(bench.parameter_count("100m") / 1e6) == 92


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script()
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--ranks", "4"])
    args = bench.parse_args(["--quick"])
    assert (args.models, args.ranks, args.repeats) == (["quickstart"], [1], 1)


@pytest.mark.slow
def test_one_preemption_and_relaunch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Start, SIGTERM (exit 143 checked by the script), relaunch, first new batch (the one
    after the checkpoint's, checked by the script), SIGTERM again; the row has every figure."""
    bench = load_script()
    assert bench.main(["--quick", "--formats", "full", "--quiet", "--markdown",
                       "--timeout", "240", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| quickstart "))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1:4] == ["2.6", "full", "1"]
    # a full checkpoint holds the fp32 parameters and AdamW's two moments: >= 3 x 4 bytes each
    assert float(cells[4]) * 2**20 >= 12 * bench.parameter_count("quickstart")
    assert cells[5] == "1"
    assert float(cells[6]) > 0 and float(cells[8]) > 0
    assert not list(tmp_path.iterdir())  # its runs are removed
