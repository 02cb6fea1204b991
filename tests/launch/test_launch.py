"""`cadence launch -n 2` trains on real text with FSDP2; a failing rank ends the launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "max_duration=3ba",
        "eval_interval=3ba", "eval_subset_num_batches=1", "log_interval=1ba",
        "global_train_batch_size=4", "device_eval_batch_size=4"]


def launch(tmp_path: Path, config: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "cadence", "launch", "-n", "2", str(config), *TINY,
           f"save_folder={tmp_path / 'run'}", *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_launch_two_ranks_fsdp_on_real_text(tmp_path: Path) -> None:
    proc = launch(tmp_path, REPO / "yamls" / "gpt_fsdp.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "FSDP2 wrap plan: strategy FULL_SHARD, mesh (2,)" in proc.stdout
    assert proc.stdout.count("FSDP2 wrap plan") == 1  # rank 0 only
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    steps = [r["step"] for r in records if "loss/train/total" in r]
    assert steps == [1, 2, 3]  # one writer: rank zero
    assert any("metrics/eval/LanguagePerplexity" in r for r in records)


def test_a_failing_rank_ends_the_launch_promptly(tmp_path: Path) -> None:
    config = tmp_path / "failing.yaml"
    config.write_text((REPO / "yamls" / "gpt_fsdp.yaml").read_text().replace(
        "callbacks:\n", "callbacks:\n  tests.common.failing.FailOnRank: {rank: 1, batch: 2}\n"))
    start = time.monotonic()
    proc = launch(tmp_path, config, "max_duration=20ba")
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert "deliberate failure on rank 1 at batch 2" in output
    assert "Traceback" in output
    assert elapsed < 90, f"the launch took {elapsed:.0f} s to end"
