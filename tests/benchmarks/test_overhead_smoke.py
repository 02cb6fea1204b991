"""The benchmark scripts run end to end (a few steps; no timing is asserted): the Trainer's
overhead per step (``overhead.py``), time to the first step and peak RSS
(``first_step.py``), import time (``import_time.py``), the whole-process Hugging Face arms
(``overhead_process.py``), the shared RSS method (``_common.py``), and ``gpu_throughput.py``'s
arithmetic and CPU path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SCRIPT = BENCHMARKS / "overhead.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def load_script(stem: str):
    """``benchmarks/<stem>.py`` as a module (registered in sys.modules: its dataclasses need
    that)."""
    name = f"cadence_bench_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{stem}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def load_overhead():
    return load_script("overhead")


def run_script(stem: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python benchmarks/<stem>.py ARGS`` as a user runs it, from the repository root."""
    return subprocess.run([sys.executable, str(BENCHMARKS / f"{stem}.py"), *args],
                          capture_output=True, text=True, cwd=REPO, env=ENV, timeout=timeout)


def markdown_rows(out: str) -> dict[str, list[str]]:
    """A markdown table's body rows, by their first cell."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| arm ")
            and not line.startswith("| command ")]
    return {row[0]: row[1:] for row in rows}


def test_overhead_script_runs_and_prints_the_table():
    """The steady-state script as a user runs it."""
    result = run_script("overhead", "--size", "null", "--rounds", "2", "--steps", "2",
                        "--warmup", "1", "--quiet", "--markdown")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert set(markdown_rows(out)) == {"raw", "trainer", "bare"}
    assert "ratio to raw" in out and "CPU ratio" in out
    assert "largest |parameter difference| between arms after training: 0 " in out


def test_small_model_in_process(capsys):
    """The default model, in process (no subprocesses): every arm trains the same weights."""
    overhead = load_overhead()
    assert overhead.main(["--rounds", "1", "--steps", "2", "--warmup", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "0.93 M parameters" in out
    assert "after training: 0 " in out
    assert out.count("\nraw ") == 1 and "\nbare " in out and "\ntrainer " in out


def test_profile_mode(capsys):
    overhead = load_overhead()
    assert overhead.main(["--profile", "bare", "--size", "null", "--steps", "3",
                          "--warmup", "1"]) == 0
    assert "function calls" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys):
    overhead = load_overhead()
    with pytest.raises(SystemExit):
        overhead.parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):  # a flag of the old all-in-one script names its new home
        overhead.parse_args(["--process-only"])
    assert "benchmarks/overhead_process.py" in capsys.readouterr().err


def test_first_step_script_fills_every_column():
    """One fresh process per arm: time to the first step and a peak RSS for each."""
    result = run_script("first_step", "--size", "null", "--trials", "1", "--warmup", "2",
                        "--quiet", "--markdown")
    assert result.returncode == 0, result.stderr
    rows = markdown_rows(result.stdout)
    assert set(rows) == {"raw", "trainer", "bare"}
    for cells in rows.values():  # import s, construct s, first step s, peak RSS MiB
        assert all(float(c) >= 0 for c in cells[:3])
        assert float(cells[3]) > 100  # torch is imported: far above the spawner's ~8 MiB
    # the raw process never imports cadence, so it holds less
    assert float(rows["raw"][3]) < float(rows["trainer"][3])


def test_import_time_script_runs():
    result = run_script("import_time", "--trials", "1", "--markdown")
    assert result.returncode == 0, result.stderr
    assert "| `import torch, cadence` |" in result.stdout
    assert result.stdout.count("| `") == 4


def test_process_arms_reach_the_same_loss():
    """The Hugging Face whole-process arms (one fresh interpreter per arm): each prints its
    row, and all three end at the same loss (the same arithmetic)."""
    result = run_script("overhead_process", "--rounds", "1", "--steps", "3", "--warmup", "1",
                        "--quiet", "--markdown")
    assert result.returncode == 0, result.stderr
    rows = {name: cells[-1] for name, cells in markdown_rows(result.stdout).items()}
    assert set(rows) == {"raw", "bare", "logging"}
    assert len(set(rows.values())) == 1 and "," not in rows["raw"]  # one final loss for all
    float(rows["raw"])


# ----------------------------------------------------------------------------- peak RSS
def test_peak_rss_is_the_child_own_not_the_parent():
    """The one RSS method (benchmarks/_common.py): a child started by a process holding
    200 MiB reports its own few MiB, and a child that touches 100 MiB reports about that."""
    common = load_script("_common")
    ballast = bytearray(200 * 2**20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])  # resident, not just reserved
    small = common.measure_command([sys.executable, "-c", "pass"])
    big = common.measure_command([sys.executable, "-c",
                                  "x = bytearray(100 * 2**20); x[::4096] = b'1' * len(x[::4096])"])
    del ballast
    assert small.returncode == 0 and 1 < small.peak_mib < 60
    assert 100 < big.peak_mib < 100 + 60
    assert small.wall_s > 0
    done = common.measure_command([sys.executable, "-c", "print('out'); raise SystemExit(3)"],
                                  capture_output=True)
    assert (done.returncode, done.stdout) == (3, "out\n")


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


def test_compare_two_trees_prints_ratios_and_calls_per_step():
    """``--compare DIR`` runs the benchmark in alternating children on DIR's cadence and this
    tree's (here the same tree twice, so the call counts agree), on the tiny
    MLP."""
    result = run_script("overhead", "--size", "mlp", "--rounds", "1", "--steps", "2",
                        "--warmup", "1", "--calls-steps", "10", "--log-interval", "5",
                        "--compare", str(REPO), "--repeats", "1", "--markdown",
                        timeout=900)  # two child processes, each importing torch and cadence
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tiny MLP" in out and "Python calls/step" in out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| base ") or line.startswith("| this ")]
    calls = {(row[0], row[1]): float(row[-1]) for row in rows}
    assert set(calls) == {(tree, arm) for tree in ("base", "this")
                          for arm in ("raw", "trainer", "bare")}
    for arm in ("raw", "trainer", "bare"):
        assert calls[("base", arm)] == pytest.approx(calls[("this", arm)], rel=0.02)
    assert calls[("this", "bare")] > calls[("this", "raw")]
