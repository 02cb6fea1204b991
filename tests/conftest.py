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


def pytest_pyfunc_call(pyfuncitem):  # type: ignore[no-untyped-def]
    """Run ``@pytest.mark.world_size(n)`` tests (n > 1) in n real gloo processes."""
    marker = pyfuncitem.get_closest_marker("world_size")
    if marker is None or int(marker.args[0]) <= 1:
        return None
    from tests.common.distributed import run_in_processes

    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    run_in_processes(int(marker.args[0]), str(pyfuncitem.path), pyfuncitem.obj.__qualname__, kwargs)
    return True


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():  # type: ignore[no-untyped-def]
    """Each test starts without a process group: a single-process FSDP2/TP run creates a
    private one-rank group (see ``cadence.parallel.plan``), which would otherwise make
    later tests in this process see world size 1 whatever ``WORLD_SIZE`` says."""
    yield
    import sys

    if "torch.distributed" in sys.modules:
        import torch.distributed as torch_dist

        if torch_dist.is_available() and torch_dist.is_initialized() \
                and torch_dist.get_world_size() == 1:
            torch_dist.destroy_process_group()
