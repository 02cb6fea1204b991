"""``benchmarks/overhead.py`` runs end to end (a few steps; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "overhead.py"


def load_overhead():
    """The script as a module (registered in sys.modules: its dataclasses need that)."""
    name = "cadence_bench_overhead"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_overhead_script_runs_and_prints_the_table():
    """The whole script as a user runs it, startup children included (the import-time
    trials are left out: each is two more interpreter starts)."""
    command = [sys.executable, str(SCRIPT), "--size", "null", "--rounds", "2", "--steps", "2",
               "--warmup", "1", "--startup-trials", "1", "--import-trials", "0", "--quiet",
               "--markdown", "--process-rounds", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for row in ("| raw |", "| trainer |", "| bare |"):
        assert row in out
    assert "ratio to raw" in out and "peak RSS MB" in out
    assert "first step s" in out and "| - |" not in out  # startup figures were filled in
    assert "largest |parameter difference| between arms after training: 0 " in out


def test_small_model_in_process(capsys):
    """The default model, in process (no subprocesses): every arm trains the same weights."""
    overhead = load_overhead()
    assert overhead.main(["--rounds", "1", "--steps", "2", "--warmup", "1",
                          "--startup-trials", "0", "--import-trials", "0", "--quiet",
                          "--process-rounds", "0"]) == 0
    out = capsys.readouterr().out
    assert "0.93 M parameters" in out
    assert "after training: 0 " in out
    assert out.count("\nraw ") == 1 and "\nbare " in out and "\ntrainer " in out


def test_process_arms_reach_the_same_loss():
    """The Hugging Face whole-process arms (one fresh interpreter per arm): each prints its
    row, and all three end at the same loss (the same arithmetic)."""
    command = [sys.executable, str(SCRIPT), "--process-only", "--process-rounds", "1",
               "--process-steps", "3", "--process-warmup", "1", "--quiet", "--markdown"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip()
            for line in result.stdout.splitlines() if line.startswith("| ")
            and not line.startswith("| arm ")}
    assert set(rows) == {"raw", "bare", "logging"}
    assert len(set(rows.values())) == 1 and "," not in rows["raw"]  # one final loss for all
    float(rows["raw"])


def test_profile_mode(capsys):
    overhead = load_overhead()
    assert overhead.main(["--profile", "bare", "--size", "null", "--steps", "3",
                          "--warmup", "1"]) == 0
    assert "function calls" in capsys.readouterr().out


def test_bad_arguments_are_refused():
    overhead = load_overhead()
    with pytest.raises(SystemExit):
        overhead.parse_args(["--rounds", "0"])


# ----------------------------------------------------------------------------- gpu_throughput
# benchmarks/gpu_throughput.py needs a GPU to measure anything; here: its arithmetic, its
# message without CUDA, and its whole code path on the CPU with a tiny model.
GPU_SCRIPT = REPO / "benchmarks" / "gpu_throughput.py"


def load_gpu_throughput():
    name = "cadence_bench_gpu_throughput"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, GPU_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_gpt2_124m_flops_per_token():
    bench = load_gpu_throughput()
    # gpt2() defaults: V*d + P*d + L*(12 d^2 + 13 d) + 2 d parameters (tied embeddings).
    V, P, d, L = 50257, 1024, 768, 12
    total = V * d + P * d + L * (12 * d * d + 13 * d) + 2 * d
    assert total == 124_439_808
    n = bench.matmul_params(total, P, d)
    assert n == 123_653_376  # without the position embedding, as nanoGPT counts
    assert bench.flops_per_token(n, L, d, P) == 6 * n + 12 * L * d * P == 855_166_464


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H200", 989.4), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.5), ("NVIDIA A100-SXM4-80GB", 312.0), ("Tesla T4", None),
])
def test_peak_lookup(name, peak):
    assert load_gpu_throughput().peak_tflops(name) == peak


def test_gpu_throughput_without_cuda_says_so(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_gpu_throughput().main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


def test_gpu_throughput_plumbing_on_cpu():
    """Every configuration's code path (compile per block, FSDP2 on one rank) with a tiny
    model on the CPU; they train the same weights, so they end at the same loss."""
    command = [sys.executable, str(GPU_SCRIPT), "--device", "cpu", "--n-layer", "2",
               "--n-embd", "32", "--n-head", "2", "--seq-len", "16", "--vocab-size", "128",
               "--batch-size", "2", "--precision", "fp32", "--compile-backend", "aot_eager",
               "--steps", "2", "--warmup", "1", "--configs", "eager,fsdp+compile"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("eager ", "fsdp+compile "))]
    assert [r[0] for r in rows] == ["eager", "fsdp+compile"]
    assert rows[0][-1] == rows[1][-1]  # the loss column
