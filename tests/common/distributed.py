"""Run a test function in N real processes (gloo on CPU), the way torchrun would.

``@pytest.mark.world_size(2)`` on a test makes the conftest hook call :func:`run_in_processes`
instead of the test: each process gets torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), creates the gloo process group, imports
the test module from its file and calls the test with the same arguments. A failure on
any rank fails the test with that rank's traceback; a hang fails it after ``timeout``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

__all__ = ["find_free_port", "run_in_processes"]


def find_free_port() -> int:
    """A TCP port on localhost that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child(rank: int, world_size: int, port: int, module_path: str, qualname: str,
           kwargs: dict[str, Any], error_dir: str) -> None:
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
    })
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        repo_root = str(Path(module_path).resolve().parents[0])
        for parent in Path(module_path).resolve().parents:
            if (parent / "pyproject.toml").exists():
                repo_root = str(parent)
                break
        if repo_root not in sys.path:
            sys.path.insert(0, repo_root)
        spec = importlib.util.spec_from_file_location(f"_dist_test_{rank}", module_path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = module
        for part in qualname.split("."):
            fn = getattr(fn, part)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        fn(**kwargs)
        Path(error_dir, f"rank{rank}.ok").touch()
    except BaseException:
        Path(error_dir, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Skip interpreter teardown: gloo's threads occasionally abort it ("terminate called
    # without an active exception") after the test has passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_in_processes(world_size: int, module_path: str, qualname: str, kwargs: dict[str, Any],
                     timeout: float = 300.0) -> None:
    """Run ``module_path::qualname(**kwargs)`` on ``world_size`` spawned ranks.

    Raises:
        AssertionError: a rank failed (its traceback is in the message) or the run hung.
    """
    error_dir = tempfile.mkdtemp(prefix="cadence-dist-errors-")
    context = mp.start_processes(
        _child, args=(world_size, find_free_port(), module_path, qualname, kwargs, error_dir),
        nprocs=world_size, join=False, start_method="spawn",
    )
    try:
        import time

        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise AssertionError(f"{qualname} hung on {world_size} ranks for {timeout:.0f} s.")
    except mp.ProcessRaisedException as exc:  # pragma: no cover - _child writes its own
        raise AssertionError(str(exc)) from None
    except mp.ProcessExitedException as exc:
        finished = {p.stem for p in Path(error_dir).glob("rank*.ok")}
        reports = sorted(Path(error_dir).glob("rank*.txt"))
        if len(finished) == world_size and not reports:
            return  # every rank passed; one died in teardown after its test finished
        detail = "\n".join(f"--- {p.stem} ---\n{p.read_text()}" for p in reports)
        raise AssertionError(f"{qualname} failed on {world_size} ranks ({exc}; ranks that "
                             f"finished: {sorted(finished)}):\n{detail}") from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
