"""Issue 25, config side: what a run file may name and the values refused before anything is
built, each reproduced with its message asserted.

* item 2: a negative ``save_interval`` (also as a Trainer argument);
* item 4: ``os.system`` (or any callable a key cannot hold) named by a dotted path is refused
  at the schema stage, and nothing runs (a marker file never appears);
* weak items: ``gpt2``'s sizes, paths in ``run_name`` / checkpoint names, an override YAML
  cannot parse, an oversized run file, ``eval_subset_num_batches=0`` and an empty eval
  loader.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from cadence.cli import main as cli_main
from cadence.config import load as load_module
from cadence.config.load import ConfigError, load_config

HERE = "tests.config.test_config_values"  # its recording_model writes a marker when built
RUN = """\
run_name: trust
max_duration: 4ba
global_train_batch_size: 4
progress_bar: false
save_folder: {save}
model: {{name: {here}.recording_model, marker: {model_marker}}}
train_loader: {{name: {here}.tiny_loader}}
"""


def write_run(tmp_path: Path, extra: str = "") -> Path:
    run = tmp_path / "run.yaml"
    run.write_text(RUN.format(here=HERE, save=tmp_path / "save",
                              model_marker=tmp_path / "model-built") + extra)
    return run


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *overrides: str,
            extra: str = "") -> str:
    """Run ``cadence train`` with ``overrides``; assert it exits 2 having built nothing."""
    assert cli_main(["train", str(write_run(tmp_path, extra)), *overrides]) == 2
    assert not (tmp_path / "model-built").exists()
    assert not (tmp_path / "save").exists()
    return capsys.readouterr().err


# ------------------------------------------------------------------------------- item 2


@pytest.mark.parametrize("key", ["save_interval", "eval_interval", "log_interval"])
def test_a_negative_interval_is_refused_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    err = refused(tmp_path, capsys, f"{key}=-5ba")
    assert f"{key}: '-5ba' is negative; {key} must be a positive Time such as '1ep' or " \
           f"'500ba'" in err, err


def test_a_negative_save_interval_is_refused_by_the_trainer(tmp_path: Path) -> None:
    from cadence import Trainer
    from tests.common.models import SimpleModel, make_dataloader

    # the run file's message: one check, in CheckpointConfig, for both
    with pytest.raises(ValueError, match=r"save_interval: '-5ba' is negative; save_interval "
                                         r"must be a positive Time such as '1ep' or '500ba'"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="2ba",
                save_folder=str(tmp_path / "save"), save_interval="-5ba", device="cpu",
                progress_bar=False)


# ------------------------------------------------------------------------------- item 4


@pytest.mark.parametrize("override,key,expected", [
    ("callbacks={{os.system: {{command: 'touch {marker}'}}}}", "callbacks.os.system",
     "a class deriving from cadence.Callback"),
    ("model={{name: os.system, command: 'touch {marker}'}}", "model.name",
     "a class deriving from torch.nn.Module, or a function of your own code (outside the "
     "Python standard library and builtins) that builds the model"),
    ("loggers={{'subprocess:call': {{args: 'touch {marker}', shell: true}}}}",
     "loggers.subprocess:call", "a class deriving from cadence.loggers.LoggerDestination"),
    ("algorithms={{builtins.exec: {{source: 'open(\"{marker}\", \"w\")'}}}}",
     "algorithms.builtins.exec", "a class deriving from cadence.Algorithm"),
])
def test_a_run_file_cannot_call_the_standard_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, key: str, expected: str
) -> None:
    marker = tmp_path / "pwned"
    err = refused(tmp_path, capsys, override.format(marker=marker))
    assert not marker.exists()
    assert f"{key}: " in err and "is in the Python standard library" in err, err
    assert f"a dotted path here must name {expected}." in err, err


def test_the_refusal_comes_at_the_schema_stage_without_torch(tmp_path: Path) -> None:
    """The first stage refuses ``os.system`` itself: torch is never imported."""
    import subprocess

    marker = tmp_path / "pwned"
    run = write_run(tmp_path)
    code = textwrap.dedent(f"""
        import sys
        from cadence.config.load import ConfigError, load_config
        try:
            load_config({str(run)!r}, ["model={{name: os.system, command: 'touch {marker}'}}"])
        except ConfigError as exc:
            print(exc)
        print("torch imported:", "torch" in sys.modules)
    """)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=repo, timeout=120)
    assert "model.name: 'os.system' is in the Python standard library (os)" in proc.stdout
    assert "torch imported: False" in proc.stdout, proc.stdout + proc.stderr
    assert not marker.exists()


def test_user_code_that_hands_out_a_standard_library_function_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``my_pkg.system = os.system``: the target's own module decides, checked before any
    call; the user's module itself may be imported (a run file may run the user's code)."""
    (tmp_path / "trust_user_pkg.py").write_text(
        "import os\nfrom os import system\nclass NotACallback:\n"
        "    def __init__(self, command=''):\n        os.system(command)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trust_user_pkg", raising=False)
    marker = tmp_path / "pwned"
    err = refused(tmp_path, capsys,
                  f"model={{name: trust_user_pkg.system, command: 'touch {marker}'}}",
                  f"callbacks={{trust_user_pkg.NotACallback: {{command: 'touch {marker}'}}}}")
    assert not marker.exists()
    assert ("model.name: 'trust_user_pkg.system' is posix.system, a function of the Python "
            "standard library or builtins, which cadence does not call from a run file") in err
    assert ("callbacks.trust_user_pkg.NotACallback: 'trust_user_pkg.NotACallback' is the class "
            "trust_user_pkg.NotACallback, which does not derive from what a callback must be; "
            "a dotted path here must name a class deriving from cadence.Callback.") in err


def test_user_builders_and_components_still_load(tmp_path: Path) -> None:
    """Dotted paths to the user's functions and to subclasses of the right base stay."""
    cfg = load_config(write_run(tmp_path), [
        "optimizer={name: torch.optim.SGD, lr: 0.1}",
        "callbacks={tests.common.failing.FailOnRank: {rank: 1, batch: 2}}",
    ])
    assert cfg.model["name"] == f"{HERE}.recording_model"


# ------------------------------------------------------------------------------- weak items


@pytest.mark.parametrize("overrides,message", [
    (["model.n_layer=-1"], "model.n_layer: -1 is out of range; use a number >= 1"),
    (["model.n_embd=0"], "model.n_embd: 0 is out of range; use a number >= 1"),
    (["model.n_head=3", "model.n_embd=64"],
     "model.n_head: 3 does not divide n_embd=64 (each head gets n_embd / n_head dimensions); "
     "use a divisor of 64, e.g. 1, 2, 4."),
])
def test_gpt2_sizes_are_checked_at_the_value_stage(overrides: list[str], message: str) -> None:
    """Refused by the value checks (declared on the builder), not inside the builder."""
    run = Path(__file__).resolve().parents[2] / "yamls" / "quickstart.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(run, overrides)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize("override,message", [
    ("run_name=a/b", "run_name: 'a/b' would name a path outside the run's folder"),
    ("run_name=..", "run_name: '..' would name a path outside the run's folder"),
    ("save_filename=../ep{epoch}", "save_filename: '../ep{epoch}' climbs out of save_folder "
                                   "with '..'"),
    ("save_filename=/tmp/ep{epoch}", "save_filename: '/tmp/ep{epoch}' is an absolute path; "
                                     "checkpoint names are relative to save_folder"),
    ("save_latest_filename=../../latest", "save_latest_filename: '../../latest' climbs out of "
                                          "save_folder"),
])
def test_names_that_leave_the_save_folder_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    assert message in refused(tmp_path, capsys, override)


def test_an_override_yaml_cannot_parse_is_named_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(tmp_path, capsys, "save_filename={foo}-ba{batch}")
    assert ("save_filename: the value of override 'save_filename={foo}-ba{batch}' is not valid "
            "YAML (did not find expected <document start>); quote it to give it as a string: "
            "save_filename='{foo}-ba{batch}'") in err, err


def test_an_oversized_run_file_is_refused_for_its_size(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    with run.open("a") as f:
        f.write("variables:\n  blob: '" + "x" * (load_module.MAX_RUN_FILE_BYTES + 1) + "'\n")
    with pytest.raises(ConfigError, match=r"is 8.0 MiB; a run file may be at most 8 MiB"):
        load_config(run)


def test_a_big_honest_run_file_parses_and_the_node_limit_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12,000 plain keys (refused before as "node expansion exceeds alias limits") parse;
    past the node limit the message says what the limit is."""
    keys = "".join(f"  key_{i}: {i}\n" for i in range(12_000))
    run = write_run(tmp_path, "variables:\n" + keys)
    raw = load_module._load_raw(run, str(run))
    assert len(raw["variables"]) == 12_000
    monkeypatch.setattr(load_module, "MAX_YAML_NODES", 1_000)
    with pytest.raises(ConfigError, match=r"cannot parse YAML: it has more than 1,000 YAML "
                                          r"nodes \(keys and values, aliases expanded\), the "
                                          r"most a run file may have"):
        load_config(run)


def test_eval_subset_num_batches_zero_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(tmp_path, capsys, "eval_subset_num_batches=0")
    assert ("eval_subset_num_batches: 0 would evaluate no batches (NaN metrics); use -1 (all "
            "batches) or a positive number of batches") in err


def test_an_empty_eval_loader_is_refused_at_start() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import Trainer
    from tests.common.models import SimpleModel, make_dataloader

    empty = DataLoader(TensorDataset(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long)),
                       batch_size=4)
    with pytest.raises(ValueError, match=r"eval dataloader 'eval' has no batches on rank 0: "
                                         r"its metrics would be NaN"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="2ba",
                eval_dataloader=empty, device="cpu", progress_bar=False)
    with pytest.raises(ValueError, match=r"eval_subset_num_batches: 0 would evaluate no batches"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="2ba",
                eval_subset_num_batches=0, device="cpu", progress_bar=False)
