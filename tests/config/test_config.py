"""Run-config loading and checking (cadence.config.load) and building (cadence.config.build).

Components are tiny fakes registered under ``test_config_*`` names (or named by dotted
path), so these tests do not depend on the real gpt2/shakespeare entries.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import torch

from cadence.registry import registry
from cadence.config.build import build_trainer, per_device_batch_size
from cadence.config.load import (
    ConfigError, Precision, TrainConfig, config_to_dict, load_config, validate_config,
)
from cadence.parallel.config import FSDPConfig, ParallelismConfig
from cadence.core.time import Time, TimeUnit

# --------------------------------------------------------------------------------------------
# Tiny components.


class TinyModel(torch.nn.Module):
    def __init__(self, n_layer: int, n_head: int = 2, dropout: float = 0.0,
                 label: Optional[str] = None, activation: Literal["relu", "gelu"] = "gelu",
                 bias: bool = True) -> None:
        super().__init__()
        if n_layer > 100:
            raise ValueError("n_layer must be <= 100")
        self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2, bias=bias) for _ in range(n_layer))


def tiny_loader(batch_size: int, split: str = "train", seq_len: int = 8) -> dict[str, Any]:
    return {"batch_size": batch_size, "split": split, "seq_len": seq_len}


class TinySchedule:
    def __init__(self, t_warmup: str = "0ba", alpha_f: float = 0.0) -> None:
        self.t_warmup, self.alpha_f = t_warmup, alpha_f


class TinyCallback:
    def __init__(self, window_size: int = 10) -> None:
        self.window_size = window_size


class TinyAlgorithm:
    def __init__(self, clipping_threshold: float = 1.0) -> None:
        self.clipping_threshold = clipping_threshold


FAKES = {
    registry.models: {"test_config_model": TinyModel},
    registry.datasets: {"test_config_data": tiny_loader,
                        "test_config_no_batch_size_loader": lambda split="val": []},
    registry.schedulers: {"test_config_schedule": TinySchedule},
    registry.callbacks: {"test_config_callback": TinyCallback},
    registry.algorithms: {"test_config_algorithm": TinyAlgorithm},
    registry.loggers: {"test_config_logger": TinyCallback},
}


@pytest.fixture(autouse=True)
def fake_components(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the fakes for one test only, so that the contract tests, which run over every
    registered callback and algorithm, never see them.

    Look-ups first import cadence's built-in modules; those are written concurrently, so only
    the ones that import today are kept (these tests use only the fakes).
    """
    importable = []
    for name in registry._BUILTIN_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module being written may fail in any way
            continue
        importable.append(name)
    monkeypatch.setattr(registry, "_BUILTIN_MODULES", tuple(importable))
    monkeypatch.setattr(registry, "_builtins_loaded", False)
    for reg, entries in FAKES.items():
        for name, obj in entries.items():
            monkeypatch.setitem(reg._entries, name, obj)


VALID = """\
run_name: unit
seed: 5
max_duration: 2ep
eval_interval: 100ba
global_train_batch_size: 16
device_train_microbatch_size: 4
precision: amp_bf16
model:        {name: test_config_model, n_layer: 3, dropout: 0.1}
train_loader: {name: test_config_data, split: train, seq_len: 16}
eval_loader:  {name: test_config_data, split: val}
optimizer:    {name: torch.optim.SGD, lr: 0.1, momentum: 0.9}
scheduler:    {name: test_config_schedule, t_warmup: 20ba, alpha_f: 0.1}
algorithms:   {test_config_algorithm: {clipping_threshold: 2}}
callbacks:    {test_config_callback: {window_size: 3}}
loggers:      {test_config_logger: null}
"""


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def errors_of(source: Any, overrides: tuple[str, ...] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, list(overrides))
    message = str(info.value)
    assert "full_key" not in message and "object_type" not in message  # no raw OmegaConf text
    return info.value


def with_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


# --------------------------------------------------------------------------------------------
# A valid config.


def test_valid_config_gives_typed_values(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, VALID))
    assert isinstance(cfg, TrainConfig)
    assert cfg.run_name == "unit"
    assert cfg.seed == 5 and isinstance(cfg.seed, int)
    assert cfg.precision is Precision.AMP_BF16
    assert Time.from_timestring(cfg.max_duration) == Time(2, TimeUnit.EPOCH)
    assert Time.from_timestring(cfg.eval_interval).unit == TimeUnit.BATCH
    assert cfg.model == {"name": "test_config_model", "n_layer": 3, "dropout": 0.1}
    assert type(cfg.model) is dict and type(cfg.optimizer) is dict
    assert cfg.loggers == {"test_config_logger": {}}  # null arguments mean {}
    assert cfg.device is None and cfg.parallelism_config is None
    assert config_to_dict(cfg)["precision"] == "amp_bf16"


def test_run_name_defaults_to_file_stem_and_time(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, with_line(VALID, "run_name: unit\n", ""), "quick.yaml"))
    assert cfg.run_name is not None and cfg.run_name.startswith("quick-")
    as_dict = dict(global_train_batch_size=8, max_duration="1ba",
                   model={"name": "test_config_model", "n_layer": 1},
                   train_loader={"name": "test_config_data"})
    assert load_config(as_dict).run_name is None


def test_interpolation_through_variables(tmp_path: Path) -> None:
    text = VALID + "variables: {seq: 64}\n"
    text = with_line(text, "seq_len: 16", "seq_len: '${variables.seq}'")
    assert load_config(write(tmp_path, text)).train_loader["seq_len"] == 64
    err = errors_of(write(tmp_path, with_line(VALID, "seq_len: 16", "seq_len: '${nope}'")))
    assert "train_loader.seq_len" in str(err) and "interpolation" in str(err)


# --------------------------------------------------------------------------------------------
# Overrides.


def test_overrides_merge(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, VALID), ["seed=3", "model.n_layer=2",
                                               "callbacks.test_config_callback.window_size=7"])
    assert cfg.seed == 3
    assert cfg.model["n_layer"] == 2 and cfg.model["dropout"] == 0.1
    assert cfg.callbacks == {"test_config_callback": {"window_size": 7}}


def test_override_with_unknown_key_fails_the_same_way(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, VALID), ("max_duraton=3ep", "model.n_layers=2"))
    message = str(err)
    assert "max_duraton: unknown key. Did you mean 'max_duration'?" in message
    assert "model.n_layers" in message and "Did you mean 'n_layer'?" in message
    assert "(set by override 'model.n_layers=2')" in message


def test_malformed_override(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, VALID), ("seed",))
    assert "seed" in str(err) and "key=value" in str(err)


# --------------------------------------------------------------------------------------------
# Top-level problems.


def test_unknown_top_level_key_suggests_the_closest(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, VALID + "eval_intervall: 1ep\nshardin_strategy: FULL_SHARD\n"))
    message = str(err)
    assert "eval_intervall: unknown key. Did you mean 'eval_interval'?" in message
    assert "shardin_strategy: unknown key." in message
    assert "Allowed top-level keys:" in message and "parallelism_config" in message


def test_wrong_type_names_key_value_and_type(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, with_line(VALID, "seed: 5", "seed: abc")))
    assert [p.key for p in err.problems] == ["seed"]
    assert "seed: 'abc' (str) is not an int" in str(err)


def test_wrong_type_for_bool_and_optional_int(tmp_path: Path) -> None:
    text = VALID + "progress_bar: maybe\ndevice_eval_batch_size: lots\n"
    err = errors_of(write(tmp_path, text))
    message = str(err)
    assert "progress_bar: 'maybe' (str) is not a bool" in message
    assert "device_eval_batch_size: 'lots' (str) is not an int or null" in message


def test_bad_enum_lists_allowed_values(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, with_line(VALID, "precision: amp_bf16", "precision: bf16")))
    message = str(err)
    assert "precision: 'bf16' (str) is not one of: fp32, amp_bf16, amp_fp16." in message
    assert "Did you mean 'amp_bf16'?" in message


def test_bad_device(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, VALID + "device: tpu\n"))
    assert "device: 'tpu' (str) is not one of: cpu, cuda, null." in str(err)


def test_bad_time_string_names_key_and_units(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, with_line(VALID, "max_duration: 2ep", "max_duration: 2epochs")))
    message = str(err)
    assert "max_duration: " in message and "'2epochs'" in message
    assert "'ep', 'ba', 'sp', 'tok', 'dur'" in message


def test_max_duration_cannot_be_in_dur(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, with_line(VALID, "max_duration: 2ep", "max_duration: 0.5dur")))
    assert "max_duration: '0.5dur' is in 'dur'" in str(err)


def test_missing_required_keys() -> None:
    err = errors_of({})
    assert [p.key for p in err.problems] == [
        "max_duration", "global_train_batch_size", "model", "train_loader"]
    assert "max_duration: is required" in str(err)


def test_out_of_range_numbers(tmp_path: Path) -> None:
    text = with_line(VALID, "global_train_batch_size: 16", "global_train_batch_size: 0")
    text = with_line(text, "seed: 5", "seed: -1") + "eval_subset_num_batches: -2\n"
    keys = {p.key for p in errors_of(write(tmp_path, text)).problems}
    assert keys == {"global_train_batch_size", "seed", "eval_subset_num_batches"}


def test_parallelism_config_is_validated_with_the_rest(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, VALID + "parallelism_config: null\n"))
    good = load_config(write(tmp_path, VALID + "parallelism_config: {fsdp: {sharding_strategy: "
                                              "SHARD_GRAD_OP}}\n"))
    # typed once, by load_config; the hyperparameters read as the file wrote it
    assert good.parallelism_config == ParallelismConfig(
        fsdp=FSDPConfig(sharding_strategy="SHARD_GRAD_OP"))
    assert config_to_dict(good)["parallelism_config"] == {
        "fsdp": {"sharding_strategy": "SHARD_GRAD_OP"}}
    text = VALID.replace("seed: 5", "seed: abc") + (
        "parallelism_config: {fsdp: {shardin_strategy: FULL_SHARD, mixed_precision: HALF}}\n")
    err = errors_of(write(tmp_path, text))
    by_key = {p.key: p.message for p in err.problems}
    assert set(by_key) == {"seed", "parallelism_config.fsdp.shardin_strategy",
                           "parallelism_config.fsdp.mixed_precision"}
    assert "Did you mean 'sharding_strategy'" in by_key["parallelism_config.fsdp.shardin_strategy"]
    assert "DEFAULT, PURE, FULL" in by_key["parallelism_config.fsdp.mixed_precision"]


def test_section_of_wrong_shape(tmp_path: Path) -> None:
    text = with_line(VALID, "callbacks:    {test_config_callback: {window_size: 3}}",
                     "callbacks: [test_config_callback]")
    text = with_line(text, "optimizer:    {name: torch.optim.SGD, lr: 0.1, momentum: 0.9}",
                     "optimizer: sgd")
    message = str(errors_of(write(tmp_path, text)))
    assert "callbacks: expected a mapping of name -> arguments" in message
    assert "optimizer: expected a mapping such as {name: adamw, ...}, got 'sgd' (str)" in message


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    assert "does not exist" in str(errors_of(tmp_path / "nope.yaml"))
    assert "cannot parse YAML" in str(errors_of(write(tmp_path, "seed: [1, 2\n")))


# --------------------------------------------------------------------------------------------
# Component problems.


def test_unknown_component_name_uses_registry_message(tmp_path: Path) -> None:
    text = with_line(VALID, "name: test_config_model", "name: test_config_modle")
    err = errors_of(write(tmp_path, text))
    assert [p.key for p in err.problems] == ["model.name"]
    assert registry.models.unknown_message("test_config_modle") in str(err)
    assert "Did you mean 'test_config_model'?" in str(err)


def test_unknown_component_in_a_named_section(tmp_path: Path) -> None:
    text = with_line(VALID, "test_config_callback: {window_size: 3}",
                     "test_config_calback: {window_size: 3}")
    err = errors_of(write(tmp_path, text))
    assert [p.key for p in err.problems] == ["callbacks.test_config_calback"]
    assert "Did you mean 'test_config_callback'?" in str(err)


def test_unknown_component_argument_suggests_the_closest(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, with_line(VALID, "n_layer: 3", "n_layers: 3")))
    message = str(err)
    assert "model.n_layers: unknown argument for model 'test_config_model'" in message
    assert "Did you mean 'n_layer'?" in message
    assert "It takes: n_layer, n_head, dropout, label, activation, bias." in message
    # n_layer has no default, so it is now missing too
    assert "model.n_layer: is required by model 'test_config_model'" in message


def test_component_argument_types(tmp_path: Path) -> None:
    text = with_line(VALID, "dropout: 0.1",
                     "dropout: high, n_head: 2.5, label: 7, activation: gelo, bias: 1")
    message = str(errors_of(write(tmp_path, text)))
    assert "model.dropout: 'high' (str) is not a float." in message
    assert "model.n_head: 2.5 (float) is not an int." in message
    assert "model.label: 7 (int) is not a str or null." in message
    assert ("model.activation: 'gelo' (str) is not one of: relu, gelu. Did you mean 'gelu'?"
            in message)
    assert "model.bias: 1 (int) is not a bool." in message


def test_component_argument_types_accept_fitting_values(tmp_path: Path) -> None:
    text = with_line(VALID, "dropout: 0.1", "dropout: 0, label: null, activation: relu")
    assert load_config(write(tmp_path, text)).model["dropout"] == 0  # an int is a fine float


def test_time_valued_argument_is_checked(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, with_line(VALID, "t_warmup: 20ba", "t_warmup: 20batches")))
    assert "scheduler.t_warmup: '20batches' (str) is not a valid Time string" in str(err)
    assert "'ep', 'ba'" in str(err)


def test_optimizer_params_and_loader_batch_size_are_filled_by_cadence(tmp_path: Path) -> None:
    # SGD's first parameter (params) is not asked for; batch_size in a loader is refused.
    text = with_line(VALID, "split: val", "split: val, batch_size: 4")
    err = errors_of(write(tmp_path, text))
    assert [p.key for p in err.problems] == ["eval_loader.batch_size"]
    assert "device_eval_batch_size" in str(err)
    text = with_line(VALID, "split: train", "split: train, batch_size: 4")
    err = errors_of(write(tmp_path, text))
    assert "train_loader.batch_size: is set by cadence" in str(err)
    assert "global_train_batch_size" in str(err)


def test_loader_must_take_batch_size(tmp_path: Path) -> None:
    text = with_line(VALID, "{name: test_config_data, split: val}",
                     "{name: test_config_no_batch_size_loader}")
    err = errors_of(write(tmp_path, text))
    assert "eval_loader: dataset 'test_config_no_batch_size_loader'" in str(err)
    assert "does not take 'batch_size'" in str(err)


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = with_line(VALID, "seed: 5", "seed: abc")
    text = with_line(text, "n_layer: 3", "n_layers: 3") + "shardin_strategy: FULL_SHARD\n"
    text = with_line(text, "precision: amp_bf16", "precision: bf16")
    err = errors_of(write(tmp_path, text))
    keys = [p.key for p in err.problems]
    assert {"seed", "shardin_strategy", "precision", "model.n_layers", "model.n_layer"} <= set(keys)
    assert str(err).startswith(f"{len(keys)} problems in run config ")


def test_schema_problems_are_reported_before_the_values_are_checked(tmp_path: Path) -> None:
    # Two stages: a schema problem (here a wrong type) is raised before the components are
    # imported and the values checked (here a checkpoint that does not exist).
    path = write(tmp_path, VALID)
    err = errors_of(path, ("seed=abc", "load_path=/nonexistent/ep1.pt"))
    assert [p.key for p in err.problems] == ["seed"]
    err = errors_of(path, ("load_path=/nonexistent/ep1.pt",))
    assert [p.key for p in err.problems] == ["load_path"]
    assert "'/nonexistent/ep1.pt' does not exist" in str(err)


def test_validate_config_checks_a_config_built_in_python() -> None:
    cfg = TrainConfig(max_duration="1ba", global_train_batch_size=4,
                      model={"name": "test_config_model", "n_layerz": 1},
                      train_loader={"name": "test_config_data"})
    with pytest.raises(ConfigError, match=r"model\.n_layerz: unknown argument"):
        validate_config(cfg)


# --------------------------------------------------------------------------------------------
# build_trainer, with a stand-in Trainer that records its arguments.


class RecordingTrainer:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[str] = []

    def fit(self) -> None:
        self.calls.append("fit")

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture
def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> type[RecordingTrainer]:
    module = types.ModuleType("cadence.trainer.trainer")
    module.Trainer = RecordingTrainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cadence.trainer.trainer", module)
    return RecordingTrainer


def test_build_trainer_wires_every_component(
    tmp_path: Path, fake_trainer: type[RecordingTrainer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    trainer = build_trainer(load_config(write(tmp_path, VALID)))
    kw = trainer.kwargs  # type: ignore[attr-defined]
    assert isinstance(kw["model"], TinyModel) and len(kw["model"].layers) == 3
    assert kw["train_dataloader"] == {"batch_size": 8, "split": "train", "seq_len": 16}
    assert kw["eval_dataloader"]["batch_size"] == 8  # defaults to the per-device train batch
    assert isinstance(kw["optimizers"], torch.optim.SGD)
    assert kw["optimizers"].param_groups[0]["params"][0] is next(kw["model"].parameters())
    assert isinstance(kw["schedulers"], TinySchedule) and kw["schedulers"].t_warmup == "20ba"
    assert [type(a) for a in kw["algorithms"]] == [TinyAlgorithm]
    assert kw["callbacks"][0].window_size == 3
    assert [type(x) for x in kw["loggers"]] == [TinyCallback]
    assert kw["precision"] == "amp_bf16" and type(kw["precision"]) is str
    assert (kw["max_duration"], kw["eval_interval"], kw["seed"]) == ("2ep", "100ba", 5)
    assert kw["device_train_microbatch_size"] == 4
    assert kw["hyperparameters"]["model"]["n_layer"] == 3
    assert kw["hyperparameters"]["precision"] == "amp_bf16"


def test_build_trainer_refuses_an_indivisible_global_batch(
    tmp_path: Path, fake_trainer: type[RecordingTrainer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"global_train_batch_size: 16 does not divide evenly "
                                          r"over 3 ranks"):
        build_trainer(load_config(write(tmp_path, VALID)))
    assert per_device_batch_size(16, 4) == 4


def test_build_trainer_names_the_section_a_constructor_rejected(
    tmp_path: Path, fake_trainer: type[RecordingTrainer]
) -> None:
    cfg = load_config(write(tmp_path, with_line(VALID, "n_layer: 3", "n_layer: 1000")))
    with pytest.raises(ConfigError, match=r"model: model 'test_config_model' rejected its "
                                          r"arguments .*n_layer must be <= 100"):
        build_trainer(cfg)


def test_build_trainer_does_not_call_the_trainers_own_errors_config_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Trainer error (a checkpoint that does not load, a save folder in use) is not a
    "problem in run config": it propagates as it is."""

    class RefusingTrainer(RecordingTrainer):
        def __init__(self, **kwargs: Any) -> None:
            raise ValueError("checkpoint /x/ep1.pt is corrupt")

    module = types.ModuleType("cadence.trainer.trainer")
    module.Trainer = RefusingTrainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cadence.trainer.trainer", module)
    with pytest.raises(ValueError, match=r"^checkpoint /x/ep1.pt is corrupt$") as info:
        build_trainer(load_config(write(tmp_path, VALID)))
    assert not isinstance(info.value, ConfigError)


# --------------------------------------------------------------------------------------------
# Typed once: load_config parses parallelism_config / compile_config; nothing after it does.


@pytest.fixture
def check_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the calls of each check stage and of the two section parsers."""
    from cadence.config import load, schema

    calls = {"check_schema": 0, "check_values": 0, "check_parallelism_config": 0,
             "check_compile_config": 0}

    def counting(module: Any, name: str) -> None:
        real = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(load, "check_schema")
    counting(load, "check_values")
    counting(schema, "check_parallelism_config")
    counting(schema, "check_compile_config")
    return calls


TYPED_SECTIONS_YAML = (
    "parallelism_config: {tp: {tensor_parallel_degree: 1, layer_plan: {layers.0: colwise}}}\n"
    "compile_config: {backend: eager, per_block: false}\n")


def test_load_config_types_the_sections_once_and_build_trainer_takes_them_as_they_are(
    tmp_path: Path, fake_trainer: type[RecordingTrainer], check_calls: dict[str, int]
) -> None:
    from cadence.parallel.compile_config import CompileConfig
    from cadence.parallel.config import TPConfig

    cfg = load_config(write(tmp_path, VALID + TYPED_SECTIONS_YAML))
    assert cfg.parallelism_config == ParallelismConfig(
        tp=TPConfig(tensor_parallel_degree=1, layer_plan={"layers.0": "colwise"}))
    assert cfg.compile_config == CompileConfig(backend="eager", per_block=False)
    once = {"check_schema": 1, "check_values": 1, "check_parallelism_config": 1,
            "check_compile_config": 1}
    assert check_calls == once

    trainer = build_trainer(cfg)
    assert check_calls == once  # build_trainer checked nothing again
    kw = trainer.kwargs  # type: ignore[attr-defined]
    assert kw["parallelism_config"] is cfg.parallelism_config  # the very objects, not a dict
    assert kw["compile_config"] is cfg.compile_config
    assert kw["hyperparameters"]["parallelism_config"] == {
        "tp": {"layer_plan": {"layers.0": "colwise"}}}
    assert kw["hyperparameters"]["compile_config"] == {"backend": "eager", "per_block": False}


def test_build_trainer_checks_a_config_built_in_python_and_types_it(
    tmp_path: Path, fake_trainer: type[RecordingTrainer], check_calls: dict[str, int]
) -> None:
    import dataclasses

    from cadence.parallel.compile_config import CompileConfig

    cfg = TrainConfig(max_duration="1ba", global_train_batch_size=4,
                      model={"name": "test_config_model", "n_layer": 1},
                      train_loader={"name": "test_config_data"},
                      parallelism_config={"fsdp": {"sharding_strategy": "shard_grad_op"}},
                      compile_config={"backend": "eager", "per_block": False})
    kw = build_trainer(cfg).kwargs  # type: ignore[attr-defined]
    assert check_calls["check_schema"] == check_calls["check_values"] == 1
    assert kw["parallelism_config"] == ParallelismConfig(
        fsdp=FSDPConfig(sharding_strategy="SHARD_GRAD_OP"))
    assert isinstance(kw["compile_config"], CompileConfig)
    # a loaded config changed into a copy is checked again: here its bad value is caught
    loaded = load_config(write(tmp_path, VALID))
    with pytest.raises(ConfigError, match=r"parallelism_config.fsdp.shardin_strategy"):
        build_trainer(dataclasses.replace(
            loaded, parallelism_config={"fsdp": {"shardin_strategy": "FULL_SHARD"}}))


def test_validate_config_returns_the_typed_config() -> None:
    cfg = TrainConfig(max_duration="1ba", global_train_batch_size=4,
                      model={"name": "test_config_model", "n_layer": 1},
                      train_loader={"name": "test_config_data"},
                      parallelism_config={"fsdp": {}})
    checked = validate_config(cfg)
    assert checked.parallelism_config == ParallelismConfig(fsdp=FSDPConfig())
    assert cfg.parallelism_config == {"fsdp": {}}  # the argument is left as it is
    assert validate_config(checked) == checked  # typed sections are accepted as they are


def test_compile_backend_is_checked_by_the_second_stage(tmp_path: Path) -> None:
    err = errors_of(write(tmp_path, VALID + "compile_config: {backend: inductr}\n"))
    assert [p.key for p in err.problems] == ["compile_config.backend"]
    assert "'inductr' is not a dynamo backend" in str(err)
    assert "Did you mean 'inductor'?" in str(err)


def test_one_did_you_mean_for_every_check() -> None:
    from cadence.registry.errors import did_you_mean
    from cadence.parallel.config import parse_parallelism_config

    assert did_you_mean("shard_grad_opp", ["FULL_SHARD", "SHARD_GRAD_OP"]) == ""
    assert did_you_mean("shard_grad_opp", ["FULL_SHARD", "SHARD_GRAD_OP"], ignore_case=True) \
        == " Did you mean 'SHARD_GRAD_OP'?"  # shown as the option is spelled
    # values accepted in any case get their hint from the same helper
    with pytest.raises(ValueError) as info:
        parse_parallelism_config({"fsdp": {"sharding_strategy": "full_shart",
                                           "state_dict_type": "SHRADED"}})
    assert "'full_shart' is not one of: FULL_SHARD" in str(info.value)
    assert "Did you mean 'FULL_SHARD'?" in str(info.value)
    assert "'SHRADED' is not one of: full, sharded. Did you mean 'sharded'?" in str(info.value)
