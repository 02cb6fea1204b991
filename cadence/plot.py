"""Plot the metrics of one or several runs from their ``metrics.jsonl`` (``cadence plot``).

The :class:`~cadence.loggers.FileLogger` writes one JSON object per ``log_metrics``
call (``{"step": 12, "loss/train/total": 5.1, ...}``); this module reads those files and
draws each chosen metric against the optimizer step, one panel per metric, one line per
run, so runs can be compared without a tracking server. A resumed run's file holds resume
marks (``{"event": "resume", "step": N}``); what is drawn is the final curve: a step above
``N`` keeps only what was written after the mark, so steps trained twice (after a hard kill)
appear once, with the resumed run's values; each resume is a dotted vertical line. Needs
``matplotlib`` (``pip install 'cadence[plot]'``); drawing uses the Agg canvas directly, so
no GUI backend or pyplot state is touched.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

__all__ = ["DEFAULT_METRICS", "RunMetrics", "load_metrics", "resume_steps", "default_metrics",
           "plot_runs"]

PathLike = Union[str, os.PathLike]

DEFAULT_METRICS = ("loss/train/total",)
"""Always plotted by default; every ``metrics/<label>/<name>`` the runs logged is added."""

RunMetrics = dict[str, tuple[list[int], list[float]]]
"""metric name -> (steps, values), in the order logged."""

_FILES = ("metrics.jsonl", "metrics_rank0.jsonl")
_MISSING_MATPLOTLIB = ("cadence plot needs matplotlib, which is not installed. Install it with "
                       "`pip install matplotlib` (or `pip install 'cadence[plot]'`).")


def _metrics_file(run: Path) -> Path:
    if run.is_file():
        return run
    for name in _FILES:
        if (run / name).is_file():
            return run / name
    if not run.exists():
        raise ValueError(f"{run} does not exist; give a run's folder (holding metrics.jsonl) or "
                         "a .jsonl file.")
    raise ValueError(f"{run} holds no {' or '.join(_FILES)}; runs write it with the `file` "
                     "logger (loggers: {file: {}} in the run file).")


def _records(run: PathLike, warn: bool = True) -> Iterator[dict]:
    """The JSON objects of a run's metrics file, in order. Lines that are not JSON (a cut
    last line, the NUL bytes a crash leaves, binary garbage) are skipped, and named in one
    ``UserWarning`` at the end; a file without a single JSON line is an error."""
    path = _metrics_file(Path(run))
    bad: list[int] = []
    good = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.strip(b" \t\r\n")
            if not line:
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                bad.append(number)
                continue
            good += 1
            if isinstance(record, dict):
                yield record
    if not bad or (good and not warn):
        return
    shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
    if not good:
        raise ValueError(f"{path} holds no JSON line (not JSON: line {shown}); is it a "
                         f"FileLogger's metrics file?")
    warnings.warn(f"{path}: {len(bad)} line{'s are' if len(bad) > 1 else ' is'} not JSON and "
                  f"left out (lines {shown}; a crash can leave a damaged tail).", UserWarning,
                  stacklevel=3)


def _is_resume(record: dict) -> bool:
    return record.get("event") == "resume" and isinstance(record.get("step"), int)


def resume_steps(run: PathLike) -> list[int]:
    """The steps a run resumed from, in the order of its resume marks.

    Args:
        run: a run's folder or ``.jsonl`` file (as :func:`load_metrics`).

    Returns:
        The ``step`` of every ``{"event": "resume", "step": N}`` line.
    """
    return [record["step"] for record in _records(run, warn=False) if _is_resume(record)]


def load_metrics(run: PathLike, final: bool = True) -> RunMetrics:
    """Every numeric metric in a run's ``metrics.jsonl``.

    Args:
        run: a run's folder (its ``metrics.jsonl``, or ``metrics_rank0.jsonl`` when the run
            logged every rank) or the path of a ``.jsonl`` file.
        final: the final curve (default): at each resume mark ``{"event": "resume", "step":
            N}``, the values logged before it at steps above ``N`` are dropped (an attempt
            killed after its last checkpoint trained them, the resumed run trains them
            again). False: every value, as written.

    Returns:
        ``{metric: (steps, values)}``; ``"nan"``/``"inf"`` strings are read as floats,
        other non-numeric values are left out.

    Raises:
        ValueError: no such folder or file, no metrics file in it, or no JSON line in it.
            Lines that are not JSON are left out with a ``UserWarning`` naming the file and
            the lines.
    """
    series: RunMetrics = {}
    for record in _records(run):
        step = record.get("step")
        if not isinstance(step, int):
            continue
        if _is_resume(record):
            if final:
                for name, (steps, values) in series.items():
                    kept = [i for i, s in enumerate(steps) if s <= step]
                    series[name] = ([steps[i] for i in kept], [values[i] for i in kept])
            continue
        for key, value in record.items():
            if key == "step" or isinstance(value, bool):
                continue
            if isinstance(value, str):
                try:
                    value = float(value)  # "nan", "inf", "-inf" as the FileLogger writes
                except ValueError:
                    continue
            if isinstance(value, (int, float)):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def default_metrics(runs: Sequence[RunMetrics]) -> list[str]:
    """:data:`DEFAULT_METRICS` plus every ``metrics/...`` key any run logged, sorted."""
    present = set().union(*(run.keys() for run in runs)) if runs else set()
    extra = sorted(k for k in present if k.startswith("metrics/"))
    return [m for m in DEFAULT_METRICS if m in present] + extra


def plot_runs(
    runs: Sequence[PathLike],
    metrics: Optional[Sequence[str]] = None,
    output: PathLike = "plot.png",
    width: int = 900,
    panel_height: int = 300,
    labels: Optional[Sequence[str]] = None,
) -> Path:
    """Draw ``metrics`` of ``runs`` against the step and save the figure.

    Args:
        runs: run folders (or ``.jsonl`` files), one line each per panel.
        metrics: the metrics to draw, one panel each, top to bottom; default
            :func:`default_metrics`.
        output: the image file; its suffix picks the format (``.png``, ``.svg``, ``.pdf``).
        width: figure width in pixels (at 100 dpi).
        panel_height: height of each panel in pixels; the figure is ``width`` x
            ``panel_height * len(metrics)`` pixels.
        labels: legend names of the runs; default each run folder's name.

    Returns:
        The path written.

    Raises:
        ValueError: a run has no metrics file, no metrics are left to draw, a metric none
            of the runs logged (the message lists the metrics they have), a size below 50
            pixels, or ``labels`` of another length than ``runs``.
        ImportError: matplotlib is not installed.
    """
    if not runs:
        raise ValueError("give at least one run folder.")
    if width < 50 or panel_height < 50:
        raise ValueError(f"width and panel height must be >= 50 pixels, got "
                         f"{width} x {panel_height}.")
    paths = [Path(run) for run in runs]
    if labels is None:
        labels = [(p.parent if p.is_file() else p).name or str(p) for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} runs.")
    data = [load_metrics(p) for p in paths]
    marks = [resume_steps(p) for p in paths]
    present = sorted(set().union(*(d.keys() for d in data)))
    chosen = list(metrics) if metrics else default_metrics(data)
    missing = [m for m in chosen if not any(m in d for d in data)]
    if missing:
        raise ValueError(
            f"no run logged {', '.join(repr(m) for m in missing)}; the runs' "
            f"metrics are: {', '.join(present) if present else '(none)'}.")
    if not chosen:
        raise ValueError(f"nothing to draw; pass --metrics (the runs' metrics "
                         f"are: {', '.join(present) if present else '(none)'}).")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(_MISSING_MATPLOTLIB) from exc

    dpi = 100
    figure = Figure(figsize=(width / dpi, panel_height * len(chosen) / dpi), dpi=dpi,
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(chosen), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, chosen):
        for label, run, resumes in zip(labels, data, marks):
            if metric in run:
                steps, values = run[metric]
                line, = ax.plot(steps, values, label=label,
                                marker="." if len(steps) < 30 else None)
                for step in resumes:
                    ax.axvline(step, color=line.get_color(), linestyle=":", linewidth=1)
        ax.set_title(metric, fontsize="medium")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1].set_xlabel("step (optimizer steps)")
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=dpi)
    return out
