"""Typed configuration of a run, loaded from a YAML run file plus ``key=value`` overrides.

A run file (Composer / llm-foundry style)::

    run_name: quickstart
    seed: 17
    max_duration: 2ep
    global_train_batch_size: 16
    precision: amp_bf16
    model:        {name: gpt2, n_layer: 4, n_head: 4, n_embd: 128}
    train_loader: {name: shakespeare, split: train, seq_len: 128}
    optimizer:    {name: adamw, lr: 3.0e-3, weight_decay: 0.1, betas: [0.9, 0.95]}
    algorithms:   {gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}}
    callbacks:    {lr_monitor: {}}

is read with OmegaConf, merged with overrides (``seed=3 model.n_layer=2``), interpolated
(``${variables.seq_len}``) and turned into a :class:`TrainConfig` at once. Every problem is
collected and reported together in one :class:`ConfigError` (the approach of torchtune's
``torchtune/config/_validate.py``), each naming the full key path, the bad value and the
allowed values or the closest match. Component sections (``model``, ``train_loader``,
``optimizer``, ``algorithms``...) name a registry entry or a dotted import path
(see :mod:`cadence.trainer.registry`); their arguments are checked against the
component's signature before anything is built.

``from __future__ import annotations`` is safe here: OmegaConf 2.4 resolves the dataclass
fields' string annotations with :func:`typing.get_type_hints`, so every type used in a field
annotation must be importable at module level (as they are).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import os
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Union

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cadence.trainer import registry
from cadence.trainer.arg_checks import Check, check_arg_values, greater_than, probe
from cadence.trainer.core.time import Time, TimeUnit
from cadence.trainer.precision import Precision

__all__ = [
    "TrainConfig", "Precision", "ConfigError", "ConfigProblem", "load_config",
    "validate_config", "config_to_dict", "LOADER_FILLED_ARGS", "check_global_batch_size",
]

#: Devices a run file may name; ``null`` means CUDA when available, else CPU.
_DEVICES = ("cpu", "cuda")

#: Loader arguments cadence passes itself (from the batch-size keys), so a run file must not.
LOADER_FILLED_ARGS = ("batch_size",)


@dataclass
class TrainConfig:
    """One training run, as written in a YAML run file.

    Time values are strings in :class:`~cadence.Time` syntax (``"2ep"``, ``"100ba"``,
    ``"4096sp"``, ``"1e6tok"``, ``"0.5dur"``), checked when the config is loaded.

    Args:
        max_duration: how long to train (Time string). Required; not in ``dur``.
        global_train_batch_size: samples per optimizer step over all ranks; each rank loads
            ``global_train_batch_size / world_size`` (must divide). Required.
        model: ``{name: <registered model or dotted path>, **constructor kwargs}``. Required.
        train_loader: ``{name: <registered dataset or dotted path>, **kwargs}``; the builder
            passes ``batch_size`` itself. Required.
        run_name: names the run in logs and paths; default (from a file)
            ``<file stem>-<YYYYmmdd-HHMMSS>``, or with ``autoresume`` the file stem alone (a
            relaunch of the same file must find the earlier attempt's checkpoints).
        seed: seeds ``random``, NumPy and torch before the model is built (all ranks alike)
            and is passed to the Trainer; in ``[0, 2**32)``. Default 17 (llm-foundry's).
        eval_interval: how often to evaluate (Time string); default ``"1ep"``.
        eval_subset_num_batches: eval batches per evaluation; ``-1`` (default) for all.
        device_train_microbatch_size: samples per forward/backward; ``None`` (default): the
            whole per-device batch; ``auto``: the largest that fits (halved on out-of-memory).
        device_eval_batch_size: eval samples per rank per batch; ``None`` (default): the
            per-device train batch size.
        precision: ``fp32`` (default), ``amp_bf16`` or ``amp_fp16``.
        device: ``None`` (default: CUDA when available, else CPU), ``"cpu"`` or ``"cuda"``;
            ``cuda`` on a machine without CUDA is refused when the config is loaded.
        dist_timeout: seconds a collective may wait for the other ranks before the job fails
            (Composer's name; default 600); see the Trainer argument of the same name.
        progress_bar: show a progress bar; default True.
        log_interval: how often the training loss is logged (Time string); default ``"10ba"``.
        save_folder: where run artifacts go; default none.
        eval_loader: like ``train_loader``, built with ``device_eval_batch_size``; optional.
        optimizer: ``{name: adamw|adam|sgd|<dotted path>, **kwargs}``, built as
            ``cls(model.parameters(), **kwargs)``; default: the Trainer's (AdamW).
        scheduler: ``{name: <registered schedule or dotted path>, **kwargs}``; optional.
        algorithms: ``{name: {kwargs}}``, applied in this order.
        callbacks: ``{name: {kwargs}}``.
        loggers: ``{name: {kwargs}}``.
        parallelism_config: ``{fsdp: {...}, tp: {...}}``: ``fsdp`` shards with FSDP2 (keys and
            their FSDP2 meaning: :mod:`cadence.trainer.parallel.config`), ``tp``
            (``tensor_parallel_degree``, ``layer_plan``) adds tensor parallelism
            (:mod:`cadence.trainer.parallel.tp`); null: DDP when launched on several ranks.
        compile_config: ``torch.compile`` settings (``{enabled, mode, fullgraph, dynamic,
            backend, per_block}``; see :mod:`cadence.trainer.parallel.compile`); null: none.
        save_filename, save_interval, save_num_checkpoints_to_keep, save_overwrite,
        save_weights_only, save_latest_filename, save_state_dict_type, save_async, load_path,
        load_weights_only, load_strict_model_weights, load_ignore_keys, autoresume: the
            Trainer's checkpoint arguments of the same names (checkpoints are written only
            when ``save_folder`` is set).
        variables: free-form values for interpolation (``${variables.seq_len}``); not read
            by the trainer (llm-foundry's convention).
    """

    max_duration: str = MISSING
    global_train_batch_size: int = MISSING
    model: Dict[str, Any] = MISSING
    train_loader: Dict[str, Any] = MISSING
    run_name: Optional[str] = None
    seed: int = 17
    eval_interval: str = "1ep"
    eval_subset_num_batches: int = -1
    device_train_microbatch_size: Optional[Any] = None  # int or "auto", checked below
    device_eval_batch_size: Optional[int] = None
    precision: Precision = Precision.FP32
    device: Optional[str] = None
    dist_timeout: float = 600.0
    progress_bar: bool = True
    log_interval: str = "10ba"
    save_folder: Optional[str] = None
    eval_loader: Optional[Dict[str, Any]] = None
    optimizer: Optional[Dict[str, Any]] = None
    scheduler: Optional[Dict[str, Any]] = None
    algorithms: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    callbacks: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    loggers: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    parallelism_config: Optional[Dict[str, Any]] = None
    compile_config: Optional[Dict[str, Any]] = None
    save_filename: str = "ep{epoch}-ba{batch}"
    save_interval: Optional[str] = "1ep"
    save_num_checkpoints_to_keep: int = -1
    save_overwrite: bool = False
    save_weights_only: bool = False
    save_latest_filename: str = "latest-{run_name}"
    save_state_dict_type: Optional[str] = None
    save_async: bool = False
    load_path: Optional[str] = None
    load_weights_only: bool = False
    load_strict_model_weights: bool = True
    load_ignore_keys: List[str] = field(default_factory=list)
    autoresume: bool = False
    variables: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a run config.

    Attributes:
        key: the full dotted key path (``"model.n_layers"``; ``"<root>"`` for the whole file).
        message: what is wrong and how to fix it.
    """

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class ConfigError(ValueError):
    """A run config has problems; the message lists all of them, one per line.

    Attributes:
        problems: every problem found, in file order.
        source: where the config came from (a path, ``"<dict>"``), or ``None``.
    """

    def __init__(self, problems: Sequence[ConfigProblem], source: Optional[str] = None) -> None:
        self.problems = list(problems)
        self.source = source
        count = len(self.problems)
        where = f" {source}" if source else ""
        header = f"{count} problem{'s' if count != 1 else ''} in run config{where}:"
        super().__init__("\n".join([header, *(f"  - {p}" for p in self.problems)]))


# ---------------------------------------------------------------------------------------------
# Component sections: which registry, and which arguments the builder fills itself.


@dataclass(frozen=True)
class _Section:
    registry: registry.Registry[Callable[..., Any]]
    skip_first_positional: bool = False   # optimizers: ``params``
    filled: tuple[str, ...] = ()          # loaders: ``batch_size``


_SINGLE_SECTIONS: dict[str, _Section] = {
    "model": _Section(registry.models),
    "train_loader": _Section(registry.datasets, filled=LOADER_FILLED_ARGS),
    "eval_loader": _Section(registry.datasets, filled=LOADER_FILLED_ARGS),
    "optimizer": _Section(registry.optimizers, skip_first_positional=True),
    "scheduler": _Section(registry.schedulers),
}
_MULTI_SECTIONS: dict[str, registry.Registry[Callable[..., Any]]] = {
    "algorithms": registry.algorithms,
    "callbacks": registry.callbacks,
    "loggers": registry.loggers,
}
_TIME_FIELDS = ("max_duration", "eval_interval", "log_interval", "save_interval")
_BATCH_KEY_FOR = {
    "train_loader": "global_train_batch_size", "eval_loader": "device_eval_batch_size",
}


# ---------------------------------------------------------------------------------------------
# Public API.


def load_config(
    source: Union[str, Path, Mapping[str, Any], DictConfig],
    overrides: Iterable[str] = (),
    *,
    world_size: Optional[int] = None,
) -> TrainConfig:
    """Load, merge, check and type a run config.

    Args:
        source: a YAML file path, or the config as a mapping.
        overrides: ``key=value`` strings (dotted keys, YAML values), applied in order on top
            of ``source``: ``["seed=3", "model.n_layer=2", "callbacks.lr_monitor={}"]``.
        world_size: the ranks the run will have, for the check that
            ``global_train_batch_size`` divides over them; default: ``$WORLD_SIZE`` (set by
            torchrun), else 1. ``cadence launch`` passes ``-n`` x ``--nnodes``.

    Returns:
        The typed config. ``run_name`` defaults to ``<file stem>-<YYYYmmdd-HHMMSS>`` when
        ``source`` is a file (with ``autoresume: true``, to the stable ``<file stem>``), and
        stays ``None`` for a mapping.

    Raises:
        ConfigError: listing every problem found (unknown keys with the closest allowed key,
            wrong types, bad enum values, bad Time strings, unknown component names, component
            arguments that the component's signature does not take, missing required keys,
            argument values a component declares out of range or its constructor rejects,
            see :mod:`cadence.trainer.arg_checks`; a global batch size that does not divide
            over ``world_size``). Nothing is built before this check.
    """
    label = str(source) if isinstance(source, (str, Path)) else "<dict>"
    raw = _load_raw(source, label)
    raw = _apply_overrides(raw, list(overrides), label)
    try:
        plain = OmegaConf.to_container(raw, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "<root>"
        raise ConfigError(
            [ConfigProblem(str(key), f"cannot resolve interpolation: {_first_line(exc)}")], label
        ) from None
    if not isinstance(plain, dict):
        raise ConfigError(
            [ConfigProblem("<root>", f"a run config is a mapping of keys, got {_show(plain)}.")],
            label,
        )
    typed, problems = _check(plain, world_size)
    if problems:
        raise ConfigError(_mark_overrides(problems, list(overrides)), label)
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), typed))
    except OmegaConfBaseException as exc:  # pragma: no cover - _check covers every field
        key = getattr(exc, "full_key", None) or "<root>"
        raise ConfigError([ConfigProblem(str(key), _first_line(exc))], label) from None
    assert isinstance(cfg, TrainConfig)
    if cfg.run_name is None and isinstance(source, (str, Path)):
        stem = Path(source).stem  # autoresume: the same name on every launch of this file
        cfg.run_name = stem if cfg.autoresume else (
            f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    return cfg


def validate_config(cfg: TrainConfig) -> None:
    """Check a :class:`TrainConfig` built in Python (``load_config`` already does this).

    Raises:
        ConfigError: listing every problem found, as :func:`load_config` does.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"Expected a TrainConfig, got {type(cfg).__name__}; use load_config().")
    raw = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    raw = {k: v for k, v in raw.items() if not (isinstance(v, str) and v == MISSING)}
    _, problems = _check(raw)
    if problems:
        raise ConfigError(problems, f"TrainConfig(run_name={cfg.run_name!r})")


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain, YAML/JSON-serialisable Python values (enums as their values).

    Used as the run's ``hyperparameters``.
    """
    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    return typing.cast(Dict[str, Any], _plain(container))


# ---------------------------------------------------------------------------------------------
# Loading and overrides.


def _load_raw(source: Union[str, Path, Mapping[str, Any], DictConfig], label: str) -> DictConfig:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ConfigError([ConfigProblem("<root>", f"run file {str(path)!r} does not exist.")],
                              label)
        try:
            loaded = OmegaConf.load(path)
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            problem = ConfigProblem("<root>", f"cannot parse YAML: {exc}")
            raise ConfigError([problem], label) from None
    elif isinstance(source, DictConfig):
        loaded = source
    elif isinstance(source, Mapping):
        try:
            loaded = OmegaConf.create(dict(source))
        except OmegaConfBaseException as exc:
            raise ConfigError([ConfigProblem("<root>", _first_line(exc))], label) from None
    else:
        raise TypeError(f"source must be a path or a mapping, got {type(source).__name__}.")
    if loaded is None or (isinstance(loaded, DictConfig) and loaded._is_none()):
        return OmegaConf.create({})
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            [ConfigProblem("<root>", "a run config is a mapping of keys, got a list.")],
            label,
        )
    return loaded


def _apply_overrides(raw: DictConfig, overrides: list[str], label: str) -> DictConfig:
    if not overrides:
        return raw
    problems = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            problems.append(ConfigProblem(
                item, "an override is written key=value with a dotted key, e.g. 'seed=3' or "
                      "'model.n_layer=2'."))
    if problems:
        raise ConfigError(problems, label)
    try:
        return typing.cast(DictConfig, OmegaConf.merge(raw, OmegaConf.from_dotlist(overrides)))
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        key = getattr(exc, "full_key", None) or "<overrides>"
        raise ConfigError(
            [ConfigProblem(str(key), f"cannot apply overrides {overrides}: {_first_line(exc)}")],
            label,
        ) from None


def _mark_overrides(problems: list[ConfigProblem], overrides: list[str]) -> list[ConfigProblem]:
    """Note on each problem the command-line override that set its key, if one did."""
    marked = []
    for problem in problems:
        source = None
        for item in overrides:
            key = item.partition("=")[0].strip()
            if problem.key == key or problem.key.startswith(key + ".") or key.startswith(
                problem.key + "."
            ):
                source = item
        if source is not None:
            problem = ConfigProblem(problem.key, f"{problem.message} (set by override {source!r})")
        marked.append(problem)
    return marked


# ---------------------------------------------------------------------------------------------
# Checking.


def _check(
    raw: Mapping[str, Any], world_size: Optional[int] = None
) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """Check every key of a plain config; return the OmegaConf-typed values and the problems.
    ``world_size`` defaults to ``$WORLD_SIZE``, else 1."""
    problems: list[ConfigProblem] = []
    hints = typing.get_type_hints(TrainConfig)
    allowed = [f.name for f in dataclasses.fields(TrainConfig)]
    typed: dict[str, Any] = {}

    for key, value in raw.items():
        if key not in hints:
            problems.append(ConfigProblem(str(key), _unknown_key_message(str(key), allowed)))
            continue
        value, problem = _normalize_field(key, value)
        if problem is not None:
            problems.append(problem)
            continue
        try:
            converted = OmegaConf.merge(_SCHEMA, {key: value})
        except OmegaConfBaseException as exc:
            path = str(getattr(exc, "full_key", None) or key)
            problems.append(ConfigProblem(
                path, f"{_show(value)} is not {_describe(hints[key])} ({_first_line(exc)})."))
            continue
        typed[key] = OmegaConf.to_container(converted, resolve=True)[key]
        problems.extend(_check_field_value(key, typed[key]))

    for f in dataclasses.fields(TrainConfig):
        if f.default is MISSING and f.name not in raw:
            problems.append(ConfigProblem(f.name, f"is required: {_REQUIRED_HINTS[f.name]}"))

    for section, spec in _SINGLE_SECTIONS.items():
        if isinstance(typed.get(section), dict):
            kwargs = {k: v for k, v in typed[section].items() if k != "name"}
            problems.extend(_check_component(
                section, typed[section].get("name"), kwargs, spec, name_path=f"{section}.name"))
    for section, reg in _MULTI_SECTIONS.items():
        for name, kwargs in (typed.get(section) or {}).items():
            path = f"{section}.{name}"
            problems.extend(_check_component(path, name, kwargs, _Section(reg), name_path=path))
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE") or 1)
    from cadence.trainer.parallel.config import tensor_parallel_degree

    # the batch splits over the data-parallel ranks (a tensor-parallel group shares one)
    tp = tensor_parallel_degree(typed.get("parallelism_config"))
    problems.extend(check_global_batch_size(typed.get("global_train_batch_size"),
                                            max(1, world_size // tp)))
    return typed, problems


_REQUIRED_HINTS = {
    "max_duration": "how long to train, a Time string such as '2ep' or '1000ba'.",
    "global_train_batch_size": "samples per optimizer step over all ranks, e.g. 16.",
    "model": "a mapping such as {name: gpt2, n_layer: 4}.",
    "train_loader": "a mapping such as {name: shakespeare, split: train}.",
}


def _normalize_field(key: str, value: Any) -> tuple[Any, Optional[ConfigProblem]]:
    """Per-field fixes and checks OmegaConf's own conversion would get wrong or word poorly."""
    if key == "precision" and not isinstance(value, Precision):
        allowed = [p.value for p in Precision]
        text = str(value).lower() if isinstance(value, str) else None
        if text in allowed:
            return Precision(text), None
        return value, ConfigProblem(key, _choice_message(value, allowed))
    if key in _MULTI_SECTIONS:
        if value is None:
            return {}, None
        if not isinstance(value, dict):
            return value, ConfigProblem(key, (
                f"expected a mapping of name -> arguments such as "
                f"{{{_EXAMPLE_NAME[key]}: {{}}}}, got {_show(value)}."))
        for name, kwargs in value.items():
            if kwargs is not None and not isinstance(kwargs, dict):
                return value, ConfigProblem(f"{key}.{name}", (
                    f"expected a mapping of constructor arguments (or {{}} / null), got "
                    f"{_show(kwargs)}."))
        return {name: dict(kwargs or {}) for name, kwargs in value.items()}, None
    if key in _SINGLE_SECTIONS and value is not None and not isinstance(value, dict):
        return value, ConfigProblem(key, (
            f"expected a mapping such as {{name: {_EXAMPLE_NAME[key]}, ...}}, got {_show(value)}."))
    return value, None


_EXAMPLE_NAME = {
    "model": "gpt2", "train_loader": "shakespeare", "eval_loader": "shakespeare",
    "optimizer": "adamw", "scheduler": "cosine_decay_with_warmup",
    "algorithms": "gradient_clipping", "callbacks": "lr_monitor", "loggers": "file",
}


def _positive_duration(value: str) -> bool:
    try:
        return Time.from_timestring(value).value > 0
    except ValueError:
        return True  # a malformed Time string is reported by the Time check below


def _format_fields(allowed: tuple[str, ...], example: str) -> Callable[[str], bool]:
    """A test that a ``str.format`` template uses only the ``allowed`` fields."""
    import string

    shown = ", ".join("{" + name + "}" for name in allowed)

    def test(template: str) -> bool:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ValueError(f"{template!r} is not a valid name template ({exc}); write fields "
                             f"as {shown}, e.g. {example!r}.") from None
        for name in fields:
            if name.split(".")[0].split("[")[0] not in allowed:
                raise ValueError(f"{template!r} has the field {{{name}}}, which is never filled "
                                 f"in; allowed fields: {shown}, e.g. {example!r}.")
        return True

    return test


def _device_available(device: str) -> bool:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("'cuda' is not available on this machine (torch.cuda.is_available() "
                             "is False); use device: cpu, or null to take CUDA where there is one.")
    return True


def _existing_checkpoint(path: str) -> bool:
    if "://" in path or Path(path).exists():
        return True
    raise ValueError(f"{path!r} does not exist; give the path of a checkpoint (a .pt file or a "
                     f"sharded checkpoint folder), or leave load_path unset.")


#: Value checks of top-level keys beyond their type (see cadence.trainer.arg_checks.Check).
_FIELD_CHECKS: dict[str, Check] = {
    "max_duration": Check(_positive_duration, "a duration > 0, e.g. '1ep' or '100ba'"),
    "save_filename": Check(_format_fields(("run_name", "epoch", "batch", "rank"),
                                          "ep{epoch}-ba{batch}"), "a name template"),
    "save_latest_filename": Check(_format_fields(("run_name",), "latest-{run_name}"),
                                  "a name template"),
    "device": Check(_device_available, "cpu, cuda or null"),
    "load_path": Check(_existing_checkpoint, "an existing checkpoint"),
    "dist_timeout": greater_than(0.0),
}


def check_global_batch_size(batch: Any, world_size: int) -> list[ConfigProblem]:
    """``global_train_batch_size`` must split evenly over ``world_size`` ranks; the problem
    (naming a multiple to use instead) or ``[]``. Values of the wrong type are left to the
    type check."""
    if not isinstance(batch, int) or batch < 1 or batch % world_size == 0:
        return []
    lower = max(world_size, batch // world_size * world_size)
    return [ConfigProblem("global_train_batch_size", (
        f"{batch} does not divide evenly over {world_size} ranks; use a multiple of "
        f"{world_size} (e.g. {lower} or {lower + world_size}), or another number of ranks."))]


def _check_field_value(key: str, value: Any) -> list[ConfigProblem]:
    """Checks on a typed top-level value beyond its type."""
    check = _FIELD_CHECKS.get(key)
    if check is not None and value is not None:
        message = check.problem(value)
        if message is not None:
            return [ConfigProblem(key, message)]
    if key in _TIME_FIELDS and value is not None:
        try:
            time = Time.from_timestring(value)
        except ValueError as exc:
            return [ConfigProblem(key, str(exc))]
        if key == "max_duration" and time.unit == TimeUnit.DURATION:
            return [ConfigProblem(key, (
                f"{value!r} is in 'dur', a fraction of max_duration itself; give it in 'ep', 'ba', "
                f"'sp' or 'tok'."))]
        return []
    if key == "seed" and not 0 <= value < 2**32:
        return [ConfigProblem(key, f"{value!r} is out of range; a seed is in [0, 2**32).")]
    if key == "device_train_microbatch_size" and value is not None and value != "auto" and (
            isinstance(value, bool) or not isinstance(value, int)):
        return [ConfigProblem(key, f"{value!r} must be a positive int, 'auto' or null.")]
    if key in ("global_train_batch_size", "device_train_microbatch_size",
               "device_eval_batch_size") and isinstance(value, int) and value < 1:
        return [ConfigProblem(key, f"{value!r} must be a positive number of samples.")]
    if key == "eval_subset_num_batches" and value < -1:
        return [ConfigProblem(key, f"{value!r} must be -1 (all batches) or >= 0.")]
    if key == "compile_config" and value is not None:
        from cadence.trainer.parallel.compile import parse_compile_config

        try:
            parse_compile_config(value, prefix=key)
        except ValueError as exc:
            return [ConfigProblem(key, str(exc))]
    if key == "save_state_dict_type" and value not in (None, "full", "sharded"):
        return [ConfigProblem(key, _choice_message(value, ["full", "sharded", "null"]))]
    if key == "device" and value is not None and value not in _DEVICES:
        return [ConfigProblem(key, _choice_message(value, [*_DEVICES, "null"]))]
    if key == "parallelism_config":
        from cadence.trainer.parallel.config import check_parallelism_config

        _, problems = check_parallelism_config(value, prefix=key)
        return [ConfigProblem(path, message) for path, message in problems]
    return []


def _check_component(
    path: str,
    name: Any,
    kwargs: Mapping[str, Any],
    section: _Section,
    name_path: str,
) -> list[ConfigProblem]:
    """Check a component's ``name`` and its arguments ``kwargs`` against its signature."""
    kind = section.registry.kind
    kwargs = dict(kwargs)
    problems = []
    for filled in section.filled:
        if filled in kwargs:
            problems.append(ConfigProblem(f"{path}.{filled}", (
                f"is set by cadence, not in the loader section; use the top-level "
                f"{_BATCH_KEY_FOR.get(path, 'global_train_batch_size')} instead (the train "
                f"loader gets global_train_batch_size / world_size per rank, the eval loader "
                f"device_eval_batch_size).")))
            kwargs.pop(filled)
    if name is None:
        registered = ", ".join(section.registry.names()) or "none registered"
        problems.append(ConfigProblem(name_path, (
            f"is required: the registered {kind} to build (one of {registered}) or a dotted "
            f"import path.")))
        return problems
    if not isinstance(name, str):
        problems.append(
            ConfigProblem(name_path, f"expected a {kind} name (a string), got {_show(name)}."))
        return problems
    try:
        target = section.registry.get(name)
    except ValueError as exc:
        problems.append(ConfigProblem(name_path, str(exc)))
        return problems
    problems.extend(_check_arguments(path, kind, name, target, kwargs, section))
    return problems


def _check_arguments(
    path: str,
    kind: str,
    name: str,
    target: Callable[..., Any],
    kwargs: Mapping[str, Any],
    section: _Section,
) -> list[ConfigProblem]:
    """Check ``kwargs`` against ``inspect.signature(target)`` and its simple annotations."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []  # no signature to check against (some builtins)
    params = list(signature.parameters.values())
    if section.skip_first_positional and params and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    ):
        params = params[1:]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = {p.name: p for p in params if p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    label = f"{kind} {name!r} ({_qualname(target)})"
    problems = []
    for filled in section.filled:
        if named.pop(filled, None) is None and not takes_any:
            problems.append(ConfigProblem(path, (
                f"{label} does not take {filled!r}, which cadence passes to every {kind}; "
                f"add a {filled} parameter to it.")))
    hints = _type_hints(target)
    for key, value in kwargs.items():
        param = named.get(key)
        if param is None:
            if not takes_any:
                problems.append(ConfigProblem(
                    f"{path}.{key}", _unknown_arg_message(key, label, list(named))))
            continue
        expected = _mismatch(hints.get(key), param.default, value)
        if expected is not None:
            problems.append(ConfigProblem(f"{path}.{key}", f"{_show(value)} {expected}"))
    for param in named.values():
        if param.default is inspect.Parameter.empty and param.name not in kwargs:
            problems.append(ConfigProblem(
                f"{path}.{param.name}", f"is required by {label} (it has no default)."))
    if not problems:  # names and types fit: now the values (see cadence.trainer.arg_checks)
        problems.extend(_check_values(path, kind, name, target, kwargs))
    return problems


def _check_values(
    path: str, kind: str, name: str, target: Callable[..., Any], kwargs: Mapping[str, Any]
) -> list[ConfigProblem]:
    """The declared value checks of ``target``, then (for cheap kinds) its constructor."""
    declared = check_arg_values(target, kwargs)
    if declared:
        return [ConfigProblem(f"{path}.{key}", message) for key, message in declared]
    rejected = probe(kind, target, kwargs)
    if rejected is None:
        return []
    return [ConfigProblem(path, f"{kind} {name!r} rejects its arguments {dict(kwargs)!r}: "
                                f"{rejected}")]


# ---------------------------------------------------------------------------------------------
# Value checks against simple annotations.

_SIMPLE_TYPES = (bool, int, float, str)


def _type_hints(target: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations of ``target``'s constructor/call; ``{}`` when they do not resolve."""
    func = target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]
    try:
        return typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - unresolvable annotations are simply not checked
        return {}


def _matches(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def _is_time_default(default: Any) -> bool:
    if not isinstance(default, str):
        return False
    try:
        Time.from_timestring(default)
    except ValueError:
        return False
    return True


def _mismatch(hint: Any, default: Any, value: Any) -> Optional[str]:
    """What ``value`` should have been, or ``None`` when it fits or ``hint`` is not simple.

    Simple hints: ``bool``, ``int``, ``float``, ``str``, ``Time``, ``Literal[...]`` of
    scalars, an ``Enum``, and ``Optional``/``Union`` of these. A ``str`` parameter whose
    default is a Time string (``t_warmup="0ba"``) takes Time strings.
    """
    if hint is None or hint is Any:
        return None
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    allow_none = type(None) in members
    # A YAML value is never a tensor: torch's ``lr: float | Tensor`` is checked as a float.
    members = tuple(m for m in members if m is not type(None) and not _is_tensor_type(m))
    if not members:
        return None
    hint = Union[members + ((type(None),) if allow_none else ())]  # type: ignore[assignment]
    if value is None:
        if allow_none or default is None:
            return None
        return f"is not allowed; expected {_describe(hint)}."
    if len(members) == 1 and typing.get_origin(members[0]) is tuple:
        return _tuple_mismatch(members[0], value)
    for member in members:
        if typing.get_origin(member) is Literal:
            continue
        if member is not Time and member not in _SIMPLE_TYPES and not (
            inspect.isclass(member) and issubclass(member, enum.Enum)
        ):
            return None  # not a simple annotation: do not guess
    is_time = Time in members or (str in members and _is_time_default(default))
    if is_time and isinstance(value, str):
        try:
            Time.from_timestring(value)
        except ValueError as exc:
            return f"is not a valid Time string: {exc}"
        return None
    for member in members:
        if typing.get_origin(member) is Literal:
            choices = typing.get_args(member)
            if value in choices:
                return None
        elif inspect.isclass(member) and issubclass(member, enum.Enum):
            choices = tuple([m.value for m in member] + [m.name for m in member])
            if isinstance(value, member) or value in choices:
                return None
        elif member is Time:
            continue
        elif _matches(member, value):
            return None
    if all(_is_choice(m) for m in members):
        choices = [str(c) for m in members for c in _choices(m)]
        return _choice_message(value, choices, prefix=False)
    return f"is not {_describe(hint)}."


def _is_tensor_type(hint: Any) -> bool:
    return getattr(hint, "__name__", None) == "Tensor" and str(
        getattr(hint, "__module__", "")).startswith("torch")


def _tuple_mismatch(hint: Any, value: Any) -> Optional[str]:
    """``tuple[X, Y]`` (exactly two items) or ``tuple[X, ...]`` (any number) against a
    YAML list: its length, then each item against its hint."""
    args = typing.get_args(hint)
    variadic = len(args) == 2 and args[1] is Ellipsis
    items = [args[0]] if variadic else list(args)
    if variadic:
        wanted = f"a list of values, each {_describe(items[0])}"
    else:
        wanted = (f"a list of exactly {len(items)} value{'s' if len(items) != 1 else ''} "
                  f"({', '.join(_describe(a) for a in items)})")
    if not isinstance(value, (list, tuple)):
        return f"is not {wanted}."
    if not variadic and len(value) != len(items):
        return f"has {len(value)} item{'s' if len(value) != 1 else ''}; expected {wanted}."
    for index, item in enumerate(value):
        problem = _mismatch(items[0] if variadic else items[index], inspect.Parameter.empty, item)
        if problem is not None:
            return f"item {index}: {_show(item)} {problem}"
    return None


def _is_choice(hint: Any) -> bool:
    return typing.get_origin(hint) is Literal or (
        inspect.isclass(hint) and issubclass(hint, enum.Enum))


def _choices(hint: Any) -> list[Any]:
    if typing.get_origin(hint) is Literal:
        return list(typing.get_args(hint))
    return [m.value for m in hint]


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) is Union or isinstance(hint, types.UnionType)


def _describe(hint: Any) -> str:
    """``Optional[int]`` -> ``'an int or null'``."""
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    names = []
    for member in members:
        if _is_tensor_type(member):
            continue  # a YAML value is never a tensor
        if member is type(None):
            names.append("null")
        elif typing.get_origin(member) is Literal:
            names.append("one of " + ", ".join(repr(a) for a in typing.get_args(member)))
        elif inspect.isclass(member) and issubclass(member, enum.Enum):
            names.append("one of " + ", ".join(str(m.value) for m in member))
        elif member is Time:
            names.append("a Time string (e.g. '100ba')")
        elif typing.get_origin(member) in (dict, Dict) or member is dict:
            names.append("a mapping")
        elif typing.get_origin(member) in (list, tuple) or member in (list, tuple):
            names.append("a list")
        else:
            name = getattr(member, "__name__", str(member))
            names.append(f"{'an' if name[:1] in 'aeiou' else 'a'} {name}")
    # null last reads better: "an int or null"
    names.sort(key=lambda n: n == "null")
    return " or ".join(names)


# ---------------------------------------------------------------------------------------------
# Messages.


def _show(value: Any) -> str:
    """A value as it would read in YAML-ish form, with its type."""
    if value is None:
        return "null"
    return f"{value!r} ({type(value).__name__})"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _unknown_key_message(key: str, allowed: Sequence[str]) -> str:
    return (f"unknown key.{_did_you_mean(key, allowed)} Allowed top-level keys: "
            f"{', '.join(allowed)}.")


def _unknown_arg_message(key: str, label: str, accepted: Sequence[str]) -> str:
    return (f"unknown argument for {label}.{_did_you_mean(key, accepted)} It takes: "
            f"{', '.join(accepted) or 'no arguments'}.")


def _choice_message(value: Any, allowed: Sequence[str], prefix: bool = True) -> str:
    hint = _did_you_mean(str(value), allowed) if isinstance(value, str) else ""
    head = f"{_show(value)} is" if prefix else "is"
    return f"{head} not one of: {', '.join(allowed)}.{hint}"


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}" if module else name


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_SCHEMA = OmegaConf.structured(TrainConfig)
