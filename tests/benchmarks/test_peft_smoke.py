"""``benchmarks/peft_methods.py`` end to end at a tiny size: the three MiniLM methods, each in its own
process, with their trainable parameters and checkpoint sizes; and the KJV pipeline's five
commands, the perplexities and the samples (no accuracy or perplexity asserted: a few batches
train nothing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peft_methods.py"


@pytest.mark.slow
def test_peft_benchmark_runs_both_parts(tmp_path: Path) -> None:
    cache = tmp_path / "runs.jsonl"
    args = [sys.executable, str(SCRIPT), "--grid-seeds", "--seeds", "1", "--epochs", "1",
            "--num-train", "32", "--num-dev", "32", "--num-test", "32", "--cache", str(cache),
            "--kjv-dir", str(tmp_path / "kjv"), "--kjv-pretrain-batches", "2",
            "--kjv-lora-batches", "2", "--kjv-num-val", "40", "--kjv-new-tokens", "4"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    runs = {r["result"]["method"]: r["result"]
            for r in map(json.loads, cache.read_text().splitlines())}
    assert sorted(runs) == ["child_tuning_D", "full", "lora"]
    # LoRA r=8 on query/value plus the new head: 0.33 % of MiniLM's weights
    assert runs["lora"]["trainable"] / runs["lora"]["params"] < 0.01
    assert runs["full"]["trainable"] == runs["full"]["params"]
    assert runs["lora"]["checkpoint_mib"] < 0.05 * runs["full"]["checkpoint_mib"]
    assert all(r["peak_rss_mib"] > 100 and r["s_per_step"] > 0 for r in runs.values())
    assert "| lora | 0.0008 |" in out and "| lora - full |" in out
    ppl = re.findall(r"\| (?:Shakespeare GPT \(before\)|merged LoRA \(after\)) \| ([\d.]+) \|",
                     out)
    assert len(ppl) == 2 and all(float(p) > 1 for p in ppl), out[-2000:]
    assert out.count("| And the LORD spake") + out.count("| Blessed are") == 2
    for folder in ("shakespeare-gpt", "kjv-adapter", "kjv-merged"):
        assert (tmp_path / "kjv" / "runs" / folder).is_dir(), folder
