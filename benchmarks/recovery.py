"""Time to recovery after a preemption: seconds from the signal to the process's exit (the
preemption checkpoint included), and from the relaunch to the first new batch.

A real training run, started as a user starts one: ``cadence train RUN.yaml`` (1 rank) or
``cadence launch -n 2 RUN.yaml`` (2 ranks: gloo on the CPU, FSDP2 ``FULL_SHARD``, as
``benchmarks/checkpoint.py`` runs its 2 ranks), with ``autoresume: true``, a save folder,
``log_interval: 1ba`` and no interval checkpoint within reach (``save_interval`` far beyond
the batches trained), so every checkpoint is a preemption's. The run file is
``yamls/quickstart.yaml`` (2.6 M parameters) with its evaluation removed, or the same run with
the ~100 M-parameter GPT-2 of ``benchmarks/checkpoint.py`` (12 layers x 768 wide, vocabulary
8,192, 256 positions: 92 M parameters; 2 sequences of 64 tokens a batch, to keep its steps
short on a CPU); ``save_state_dict_type`` is ``full`` or ``sharded``.

One cycle, repeated ``--repeats`` times on the same save folder:

1. the run is (re)started; when ``metrics.jsonl`` (line buffered: a step's line reaches the
   file when the batch ends) gets a ``loss/train/total`` line of a step after the checkpoint
   it resumed from, its first new batch has completed: **relaunch to first new batch** is
   the seconds from starting the command to seeing that line (interpreter start, imports,
   building the model and data, finding, verifying and loading the checkpoint, one batch);
2. at once ``SIGTERM`` goes to the process (with 2 ranks, to the ``cadence launch``
   launcher, which forwards it to its ranks): **signal to exit** is the seconds until that
   process has exited (the batch in flight is finished, every rank saves the preemption
   checkpoint, the Trainer closes, the processes end). The exit status must be 143, and
   the next relaunch must resume at the batch after the one saved (no batch trained twice);
   either failing stops the benchmark.

The first start (a fresh run, nothing to resume) is not timed; it is signalled like the
others. With ``--repeats N``: N relaunches and N + 1 signals, medians over each. Each total
is also split by the run's own log lines (``cadence train`` stamps them to the millisecond):
signal -> save starts (the batch in flight), the save (``saved in``, to 0.1 s), save done ->
exit (closing, Python's shutdown, torchrun's agent); relaunch -> ``Resumed from
checkpoint`` (start-up and load), then the first new batch.

    python benchmarks/recovery.py --markdown           # 15-30 minutes on 2 loaded cores
    python benchmarks/recovery.py --quick              # quickstart, 1 rank: a smoke test
    python benchmarks/recovery.py --models quickstart --ranks 2 --formats sharded --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, Sequence

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, check_minimums, child_env, format_table, loadavg  # noqa: E402

MODELS = ("quickstart", "100m")
FORMATS = ("full", "sharded")
RUN_NAME = "recovery"
#: What the ~100 M model changes in the quickstart run (the model of benchmarks/checkpoint.py).
BIG_MODEL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 8192, "max_seq_len": 256}
POLL_S = 0.02


@dataclass
class Result:
    """The measurements of one configuration (model, format, ranks)."""

    model: str
    fmt: str
    ranks: int
    params: int = 0
    to_exit: list[float] = field(default_factory=list)   # signal -> exit, seconds
    to_batch: list[float] = field(default_factory=list)  # relaunch -> first new batch, seconds
    # the parts, from the run's log lines (see parts()): signal -> save starts, the save,
    # save done -> exit; relaunch -> checkpoint loaded, loaded -> first new batch
    in_flight: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    after_save: list[float] = field(default_factory=list)
    to_loaded: list[float] = field(default_factory=list)
    first_batch: list[float] = field(default_factory=list)
    checkpoint_bytes: int = 0
    checkpoint_files: int = 0


def run_config(model: str, fmt: str, ranks: int, folder: Path) -> dict[str, Any]:
    """The run file's content: the quickstart with its evaluation removed, checkpointing for
    preemptions only, one metrics line per batch; ``model`` ``100m`` swaps in the big GPT-2."""
    config = yaml.safe_load((REPO / "yamls" / "quickstart.yaml").read_text())
    for key in ("eval_loader", "eval_interval", "eval_subset_num_batches",
                "device_eval_batch_size"):
        config.pop(key, None)
    variables = config.pop("variables")  # resolved here: the run file is self-contained
    config["model"].update(vocab_size=variables["vocab_size"], max_seq_len=variables["seq_len"])
    config["train_loader"].update(seq_len=variables["seq_len"], vocab_size=variables["vocab_size"])
    config.update(run_name=RUN_NAME, max_duration="100000ba", log_interval="1ba",
                  progress_bar=False, save_folder=str(folder), save_interval="100000ba",
                  save_state_dict_type=fmt, autoresume=True, device="cpu")
    if model == "100m":
        config["model"].update(copy.deepcopy(BIG_MODEL))
        config["train_loader"]["seq_len"] = 64  # the tokenized data of the quickstart
        config.update(global_train_batch_size=2, device_train_microbatch_size=2 // ranks)
    if ranks > 1:
        config["parallelism_config"] = {"fsdp": {"sharding_strategy": "FULL_SHARD"}}
    return config


def parameter_count(model: str) -> int:
    """The GPT-2's parameter count, from its config (built on the meta device: no memory)."""
    import torch

    from cadence.models.gpt import gpt2

    config = yaml.safe_load((REPO / "yamls" / "quickstart.yaml").read_text())
    kwargs = {k: v for k, v in config["model"].items() if k != "name"}
    kwargs.update(vocab_size=config["variables"]["vocab_size"],
                  max_seq_len=config["variables"]["seq_len"])
    if model == "100m":
        kwargs.update(BIG_MODEL)
    with torch.device("meta"):
        built = gpt2(**kwargs)
    return sum(p.numel() for p in built.parameters())


#: ``cadence train``'s log line stamp: ``2026-11-26 01:59:35,177`` (local time).
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "


def _stamp(match: re.Match[str]) -> float:
    """A log line's stamp as ``time.time()`` seconds."""
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Run:
    """The training command of one configuration, started again and again on one folder."""

    def __init__(self, config_path: Path, folder: Path, ranks: int, timeout: float) -> None:
        self.folder, self.timeout = folder, timeout
        sub = ["train"] if ranks == 1 else ["launch", "-n", str(ranks)]
        self.command = [sys.executable, "-m", "cadence", *sub, str(config_path)]
        self.env = {**child_env(), "PYTHONUNBUFFERED": "1"}
        self.log = folder.parent / "output.log"
        self.metrics = folder / "metrics.jsonl"
        self.live: subprocess.Popen[bytes] | None = None

    def start(self) -> tuple[subprocess.Popen[bytes], float, int]:
        """Start the command; its process, start time (``time.time()``, as its log lines
        are stamped), and the metrics file's size then."""
        offset = self.metrics.stat().st_size if self.metrics.exists() else 0
        with open(self.log, "ab") as out:
            out.write(f"\n==== {' '.join(self.command)}\n".encode())
            out.flush()
            started = time.time()
            proc = subprocess.Popen(self.command, cwd=REPO, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.live = proc
        return proc, started, offset

    def first_new_step(self, proc: subprocess.Popen[bytes], offset: int, after: int) -> int:
        """Wait until ``metrics.jsonl`` has, past ``offset``, a training-loss line of a step
        after ``after``; that step."""
        import json

        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                self.fail(proc, f"exited with status {proc.returncode} before its first batch")
            if self.metrics.exists():
                with open(self.metrics, "rb") as file:
                    file.seek(offset)
                    for line in file.read().split(b"\n")[:-1]:  # whole lines only
                        record = json.loads(line)
                        if "loss/train/total" in record and record["step"] > after:
                            return int(record["step"])
            time.sleep(POLL_S)
        self.fail(proc, f"no new batch within {self.timeout:.0f}s")

    def stop(self, proc: subprocess.Popen[bytes]) -> tuple[float, float]:
        """SIGTERM to the process; when it was sent and when the process had exited
        (``time.time()``; status 143 required)."""
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.fail(proc, f"still running {self.timeout:.0f}s after SIGTERM")
        exited = time.time()
        if proc.returncode != 128 + signal.SIGTERM:
            self.fail(proc, f"exited with status {proc.returncode} after SIGTERM, not 143")
        self.live = None
        return sent, exited

    def kill(self) -> None:
        """End a run still going (the benchmark failed or was interrupted): its session."""
        if self.live is not None and self.live.poll() is None:
            os.killpg(self.live.pid, signal.SIGKILL)
            self.live.wait()
        self.live = None

    def log_offset(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def parts(self, offset: int) -> tuple[float | None, float | None, float | None]:
        """From the log written since ``offset`` (every rank's lines, stamped by ``cadence
        train``'s logging to the millisecond): when the last rank had loaded its checkpoint
        (``Resumed from checkpoint``), when the last rank had saved the preemption
        checkpoint (``Preempted at batch ...``) and the longest save (its ``saved in
        X.Xs``, to 0.1 s). None where a line is missing."""
        with open(self.log, "rb") as file:
            file.seek(offset)
            text = file.read().decode(errors="replace")
        loaded = [_stamp(m) for m in re.finditer(_STAMP + r".*Resumed from checkpoint", text)]
        saved = [(_stamp(m), float(m.group(2))) for m in re.finditer(
            _STAMP + r".*Preempted at batch \d+: checkpoint .* saved in ([\d.]+)s", text)]
        return (max(loaded, default=None), max((t for t, _ in saved), default=None),
                max((s for _, s in saved), default=None))

    def fail(self, proc: subprocess.Popen[bytes], why: str) -> NoReturn:
        self.kill()  # its whole session: the launcher and its ranks
        raise RuntimeError(f"{' '.join(self.command)}: {why}; its output ends:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def saved_step(folder: Path) -> tuple[int, Path]:
    """The batch of the newest complete checkpoint (the ``latest`` pointer's) and its path."""
    from cadence.checkpoint.store import read_latest

    path = read_latest(folder, f"latest-{RUN_NAME}")
    if path is None:
        raise RuntimeError(f"no complete checkpoint in {folder} after the preemption")
    match = re.search(r"-ba(\d+)", path.name)
    assert match, path
    return int(match.group(1)), path


def disk_bytes(path: Path) -> tuple[int, int]:
    """Bytes and number of files of a checkpoint file or folder."""
    if path.is_file():
        return path.stat().st_size, 1
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def measure(model: str, fmt: str, ranks: int, args: argparse.Namespace) -> Result:
    """Start, then ``args.repeats`` times: signal, relaunch; see the module docstring."""
    result = Result(model, fmt, ranks, params=parameter_count(model))
    with tempfile.TemporaryDirectory(prefix="cadence-recovery-", dir=args.dir) as tmp:
        folder = Path(tmp) / "run"
        config_path = Path(tmp) / "run.yaml"
        config_path.write_text(yaml.safe_dump(run_config(model, fmt, ranks, folder)))
        run = Run(config_path, folder, ranks, args.timeout)
        resumed_from = 0
        try:
            for cycle in range(args.repeats + 1):
                resumed_from = _cycle(run, result, cycle, resumed_from, args.quiet)
        finally:
            run.kill()
    return result


def _cycle(run: Run, result: Result, cycle: int, resumed_from: int, quiet: bool) -> int:
    """(Re)start the run, wait for its first new batch, SIGTERM it; the batch it saved."""
    log_at = run.log_offset()
    proc, started, offset = run.start()
    step = run.first_new_step(proc, offset, after=resumed_from)
    seen = time.time()
    if cycle > 0 and step != resumed_from + 1:
        run.fail(proc, f"resumed from batch {resumed_from} but its first new batch is {step}: "
                       "batches were skipped or trained twice")
    sent, exited = run.stop(proc)
    loaded, saved, save_s = run.parts(log_at)
    if saved is None or save_s is None:
        raise RuntimeError(f"no 'Preempted at batch' line in the run's log; it ends:\n"
                           f"{run.tail()}")
    result.to_exit.append(exited - sent)
    result.in_flight.append(saved - save_s - sent)
    result.save.append(save_s)
    result.after_save.append(exited - saved)
    if cycle > 0:
        if loaded is None:
            raise RuntimeError(f"no 'Resumed from checkpoint' line in the run's log; it "
                               f"ends:\n{run.tail()}")
        result.to_batch.append(seen - started)
        result.to_loaded.append(loaded - started)
        result.first_batch.append(seen - loaded)
    resumed_from, path = saved_step(run.folder)
    if resumed_from < step:
        raise RuntimeError(f"checkpoint {path.name} is older than batch {step}, which the "
                           "run had finished before the signal")
    result.checkpoint_bytes, result.checkpoint_files = disk_bytes(path)
    if not quiet:
        print(f"  {result.model} {result.fmt} {result.ranks} rank(s), cycle {cycle}: "
              f"signal->exit {result.to_exit[-1]:.2f}s (in flight {result.in_flight[-1]:.2f}, "
              f"save {result.save[-1]:.1f}, after {result.after_save[-1]:.2f})"
              + (f", relaunch->batch {step} {result.to_batch[-1]:.2f}s (loaded "
                 f"{result.to_loaded[-1]:.2f}, batch {result.first_batch[-1]:.2f})"
                 if cycle else ""), file=sys.stderr, flush=True)
    return resumed_from


def span(values: Sequence[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


HEADERS = ["model", "params M", "format", "ranks", "checkpoint MiB", "files",
           "signal to exit s", "(min-max)", "batch in flight s", "save s", "close + exit s",
           "relaunch to first new batch s", "(min-max)", "start + load s", "first batch s"]


def row(r: Result) -> list[str]:
    med = statistics.median
    return [r.model, f"{r.params / 1e6:.1f}", r.fmt, str(r.ranks),
            f"{r.checkpoint_bytes / 2**20:,.1f}", str(r.checkpoint_files),
            f"{med(r.to_exit):.2f}", span(r.to_exit), f"{med(r.in_flight):.2f}",
            f"{med(r.save):.1f}", f"{med(r.after_save):.2f}",
            f"{med(r.to_batch):.2f}", span(r.to_batch), f"{med(r.to_loaded):.2f}",
            f"{med(r.first_batch):.2f}"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--ranks", nargs="+", type=int, choices=(1, 2), default=[1, 2])
    parser.add_argument("--repeats", type=int, default=None,
                        help="relaunches per configuration (median); default 3, 1 with --quick")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: the quickstart model on 1 rank only")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for a batch or an exit before failing")
    parser.add_argument("--dir", default=None, help="where the runs are written (a tmp dir)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.quick:
        args.models, args.ranks = ["quickstart"], [1]
    check_minimums(parser, args, {"repeats": 1})
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python benchmarks/recovery.py " + " ".join(sys.argv[1:] if argv is None else argv)
    before, started = loadavg(), time.perf_counter()
    results = []
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # SIGTERM'd: SystemExit, so the run in progress is ended too (measure)
        previous = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        for model in args.models:
            for ranks in args.ranks:
                for fmt in args.formats:
                    results.append(measure(model, fmt, ranks, args))
                    if not args.quiet:  # the row so far, in case a later configuration fails
                        print("  " + " | ".join(row(results[-1])), file=sys.stderr, flush=True)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(f"{command.strip()}\n")
    print(f"- CPU: {os.cpu_count()} cores; torch threads: its default with 1 rank, 1 per rank "
          "with 2 (torchrun's OMP_NUM_THREADS=1)")
    print(f"- load average (1/5/15 min) before / after: {before} | {loadavg()}")
    print(f"- medians of {args.repeats} relaunches and {args.repeats + 1} SIGTERMs (each part "
          "its own median); exit status 143 every time, and every relaunch resumed at the "
          "batch after the one saved")
    print(f"- total {time.perf_counter() - started:.0f} s\n")
    print(format_table(HEADERS, [row(r) for r in results], args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
