"""`cadence launch` when things go wrong: the ranks die with a SIGKILLed launcher, a rank
that stops answering (SIGSTOP) ends the launch after ``dist_timeout`` with a message naming
it, and a killed rank is named with its signal before the survivors' gloo errors.

Each test starts a real 2-rank launch of a tiny DDP run that would train for a long time,
and is bounded by a few seconds past its ``dist_timeout`` (5 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Callback, State, dist

REPO = Path(__file__).resolve().parents[2]
DIST_TIMEOUT_S = 5


def tiny_dist_loader(batch_size: int) -> DataLoader:
    """64 samples of SimpleModel's shape, split over the ranks."""
    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(64, 8, generator=gen), torch.randint(0, 3, (64,),
                                                                             generator=gen))
    return DataLoader(dataset, batch_size=batch_size,
                      sampler=dist.get_sampler(dataset, shuffle=False))


class Beacon(Callback):
    """After batch 3 (DDP is up and training), write ``<rank>`` holding this rank's PID into
    ``folder``; slow each batch by ``sleep_s`` so the run lasts."""

    def __init__(self, folder: str, sleep_s: float = 0.02) -> None:
        self.folder, self.sleep_s = Path(folder), sleep_s

    def batch_end(self, state: State, logger: Any) -> None:
        if int(state.timestamp.batch) == 3:
            tmp = self.folder / f".{dist.get_global_rank()}"
            tmp.write_text(str(os.getpid()))
            tmp.rename(self.folder / str(dist.get_global_rank()))
        time.sleep(self.sleep_s)


RUN = """\
run_name: long
max_duration: 100000ba
global_train_batch_size: 4
progress_bar: false
dist_timeout: {timeout}
model: {{name: tests.common.models.SimpleModel}}
train_loader: {{name: tests.launch.test_launch_failures.tiny_dist_loader}}
callbacks:
  tests.launch.test_launch_failures.Beacon: {{folder: {beacons}}}
"""


def start_launch(tmp_path: Path) -> subprocess.Popen[str]:
    beacons = tmp_path / "beacons"
    beacons.mkdir()
    config = tmp_path / "long.yaml"
    config.write_text(RUN.format(timeout=DIST_TIMEOUT_S, beacons=beacons))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "cadence", "launch", "-n", "2", str(config)], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def worker_pids(tmp_path: Path, launch: subprocess.Popen[str]) -> dict[int, int]:
    """Rank -> PID once both ranks are training (fails with the launch output if it died)."""
    beacons = tmp_path / "beacons"

    def ready() -> bool:
        if launch.poll() is not None:
            output, _ = launch.communicate()
            raise AssertionError(f"the launch ended early:\n{output[-4000:]}")
        return (beacons / "0").is_file() and (beacons / "1").is_file()

    wait_for(ready, 120, "both ranks to train 3 batches")
    return {rank: int((beacons / str(rank)).read_text()) for rank in (0, 1)}


@pytest.fixture
def cleanup() -> Any:
    """Kill whatever a failed test leaves behind (by PID, never by name; only a process whose
    command line is still a cadence one, in case the PID was reused)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            if b"cadence" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")
def test_sigkill_on_the_launcher_kills_every_rank(tmp_path: Path, cleanup: list[int]) -> None:
    launch = start_launch(tmp_path)
    cleanup.append(launch.pid)
    pids = worker_pids(tmp_path, launch)
    cleanup.extend(pids.values())
    assert all(alive(pid) for pid in pids.values())

    os.kill(launch.pid, signal.SIGKILL)
    launch.communicate(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in pids.values()), 5,
             f"ranks {pids} to die with their launcher")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_stopped_rank_ends_the_launch_after_dist_timeout(
    tmp_path: Path, cleanup: list[int]
) -> None:
    launch = start_launch(tmp_path)
    cleanup.append(launch.pid)
    pids = worker_pids(tmp_path, launch)
    cleanup.extend(pids.values())

    os.kill(pids[1], signal.SIGSTOP)
    stopped_at = time.monotonic()
    output, _ = launch.communicate(timeout=DIST_TIMEOUT_S + 60)
    elapsed = time.monotonic() - stopped_at
    assert launch.returncode != 0, output[-4000:]
    # dist_timeout + 3 s for the answers + the processes' exits (8-20 s here; never without)
    assert elapsed < DIST_TIMEOUT_S + 40, f"the launch took {elapsed:.0f} s to end"
    assert "cadence: rank 0: a collective failed" in output, output[-4000:]
    assert "rank 1 did not answer (dist_timeout is 5 s" in output, output[-4000:]
    assert f"rank 1 (pid {pids[1]}) is stopped" in output, output[-4000:]
    assert not alive(pids[1]) and not alive(pids[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_killed_rank_is_named_with_its_signal_before_the_gloo_errors(
    tmp_path: Path, cleanup: list[int]
) -> None:
    launch = start_launch(tmp_path)
    cleanup.append(launch.pid)
    pids = worker_pids(tmp_path, launch)
    cleanup.extend(pids.values())

    os.kill(pids[1], signal.SIGKILL)
    output, _ = launch.communicate(timeout=DIST_TIMEOUT_S + 30)
    assert launch.returncode != 0, output[-4000:]
    named = f"cadence launch: rank 1 (pid {pids[1]}) was killed by SIGKILL (9)"
    assert named in output, output[-4000:]
    # rank 0's own error, if it prints one before torchrun stops it, comes after
    errors = [i for i in (output.find("Traceback"), output.find("cadence: rank 0"),
                          output.find("[rank0]")) if i >= 0]
    assert output.index(named) < min(errors, default=len(output)), output[-4000:]


@pytest.mark.world_size(2)
def test_survivors_name_the_rank_that_failed_and_the_one_that_is_silent() -> None:
    """The store protocol on real gloo ranks: rank 1 fails in its own code and records it;
    rank 0's collective then fails and names rank 1 with its error. In a second round rank 1
    stays silent, and rank 0 says so."""
    import contextlib
    import io

    from cadence.launch import rank_health

    rank = dist.get_global_rank()
    dist.barrier()
    if rank == 1:
        rank_health.report_collective_failure(RuntimeError("deliberate failure"), 5)
    dist.barrier()
    if rank == 0:
        out = io.StringIO()
        with contextlib.redirect_stderr(out):
            rank_health.report_collective_failure(
                RuntimeError("[gloo] Connection closed by peer"), 5)
        assert out.getvalue().startswith("cadence: rank 0: a collective failed (RuntimeError: "
                                         "[gloo] Connection closed by peer); rank 1 failed with "
                                         "RuntimeError: deliberate failure (dist_timeout is 5 s")
        # a new attempt's keys: nobody else answers this time
        os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
        out = io.StringIO()
        start = time.monotonic()
        with contextlib.redirect_stderr(out):
            rank_health.report_collective_failure(RuntimeError("Timed out waiting 5000ms"), 5)
        assert "rank 1 did not answer" in out.getvalue()
        assert rank_health.ANSWER_WAIT_S <= time.monotonic() - start < 10
    dist.barrier()


EXIT_SCRIPT = """
import atexit, sys
import torch.distributed as torch_dist
# registered first, so it runs last: after cadence's hook
atexit.register(lambda: print("initialized at exit:", torch_dist.is_initialized(), flush=True))
from cadence.utils import dist
torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
dist.destroy_process_group_at_exit()
dist.destroy_process_group_at_exit()  # registered once
torch_dist.barrier()
if sys.argv[1] == "fail":
    raise RuntimeError("the run failed")
"""


@pytest.mark.parametrize("ending", ["clean", "fail"])
def test_process_group_is_destroyed_at_a_clean_exit_only(ending: str) -> None:
    """A run that ends normally destroys its process group before Python finalizes (else a
    gloo thread still releasing the last barrier's tensors aborts the process with SIGABRT,
    which failed a 2-node launch in CI); after an uncaught exception the group is left
    alone, so a collective stuck on a dead peer cannot hold the exit for ``dist_timeout``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, ending], env=env, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == (0 if ending == "clean" else 1), proc.stderr
    assert proc.stdout.count("initialized at exit:") == 1
    assert f"initialized at exit: {ending == 'fail'}" in proc.stdout, proc.stdout


EXIT_NOW_SCRIPT = """
import atexit, sys
import torch.distributed as torch_dist
from cadence.cli import exit_now

class Finalized:
    def __del__(self):
        print("finalized", flush=True)

keep = Finalized()
atexit.register(lambda: print("atexit ran", flush=True))
import threading, time
threading.Thread(target=lambda: (time.sleep(0.5), print("thread joined", flush=True))).start()
if sys.argv[1] == "group":
    torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
sys.stdout.write("buffered line\\n")  # not flushed: must still reach the pipe
exit_now(3)
"""


@pytest.mark.parametrize("group", ["group", "none"])
def test_cadence_exits_without_finalizing_once_a_process_group_exists(group: str) -> None:
    """``cadence``'s entry point keeps its exit status, joins non-daemon threads, runs the
    atexit handlers and flushes its output either way, and skips the interpreter's
    finalization (where a gloo thread can abort the process) only when a process group was
    created."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", EXIT_NOW_SCRIPT, group], env=env, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "atexit ran" in proc.stdout and "buffered line" in proc.stdout, proc.stdout
    assert proc.stdout.index("thread joined") < proc.stdout.index("atexit ran")
    assert ("finalized" in proc.stdout) == (group == "none"), proc.stdout
