"""What a person waits for before training starts: fresh-process startup of cadence (issue 15).

Each row is one command, run ``--trials`` times (default 5) in a fresh process; rounds are
interleaved (every row once per round, the order rotating each round) so load from other
processes falls on every row alike. Reported per row: the median wall time (seconds, from
starting the child to its exit), the median peak resident memory of the child (MiB: its
``ru_maxrss``, read with ``os.wait4`` by a minimal spawner process, the one RSS method of
``benchmarks/_common.py``), and the ratio of its median wall time to that of
``import torch`` measured in the same run. Rows:

- ``python -c "import torch"``: the floor every PyTorch program pays.
- ``python -c "import cadence"``: imports nothing heavy (names are imported on first use).
- ``cadence --help``: the parser only; no torch.
- ``cadence train yamls/quickstart.yaml max_duraton=1ba``: a typo in a run file, refused
  with exit status 2 and a "did you mean" message (the row checks the status) by the
  schema stage of the run-file check, before torch or any component is imported.
- ``python -c "from cadence import Trainer"`` (``--extra``): the first use of the Trainer.
- ``--first-step`` adds a pair: the quickstart run file to the end of its first training
  step (``cadence train yamls/quickstart.yaml max_duration=1ba eval_loader=null
  loggers=null``), and its floor, a plain script that imports torch and transformers,
  builds the same model and training data with the same builders, and takes one AdamW step
  (:data:`FIRST_STEP_FLOOR`). The target: the run within 1 s of the floor.

Targets (issue 15; printed beside the figures): ``cadence --help`` under 0.3 s, the schema
error under 0.5 s, ``import cadence`` within 1.1x of ``import torch``.

Run from anywhere (the commands run in the repository root)::

    python benchmarks/startup.py              # plain-text table
    python benchmarks/startup.py --markdown   # the table of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

if str(Path(__file__).resolve().parent) not in sys.path:  # _common: also via importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import measure_command  # noqa: E402

__all__ = ["Row", "Result", "rows", "run_once", "measure", "format_table", "main"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    """One command of the table.

    Args:
        key: short name (``--only`` takes these).
        label: what the table shows.
        argv: the command.
        status: the exit status the command must end with.
        target_s: the issue's wall-time target in seconds, or None.
        target_ratio: the issue's target as a ratio to ``import torch``, or None.
    """

    key: str
    label: str
    argv: tuple[str, ...]
    status: int = 0
    target_s: Optional[float] = None
    target_ratio: Optional[float] = None


@dataclass
class Result:
    """The trials of one row: wall seconds and peak MiB, one entry per fresh process."""

    row: Row
    wall_s: list[float]
    peak_mib: list[float]


def _cadence_command() -> list[str]:
    """The ``cadence`` console script beside this interpreter, else ``python -m cadence``."""
    script = Path(sys.executable).parent / "cadence"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cadence"]


#: One training step of the quickstart's model and data without cadence's Trainer: the floor
#: the quickstart's time to its first step is compared with (the builders are the ones the
#: run file names; ``import transformers`` as a Hugging Face user's script pays it).
FIRST_STEP_FLOOR = """
import torch, transformers
from cadence.registry import registry
torch.manual_seed(17)
model = registry.models.get("gpt2")(n_layer=4, n_head=4, n_embd=192, vocab_size=4096,
                                    max_seq_len=128)
loader = registry.datasets.get("shakespeare")(split="train", seq_len=128, vocab_size=4096,
                                              batch_size=16)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
batch = next(iter(loader))
model.loss(model(batch), batch).backward()
opt.step()
"""


def rows(extra: bool = False, first_step: bool = False) -> list[Row]:
    """The table's rows; ``extra`` adds the first use of the Trainer, ``first_step`` the
    quickstart's time to its first training step and that step's floor."""
    py, cadence = sys.executable, _cadence_command()
    table = [
        Row("torch", 'python -c "import torch"', (py, "-c", "import torch")),
        Row("import", 'python -c "import cadence"', (py, "-c", "import cadence"),
            target_ratio=1.1),
        Row("help", "cadence --help", (*cadence, "--help"), target_s=0.3),
        Row("schema", "cadence train yamls/quickstart.yaml max_duraton=1ba (refused)",
            (*cadence, "train", "yamls/quickstart.yaml", "max_duraton=1ba"), status=2,
            target_s=0.5),
    ]
    if extra:
        table.append(Row("trainer", 'python -c "from cadence import Trainer"',
                         (py, "-c", "from cadence import Trainer")))
    if first_step:
        table.append(Row("floor", "import torch, transformers; build model + data; 1 step",
                         (py, "-c", FIRST_STEP_FLOOR)))
        table.append(Row("first_step", "cadence train yamls/quickstart.yaml max_duration=1ba",
                         (*cadence, "train", "yamls/quickstart.yaml", "max_duration=1ba",
                          "eval_loader=null", "loggers=null", "progress_bar=false")))
    return table


def run_once(row: Row) -> tuple[float, float]:
    """Run ``row`` once in a fresh process (:func:`_common.measure_command`).

    Returns:
        ``(wall seconds, peak resident MiB)`` of the child.

    Raises:
        RuntimeError: the command ended with another status than ``row.status`` (the
            message holds the end of its stderr).
    """
    with tempfile.TemporaryFile() as err:
        done = measure_command(row.argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        if done.returncode != row.status:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{row.label!r} exited with {done.returncode}, expected "
                               f"{row.status}:\n{tail}")
    return done.wall_s, done.peak_mib


def measure(table: Sequence[Row], trials: int) -> list[Result]:
    """Run every row ``trials`` times, interleaved round by round with a rotating order."""
    results = [Result(row, [], []) for row in table]
    for trial in range(trials):
        shift = trial % len(results)
        for result in results[shift:] + results[:shift]:
            wall, peak = run_once(result.row)
            result.wall_s.append(wall)
            result.peak_mib.append(peak)
    return results


def _target(result: Result, torch_s: Optional[float]) -> str:
    wall = statistics.median(result.wall_s)
    row = result.row
    if row.target_s is not None:
        return f"< {row.target_s:g} s: {'met' if wall < row.target_s else 'MISSED'}"
    if row.target_ratio is not None and torch_s:
        met = wall <= row.target_ratio * torch_s
        return f"<= {row.target_ratio:g}x torch: {'met' if met else 'MISSED'}"
    return ""


def format_table(results: Sequence[Result], markdown: bool = False) -> str:
    """The table: command, median wall s, ratio to ``import torch``, median peak MiB, target."""
    torch_s = next((statistics.median(r.wall_s) for r in results if r.row.key == "torch"), None)
    head = ("command", "wall s", "vs import torch", "peak MiB", "target")
    body = []
    for result in results:
        wall = statistics.median(result.wall_s)
        ratio = f"{wall / torch_s:.2f}x" if torch_s else "-"
        label = f"`{result.row.label}`" if markdown else result.row.label
        body.append((label, f"{wall:.3f}", ratio, f"{statistics.median(result.peak_mib):.0f}",
                     _target(result, torch_s)))
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in (head, *body)) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
                     for cells in (head, *body))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure and print the startup table. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5,
                        help="fresh processes per row; the median is reported (5)")
    parser.add_argument("--only", default=None,
                        help="comma-separated row keys: torch,import,help,schema,trainer,floor,"
                             "first_step")
    parser.add_argument("--extra", action="store_true",
                        help="add `from cadence import Trainer` (the first use)")
    parser.add_argument("--first-step", action="store_true",
                        help="add the quickstart's time to its first step, and its floor")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    only = args.only or ""
    table = rows(extra=args.extra or "trainer" in only,
                 first_step=args.first_step or "floor" in only or "first_step" in only)
    if args.only:
        keys = {k.strip() for k in args.only.split(",") if k.strip()}
        unknown = keys - {row.key for row in table}
        if unknown:
            parser.error(f"unknown --only keys {sorted(unknown)}; choose from "
                         f"{[row.key for row in table]}")
        table = [row for row in table if row.key in keys]
    load_before = os.getloadavg()
    results = measure(table, args.trials)
    load_after = os.getloadavg()
    print(f"# benchmarks/startup.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"torch {_version('torch')}, transformers {_version('transformers')}")
    print(f"# median of {args.trials} fresh processes per row, rounds interleaved; load "
          f"average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(format_table(results, markdown=args.markdown))
    walls = {r.row.key: statistics.median(r.wall_s) for r in results}
    if "floor" in walls and "first_step" in walls:
        extra_s = walls["first_step"] - walls["floor"]
        print(f"\nquickstart to its first step: {extra_s:+.2f} s over the floor (target: "
              f"<= 1 s: {'met' if extra_s <= 1.0 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
