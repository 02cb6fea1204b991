"""``cadence plot``: two real runs' metrics.jsonl drawn into a PNG of the requested size."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cadence import Trainer
from cadence.cli import main
from cadence.plot import default_metrics, load_metrics, plot_runs, resume_steps
from cadence.loggers import FileLogger
from tests.common.models import SimpleModel, make_dataloader

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[1]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    folders = []
    for name, lr in (("slow", 1e-3), ("fast", 1e-1)):
        import torch

        model = SimpleModel()
        trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=4),
                          eval_dataloader=make_dataloader(num_batches=1, seed=1),
                          optimizers=torch.optim.SGD(model.parameters(), lr=lr),
                          max_duration="2ep", eval_interval="1ep", log_interval="1ba", seed=0,
                          progress_bar=False, run_name=name, save_folder=str(root / name),
                          save_interval=None, loggers=[FileLogger()])
        trainer.fit()
        trainer.close()
        folders.append(root / name)
    return folders


def test_cli_plots_two_runs_to_a_png_of_the_expected_size(two_runs: list[Path],
                                                           tmp_path: Path) -> None:
    out = tmp_path / "out" / "compare.png"
    command = [sys.executable, "-m", "cadence", "plot", *map(str, two_runs), "--metrics",
               "loss/train/total,metrics/eval/MulticlassAccuracy", "-o", str(out),
               "--width", "640", "--panel-height", "240"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {out}"
    assert png_size(out) == (640, 2 * 240)


def test_default_metrics_and_the_lines_drawn(two_runs: list[Path], tmp_path: Path) -> None:
    slow = load_metrics(two_runs[0])
    steps, losses = slow["loss/train/total"]
    assert steps == list(range(1, 9)) and all(v > 0 for v in losses)
    assert slow["metrics/eval/MulticlassAccuracy"][0] == [4, 8]
    assert load_metrics(two_runs[0] / "metrics.jsonl") == slow
    assert main(["plot", *map(str, two_runs), "-o", str(tmp_path / "d.png")]) == 0
    # default: the train loss and every metrics/... key, one panel each (300 px)
    assert default_metrics([slow]) == ["loss/train/total", "metrics/eval/MulticlassAccuracy",
                                       "metrics/train/MulticlassAccuracy"]
    assert png_size(tmp_path / "d.png") == (900, 3 * 300)


def test_missing_metric_names_the_metrics_the_files_have(
        two_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plot", *map(str, two_runs), "--metrics", "loss/train/totl",
                   "-o", str(tmp_path / "x.png")])
    assert status == 2
    err = capsys.readouterr().err
    assert "'loss/train/totl'" in err and "loss/train/total" in err
    assert "metrics/eval/MulticlassAccuracy" in err
    assert not (tmp_path / "x.png").exists()


def test_a_folder_without_metrics_says_how_to_get_them(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="`file` logger"):
        plot_runs([tmp_path / "empty"])
    with pytest.raises(ValueError, match="does not exist"):
        plot_runs([tmp_path / "nowhere"])


def test_non_finite_values_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": "nan", "name": "x"}) + "\n"
                    + json.dumps({"step": 2, "loss": 1.5}) + "\n")
    steps, values = load_metrics(path)["loss"]
    assert steps == [1, 2] and values[0] != values[0] and values[1] == 1.5
    assert "name" not in load_metrics(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"m.jsonl holds no JSON line.*line 1"):
        load_metrics(path)


def test_a_damaged_tail_or_binary_garbage_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """What a crash leaves (NUL bytes, a cut line) or binary garbage: the good lines are
    plotted, one warning names the file and the bad lines."""
    path = tmp_path / "metrics.jsonl"
    good = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    path.write_bytes(("\n".join(good[:2]) + "\n").encode() + b"\xff\xfe\x00garbage\x89PNG\n"
                     + (good[2] + "\n").encode() + b"\x00" * 64 + b'{"step": 4, "lo')
    with pytest.warns(UserWarning, match=r"metrics.jsonl: 2 lines are not JSON .*lines 3, 5"):
        steps, values = load_metrics(path)["loss"]
    assert steps == [1, 2, 3] and values == pytest.approx([1.0, 0.5, 1 / 3])
    out = tmp_path / "plot.png"
    with pytest.warns(UserWarning, match="metrics.jsonl"):
        assert main(["plot", str(path), "--metrics", "loss", "-o", str(out)]) == 0
    assert out.is_file()


def test_resume_marks_give_the_final_curve(tmp_path: Path) -> None:
    """An attempt killed after its checkpoint of step 3 logged steps 4-5; the resumed run
    logged 4-6 after the mark; a second kill (checkpoint 5, steps 6-7 logged) and resume."""
    rows = ([{"step": s, "loss": 1.0 + s} for s in range(1, 6)]
            + [{"event": "resume", "step": 3}]
            + [{"step": s, "loss": 2.0 + s} for s in range(4, 8)]
            + [{"event": "resume", "step": 5}]
            + [{"step": s, "loss": 3.0 + s} for s in range(6, 9)])
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    steps, values = load_metrics(tmp_path)["loss"]
    assert steps == list(range(1, 9))  # each step once, in order
    assert values == [2.0, 3.0, 4.0, 6.0, 7.0, 9.0, 10.0, 11.0]  # the latest attempt's
    assert resume_steps(tmp_path) == [3, 5]
    raw_steps, _ = load_metrics(path, final=False)["loss"]
    assert raw_steps == [1, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8]  # as written: trained twice
    out = plot_runs([tmp_path], output=tmp_path / "resumed.png", metrics=["loss"])
    assert png_size(out) == (900, 300)
