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
               "--markdown"]
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
                          "--startup-trials", "0", "--import-trials", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "0.93 M parameters" in out
    assert "after training: 0 " in out
    assert out.count("\nraw ") == 1 and "\nbare " in out and "\ntrainer " in out


def test_profile_mode(capsys):
    overhead = load_overhead()
    assert overhead.main(["--profile", "bare", "--size", "null", "--steps", "3",
                          "--warmup", "1"]) == 0
    assert "function calls" in capsys.readouterr().out


def test_bad_arguments_are_refused():
    overhead = load_overhead()
    with pytest.raises(SystemExit):
        overhead.parse_args(["--rounds", "0"])
