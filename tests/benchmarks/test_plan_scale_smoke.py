"""``benchmarks/plan_scale.py`` runs end to end on a toy Llama shape (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_plan_scale_prints_one_row_per_shape() -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_scale.py"),
                          "--shapes", "tiny", "--world-size", "16", "--tp", "2"],
                         capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert len(rows) == 1 and rows[0][:2] == ["tiny", "16"]
    assert rows[0][-1] == "fits"
