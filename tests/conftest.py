"""Test-wide settings: no hub access, offline wandb, a per-session data cache."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tokenized corpora are cached once per test session unless the caller (CI) names a cache.
if "CADENCE_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CADENCE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cadence-test-cache-")
