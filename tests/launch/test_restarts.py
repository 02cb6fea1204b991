"""`cadence launch --max_restarts N`: a rank SIGKILLed mid-run (once, on the first attempt)
makes torchrun restart the whole group, which autoresumes from the newest checkpoint, takes
the save folder's lock over from its own dead attempt, and finishes with the loss curve of a
run that was never interrupted; with ``--max_restarts 0`` the same kill fails the launch
promptly. Plus the small pieces (the restart line, each attempt's first error, the lock's
same-run rule) without processes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cadence import State, dist
from cadence.checkpoint import lock as lock_module
from cadence.launch.restarts import AttemptRecorder, announce_restart, first_error
from tests.common.killing import KillAt

REPO = Path(__file__).resolve().parents[2]
TOTAL = 24  # batches: 1.5 epochs of the 64-sample loader at 4 per batch


class KillRankAt(KillAt):
    """:class:`~tests.common.killing.KillAt` on one rank only (the marker makes it once);
    every rank of a restarted group writes the time of its first batch to ``first-batch``."""

    def __init__(self, marker_dir: str, rank: int, batches: list[int]) -> None:
        super().__init__(marker_dir, batches=batches)
        self.rank = rank

    def batch_end(self, state: State, logger: Any) -> None:
        restarted = self.marker_dir / "first-batch"
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and not restarted.exists():
            restarted.write_text(f"{time.time()}\n")
        if dist.get_global_rank() == self.rank:
            super().batch_end(state, logger)


def run_file(tmp_path: Path, name: str, kill_at: int | None) -> Path:
    lines = [
        "run_name: restarted", "seed: 5", f"max_duration: {TOTAL}ba",
        "global_train_batch_size: 4", "progress_bar: false", "log_interval: 1ba",
        "dist_timeout: 20",
        "model: {name: tests.common.models.SimpleModel}",
        "train_loader: {name: tests.launch.test_launch_failures.tiny_dist_loader}",
        "optimizer: {name: adamw, lr: 0.01}",
        "loggers: {file: {}}",
        f"save_folder: {tmp_path / name}", "save_interval: 4ba", "autoresume: true",
    ]
    if kill_at is not None:
        lines += ["callbacks:", "  tests.launch.test_restarts.KillRankAt:",
                  f"    {{marker_dir: {tmp_path / 'markers'}, rank: 1, batches: [{kill_at}]}}"]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def launch(config: Path, max_restarts: int) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cadence", "launch", "-n", "2",
                           "--max_restarts", str(max_restarts), str(config)],
                          cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=400)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def loss_curve(folder: Path) -> dict[int, float]:
    """The last logged training loss of every step (a restarted group logs some again)."""
    curve: dict[int, float] = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss/train/total" in record:
            curve[record["step"]] = record["loss/train/total"]
    return curve


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun's agent, /proc")
def test_a_killed_rank_restarts_the_group_which_finishes_the_uninterrupted_curve(
    tmp_path: Path
) -> None:
    rc, out, _ = launch(run_file(tmp_path, "straight", None), 0)
    assert rc == 0, out[-4000:]
    straight = loss_curve(tmp_path / "straight")
    assert sorted(straight) == list(range(1, TOTAL + 1))

    rc, out, elapsed = launch(run_file(tmp_path, "killed", kill_at=10), 2)
    assert rc == 0, out[-6000:]
    killed_at = (tmp_path / "markers" / "batch_end-ba10").stat().st_mtime
    recovery = float((tmp_path / "markers" / "first-batch").read_text()) - killed_at
    print(f"launch {elapsed:.1f} s; kill -> first batch of the restarted group "
          f"{recovery:.1f} s")
    assert "cadence launch: rank 1 (pid" in out and "was killed by SIGKILL" in out, out[-6000:]
    assert ("cadence: restart 1 of 2 after attempt 0 failed: rank 1 was killed by SIGKILL (9)"
            in out), out[-6000:]
    assert "restart 2 of 2" not in out
    assert "Resumed from checkpoint" in out, out[-6000:]
    assert "in use by" not in out, out[-6000:]  # no false "another run holds this folder"
    assert loss_curve(tmp_path / "killed") == straight  # bit for bit, every step


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun's agent, /proc")
def test_without_restarts_the_same_kill_fails_promptly(tmp_path: Path) -> None:
    rc, out, elapsed = launch(run_file(tmp_path, "killed", kill_at=3), 0)
    assert rc == 1, out[-4000:]
    assert "was killed by SIGKILL" in out, out[-4000:]
    assert "cadence: restart" not in out
    assert elapsed < 90, f"the launch took {elapsed:.0f} s to end"


def test_the_restart_line_names_the_count_and_the_reason() -> None:
    out = io.StringIO()
    env = {"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3", "RANK": "0",
           "CADENCE_RESTART_REASON": "attempt 0 failed: rank 1 was killed by SIGKILL (9)"}
    line = announce_restart(env, out)
    assert line == out.getvalue().strip()
    assert line.startswith("cadence: restart 1 of 3 after attempt 0 failed: rank 1 was killed")
    assert announce_restart({**env, "RANK": "1"}, out) is None  # rank 0 only
    assert announce_restart({**env, "TORCHELASTIC_RESTART_COUNT": "0"}, out) is None
    assert "did not finish" in str(announce_restart(
        {k: v for k, v in env.items() if k != "CADENCE_RESTART_REASON"}, io.StringIO()))


def failure(exitcode: int, timestamp: int, message: Any = "") -> SimpleNamespace:
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, message=message)


def test_each_attempts_first_error_is_summarised() -> None:
    recorder = AttemptRecorder()
    recorder.record(0, {0: failure(1, 100, {"message": "RuntimeError: [gloo] closed"}),
                        1: failure(-9, 100)})
    recorder.record(0, {0: failure(1, 101)})  # the same attempt again: ignored
    recorder.record(1, {0: failure(1, 200, "ValueError: bad batch\nTraceback (most recent "
                                           "call last):\n  File x\nValueError: bad batch")})
    assert recorder.errors == ["rank 1 was killed by SIGKILL (9)",
                               "rank 0 exited with status 1: ValueError: bad batch"]
    summary = recorder.summary(1)
    assert "after 1 restart(s) of --max_restarts 1" in summary
    assert "attempt 0: rank 1 was killed by SIGKILL (9)" in summary
    assert "attempt 1: rank 0 exited with status 1: ValueError: bad batch" in summary
    assert first_error({}) == "no rank reported an error"
    # torchrun's SIGTERM to the survivors is never the cause
    assert first_error({0: failure(-15, 7), 1: failure(-9, 7)}).startswith("rank 1 was killed")
    os.environ.pop("CADENCE_RESTART_REASON", None)


def test_the_lock_of_an_earlier_attempt_of_the_same_job_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "cadence-abc")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    record = lock_module.holder_record("run", "t0")
    assert (record["run_id"], record["restart"]) == ("cadence-abc", 0)
    # attempt 0's holder on another host, on a filesystem without file locks
    record.update(host="elsewhere", pid=1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert lock_module.earlier_attempt(record)
    path = tmp_path / lock_module.LOCK_FILENAME
    path.write_text(json.dumps(record))
    lock = lock_module._acquire_without_locks(path, "run", "t1")
    try:
        assert json.loads(path.read_text())["restart"] == 1
    finally:
        lock.release()
    # another job, the same attempt, or torchrun's anonymous id: no takeover by this rule
    assert not lock_module.earlier_attempt({**record, "run_id": "cadence-other"})
    assert not lock_module.earlier_attempt({**record, "restart": 1})
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert not lock_module.earlier_attempt({**record, "run_id": "none"})
    path.write_text(json.dumps(record))
    with pytest.raises(lock_module.SaveFolderInUse, match="may be running on another host"):
        lock_module._acquire_without_locks(path, "run", "t2")


def test_a_preempted_attempt_is_not_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that saved and exited with a preemption status (128 + signal) is not a
    failure: the agent is left no restarts, so ``cadence launch`` exits with that status;
    a real failure beside it still restarts."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    results: list[Any] = []
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers",
                        lambda agent, group: results.pop(0))
    group = SimpleNamespace(spec=SimpleNamespace(max_restarts=2))
    with AttemptRecorder(preemption_exit_codes={143}) as recorder:
        agent = SimpleNamespace(_remaining_restarts=2)
        results.append(SimpleNamespace(state=WorkerState.FAILED,
                                       failures={0: failure(1, 5), 1: failure(143, 5)}))
        LocalElasticAgent._monitor_workers(agent, group)
        assert agent._remaining_restarts == 2 and not recorder.preempted  # a real failure
        results.append(SimpleNamespace(state=WorkerState.FAILED, failures={1: failure(143, 9)}))
        LocalElasticAgent._monitor_workers(agent, group)
        assert agent._remaining_restarts == 0 and recorder.preempted
    os.environ.pop("CADENCE_RESTART_REASON", None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_killed_rank_is_named_before_torchruns_monitor_reaps_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's thread may not be scheduled between a rank's death and torchrun's reap
    on a busy machine (after the reap the status is gone): the recorder runs the watcher's
    check before each of the agent's monitor calls, so the kill is still named. Here the
    watcher's thread never runs; the fake monitor reaps as torchrun's does."""
    import signal

    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from cadence.launch.rank_health import RankWatcher

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, "RANK": "1", "TORCHELASTIC_RUN_ID": "test"})
    try:
        out = io.StringIO()
        watcher = RankWatcher(out=out)  # not started: only the monitor hook looks
        watcher.check()  # the worker is found
        os.kill(worker.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{worker.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, "the killed worker never became a zombie"
            time.sleep(0.01)

        def reap(agent: Any, group: Any) -> Any:  # what torchrun's poll does to the worker
            worker.wait()
            return SimpleNamespace(state=WorkerState.HEALTHY, failures={})

        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", reap)
        with AttemptRecorder(before_monitor=watcher.check):
            LocalElasticAgent._monitor_workers(SimpleNamespace(_remaining_restarts=0),
                                               SimpleNamespace(spec=SimpleNamespace(max_restarts=0)))
        assert f"rank 1 (pid {worker.pid}) was killed by SIGKILL (9)" in out.getvalue()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
