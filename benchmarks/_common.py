"""What the benchmark scripts share: the one way peak resident memory (RSS) is measured,
the repository's paths and child environment, quantiles, the load average and tables.

Not a benchmark itself (the leading underscore); a script imports it as ``_common`` (its
folder is put on ``sys.path`` first, so the scripts also load through ``importlib``).
Standard library only, so measuring a command costs no import of torch.

**Peak RSS.** Every figure of peak resident memory in ``benchmarks/`` is
:func:`measure_command`: the command runs as a fresh process, started by a minimal spawner
interpreter (``python -S -c`` :data:`_SPAWNER`, importing nothing but ``os``), which reads
the child's ``ru_maxrss`` from ``os.wait4`` when it exits. The spawner is there because
Linux carries a process's high-water mark across ``exec``: a child started directly by a
benchmark that has imported torch and trained a model (500 MB) would report at least those
500 MB, however little it used itself (``subprocess`` starts children with ``vfork``, so
the child's figure is the *parent's* peak). Started from the spawner, a child's figure
includes at most the spawner's own ~8 MiB, less than a bare ``python -c pass`` (~11 MiB). The figure
is the whole process's peak, from start to exit, in MiB (2**20 bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional, Sequence, Union

__all__ = ["REPO", "Measured", "measure_command", "child_env", "loadavg", "quantile",
           "format_table"]

REPO = Path(__file__).resolve().parent.parent

_Stream = Union[int, IO[Any], None]


# ----------------------------------------------------------------------------- peak RSS
@dataclass(frozen=True)
class Measured:
    """One command run by :func:`measure_command`.

    Attributes:
        returncode: the command's exit status (negative: killed by that signal).
        wall_s: seconds from starting the command to its exit (the spawner's own start is
            not included).
        peak_mib: the command's peak resident set size over its whole life, MiB.
        stdout: its standard output when captured, else None.
        stderr: its standard error when captured, else None.
    """

    returncode: int
    wall_s: float
    peak_mib: float
    stdout: Optional[str] = None
    stderr: Optional[str] = None


def measure_command(argv: Sequence[str], *, cwd: Union[str, Path, None] = None,
                    env: Optional[dict[str, str]] = None, capture_output: bool = False,
                    stdout: _Stream = None, stderr: _Stream = None,
                    timeout: Optional[float] = None) -> Measured:
    """Run ``argv`` in a fresh process and measure its wall time and peak RSS.

    Args:
        argv: the command (``argv[0]`` is looked up on ``PATH``).
        cwd: its working directory.
        env: its environment (default: this process's).
        capture_output: capture stdout and stderr as text (``Measured.stdout/stderr``).
        stdout: where its output goes when not captured (``subprocess.DEVNULL``, a file).
        stderr: where its errors go when not captured.
        timeout: seconds before it is killed (``subprocess.TimeoutExpired``).

    Returns:
        The exit status, wall seconds and peak MiB (see the module docstring for why a
        spawner starts the command).

    Raises:
        RuntimeError: the spawner could not start the command (not found).
    """
    with tempfile.TemporaryDirectory(prefix="cadence-bench-") as folder:
        result_path = os.path.join(folder, "result.json")
        spawner = [sys.executable, "-S", "-c", _SPAWNER, result_path, *argv]
        if capture_output:
            stdout = stderr = subprocess.PIPE
        done = subprocess.run(spawner, cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                              text=capture_output, timeout=timeout, check=False)
        if not os.path.exists(result_path):
            raise RuntimeError(f"could not run {list(argv)!r} (spawner status "
                               f"{done.returncode}): {done.stderr or ''}")
        with open(result_path, encoding="ascii") as file:
            record = json.load(file)
    return Measured(record["returncode"], record["wall_s"], record["peak_mib"],
                    done.stdout if capture_output else None,
                    done.stderr if capture_output else None)


#: The spawner: run ``argv[2:]``, write its exit status, wall seconds and peak MiB to
#: ``argv[1]`` as JSON. Run as ``python -S -c``: no ``site``, nothing beyond ``os``, ``sys``
#: and ``time`` imported, so its own memory stays that of a bare interpreter.
_SPAWNER = """
import os, sys, time
argv = sys.argv[2:]
start = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
peak = usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)  # KiB on Linux
with open(sys.argv[1], "w", encoding="ascii") as file:
    file.write('{"returncode": %d, "wall_s": %r, "peak_mib": %r}'
               % (os.waitstatus_to_exitcode(status), wall, peak))
"""


# ----------------------------------------------------------------------------- the rest
def child_env() -> dict[str, str]:
    """This environment, with the repository first on ``PYTHONPATH`` and the Hugging Face hub
    offline: what benchmark children run with."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def loadavg() -> str:
    """The 1/5/15-minute load average as ``"a / b / c"`` (``"n/a"`` where unknown)."""
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def check_minimums(parser: Any, args: Any, minimums: dict[str, int]) -> None:
    """``parser.error`` (exit 2) naming the first flag below its minimum: ``minimums`` maps
    an ``args`` attribute (``log_interval``) to the least value its flag (``--log-interval``)
    takes."""
    for name, least in minimums.items():
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be at least {least}")


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation; ``q`` in [0, 1])."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    """A table: markdown (first column left, the others right-aligned), or plain text with
    aligned columns."""
    if markdown:
        lines = ["| " + " | ".join(headers) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])
