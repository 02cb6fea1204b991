"""One description of a run's settings (issue 30): ``TrainerConfig``'s sections are the only
place a setting is declared, documented and checked. The run file's schema, the Trainer's
signature and ``build_trainer`` follow them, and a bad value gets the same message from a
run file, from a section built in Python and from Composer's flat ``Trainer`` arguments."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from cadence import Trainer
from cadence.checkpoint.checkpoint_config import CheckpointConfig
from cadence.registry.errors import ConfigError
from cadence.config.load import load_config
from cadence.config.schema import TrainConfig
from cadence.trainer.preemption import PreemptionConfig
from cadence.trainer.trainer_config import (
    FLAT_KEYS, SECTIONS, EvalConfig, LoggingConfig, RunConfig, TrainerConfig, flat_fields,
)
from tests.common.models import SimpleModel, make_dataloader

RUN_FILE = {"max_duration": "2ba", "global_train_batch_size": 4,
            "model": {"name": "gpt2", "n_layer": 1}, "train_loader": {"name": "shakespeare"}}


def _trainer(**settings: Any) -> Trainer:
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), device="cpu",
                   progress_bar=False, **{"max_duration": "2ba", **settings})


def _run_file_settings() -> set[str]:
    return {f.name for section in SECTIONS.values() for f in section.run_file_fields()}


def test_every_setting_is_declared_once() -> None:
    names = [f.name for section in SECTIONS.values() for f in dataclasses.fields(section)]
    assert len(names) == len(set(names))
    assert set(FLAT_KEYS) == set(names) | {"parallelism_config", "compile_config"}


def test_the_run_file_schema_is_the_sections() -> None:
    """Every run-file setting of a section is a TrainConfig key; nothing else but the run's
    components is."""
    run_file = {f.name for f in dataclasses.fields(TrainConfig)}
    components = {"global_train_batch_size", "model", "train_loader", "device_eval_batch_size",
                  "eval_loader", "optimizer", "scheduler", "algorithms", "callbacks", "loggers",
                  "variables"}
    assert run_file == _run_file_settings() | components | {"parallelism_config",
                                                            "compile_config"}
    python_only = set(flat_fields()) - _run_file_settings()
    assert {"save_ignore_keys", "load_object_store", "console_stream"} <= python_only
    assert not python_only & run_file


def test_the_trainer_signature_lists_every_setting() -> None:
    params = inspect.signature(Trainer).parameters
    assert set(FLAT_KEYS) <= set(params)
    assert params["save_async"].default is False
    assert params["preemption_signals"].default == ["SIGTERM", "SIGUSR1"]
    assert params["save_async"].kind == inspect.Parameter.KEYWORD_ONLY


def test_build_trainer_hands_every_setting_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """No keyword fan-out to keep in step: every run-file setting reaches the Trainer."""
    import cadence.trainer.trainer as trainer_module
    from cadence.config.build import build_trainer

    seen: dict[str, Any] = {}

    class Capture:
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)

    monkeypatch.setattr(trainer_module, "Trainer", Capture)
    build_trainer(load_config({**RUN_FILE, "train_loader": {"name": "shakespeare",
                                                             "seq_len": 16},
                               "model": {"name": "gpt2", "n_layer": 1, "n_embd": 16,
                                         "n_head": 2}}))
    assert _run_file_settings() | {"parallelism_config", "compile_config"} <= set(seen)


@pytest.mark.parametrize("key, value, message", [
    ("save_interval", "-5ba", "save_interval: '-5ba' is negative; save_interval must be a "
                              "positive Time"),
    ("eval_subset_num_batches", 0, "eval_subset_num_batches: 0 would evaluate no batches"),
    ("log_interval", "0ba", "log_interval: '0ba' is zero; log_interval must be a positive Time"),
    ("save_state_dict_type", "shard", "save_state_dict_type: 'shard' (str) is not one of: full, "
                                      "sharded, null. Did you mean 'sharded'?"),
    ("preemption_timeout", -1.5, "preemption_timeout: -1.5 must be a positive number of "
                                 "seconds"),
    ("scale_schedule_ratio", 0.0, "scale_schedule_ratio: scale_schedule_ratio must be > 0"),
    ("ddp_sync_strategy", "forced_sync", "ddp_sync_strategy: ddp_sync_strategy='forced_sync' is "
                                         "not one of"),
])
def test_a_bad_value_reads_the_same_from_yaml_python_and_trainer(
        key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as from_yaml:
        load_config({**RUN_FILE, key: value})
    section = SECTIONS[FLAT_KEYS[key]]
    with pytest.raises(ConfigError) as from_python:
        section(**{key: value})
    with pytest.raises(ConfigError) as from_trainer:
        _trainer(**{key: value})
    for error in (from_yaml, from_python, from_trainer):
        assert message in str(error.value), (error.value, message)
        assert [p.key for p in error.value.problems] == [key]


def test_every_problem_at_once_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _trainer(max_duration="0.5dur", save_interval="-1ep", eval_subset_num_batches=0,
                 seed=-3, save_folder=str(tmp_path / "never"))
    assert {p.key for p in err.value.problems} == {
        "max_duration", "save_interval", "eval_subset_num_batches", "seed"}
    assert not (tmp_path / "never").exists()  # nothing was built, the folder not made


def test_an_unknown_keyword_is_a_type_error_with_a_suggestion() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'save_asyncc'\. Did you "
                                        r"mean 'save_async'\?"):
        _trainer(save_asyncc=True)


def test_composers_load_ignore_keys_none_is_accepted() -> None:
    """Composer's default (llm-foundry passes it) is None, meaning no keys."""
    trainer = _trainer(load_ignore_keys=None)
    assert trainer.config.checkpoint.load_ignore_keys == []
    trainer.close()


def test_the_trainer_keeps_the_typed_tree() -> None:
    trainer = _trainer(save_async=True, eval_interval="3ba", log_interval="2ba",
                       preemption_signals=["SIGUSR2"], run_name="tree")
    config = trainer.config
    assert isinstance(config, TrainerConfig)
    assert config.checkpoint.save_async is True and config.eval.eval_interval == "3ba"
    assert config.logging.log_interval == "2ba" and config.run.run_name == "tree"
    assert config.preemption.preemption_signals == ["SIGUSR2"]
    assert config.parallelism.fsdp is None and config.compile is None
    assert TrainerConfig.from_flat(config.to_flat()) == config
    trainer.close()


def test_sections_built_in_python_check_themselves() -> None:
    assert CheckpointConfig(save_interval=lambda state, event: False).save_interval is not None
    assert RunConfig(precision="AMP_BF16").precision == "amp_bf16"
    with pytest.raises(ConfigError, match="seed: -1 is out of range"):
        RunConfig(seed=-1)
    with pytest.raises(ConfigError, match="'SIGKILL' is not a signal cadence checkpoints on"):
        PreemptionConfig(preemption_signals=["SIGKILL"])
    with pytest.raises(ConfigError, match="console_log_interval"):
        LoggingConfig(console_log_interval="-2ba")
    assert EvalConfig(eval_interval=0).eval_interval == 0  # 0: never (Composer's)
