"""The quickstart run through the real CLI, for a few batches."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_smoke_run_through_the_cli(tmp_path: Path) -> None:
    save_folder = tmp_path / "run"
    cmd = [sys.executable, "-m", "cadence", "train", str(REPO / "yamls" / "quickstart.yaml"),
           "max_duration=4ba", "eval_interval=2ba", "eval_subset_num_batches=2",
           "log_interval=2ba", f"save_folder={save_folder}", "run_name=smoke"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the console logger writes to stderr by default (Composer's console_stream)
    assert "metrics/eval/LanguagePerplexity" in proc.stderr
    assert "\r" not in proc.stderr  # not a terminal: plain lines
    records = [json.loads(line) for line in (save_folder / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss/train/total"] for r in records if "loss/train/total" in r]
    assert [r["step"] for r in records if "loss/train/total" in r] == [1, 2, 4]
    # An untrained model over a 4096-token vocabulary starts near ln(4096) = 8.32 nats.
    assert abs(losses[0] - math.log(4096)) < 0.5
    evals = [r for r in records if "metrics/eval/LanguagePerplexity" in r]
    assert [r["step"] for r in evals] == [2, 4]
    hparams = json.loads((save_folder / "hparams.json").read_text())
    assert hparams["run_name"] == "smoke" and hparams["model"]["name"] == "gpt2"


def test_bad_override_fails_before_any_work(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "cadence", "train", str(REPO / "yamls" / "quickstart.yaml"),
           "model.n_layers=2", "precision=bf16"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "model.n_layers" in proc.stderr and "n_layer" in proc.stderr
    assert "'bf16'" in proc.stderr and "amp_bf16" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
