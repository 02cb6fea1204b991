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
(``${variables.seq_len}``) and turned into a :class:`TrainConfig` at once: the sections
written as mappings that have a typed form (``parallelism_config``, ``compile_config``) are
parsed once, here, into a :class:`~cadence.parallel.config.ParallelismConfig` and a
:class:`~cadence.parallel.compile_config.CompileConfig`, which the builder, the Trainer and the
parallelize plan take as they are. Every problem is
collected and reported together in one :class:`ConfigError` (the approach of torchtune's
``torchtune/config/_validate.py``), each naming the full key path, the bad value and the
allowed values or the closest match. Component sections (``model``, ``train_loader``,
``optimizer``, ``algorithms``...) name a registry entry or a dotted import path
(see :mod:`cadence.registry.registry`); their arguments are checked against the
component's signature before anything is built.

The check runs in two stages (issue 15). The schema (:mod:`cadence.config.schema`:
keys, types, enum values, Time strings, registry names, component argument names and
types, read from the light index :mod:`cadence.config.registry_index`) is checked first,
without importing torch, transformers or any component module, and its problems are raised
at once. Only when it passes are the components imported and the values checked
(:mod:`cadence.config.values`), still before anything is built.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Union

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cadence.parallel.compile_config import CompileConfig
from cadence.registry.errors import ConfigError, ConfigProblem, first_line, show
from cadence.parallel.config import ParallelismConfig
from cadence.config.schema import (
    LOADER_FILLED_ARGS, TYPED_SECTIONS, RunFile, TrainConfig, check_schema,
)
from cadence.config.values import check_global_batch_size, check_values
from cadence.core.precision import Precision

__all__ = [
    "TrainConfig", "Precision", "ConfigError", "ConfigProblem", "load_config",
    "validate_config", "is_checked", "config_to_dict", "LOADER_FILLED_ARGS",
    "check_global_batch_size", "MAX_RUN_FILE_BYTES", "MAX_YAML_NODES",
]

#: The largest run file :func:`load_config` reads (a real run file is a few kB; a big
#: sweep's, with every variable inline, well under 1 MiB).
MAX_RUN_FILE_BYTES = 8 * 2**20
#: The most YAML nodes (keys and values, aliases expanded) a run file may hold: far above an
#: honest run file (12,000 plain keys are about 24,000 nodes), far below an alias bomb.
MAX_YAML_NODES = 500_000

#: Set on a :class:`TrainConfig` that :func:`load_config` or :func:`validate_config` made.
_CHECKED_MARK = "_cadence_checked"


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
        The typed config, checked: ``parallelism_config`` is a
        :class:`~cadence.parallel.config.ParallelismConfig` and ``compile_config`` a
        :class:`~cadence.parallel.compile_config.CompileConfig` (each ``None`` when not set), and
        :func:`~cadence.config.build.build_trainer` does not check it again. ``run_name``
        defaults to ``<file stem>-<YYYYmmdd-HHMMSS>`` when ``source`` is a file (with
        ``autoresume: true``, to the stable ``<file stem>``), and stays ``None`` for a
        mapping.

    Raises:
        ConfigError: listing every problem found. First the schema (unknown keys with the
            closest allowed key, wrong types, bad enum values, bad Time strings, unknown
            component names, component arguments that the component's signature does not
            take, missing required keys): when it has problems they are raised at once,
            before torch or any component is imported. Then the values (argument values a
            component declares out of range or its constructor rejects, see
            :mod:`cadence.registry.arg_checks`; a ``load_path`` that does not exist; a global
            batch size that does not divide over ``world_size``). Nothing is built before
            this check.
    """
    label = str(source) if isinstance(source, (str, Path)) else "<dict>"
    raw = _load_raw(source, label)
    raw = _apply_overrides(raw, list(overrides), label)
    try:
        plain = OmegaConf.to_container(raw, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "<root>"
        raise ConfigError(
            [ConfigProblem(str(key), f"cannot resolve interpolation: {first_line(exc)}")], label
        ) from None
    if not isinstance(plain, dict):
        raise ConfigError(
            [ConfigProblem("<root>", f"a run config is a mapping of keys, got {show(plain)}.")],
            label,
        )
    typed, problems = _check(plain, world_size)
    if problems:
        raise ConfigError(_mark_overrides(problems, list(overrides)), label)
    cfg = _checked_config(typed)
    if cfg.run_name is None and isinstance(source, (str, Path)):
        stem = Path(source).stem  # autoresume: the same name on every launch of this file
        cfg.run_name = stem if cfg.autoresume else (
            f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    return cfg


def validate_config(cfg: TrainConfig) -> TrainConfig:
    """Check a :class:`TrainConfig` built in Python (``load_config`` already does this).

    Args:
        cfg: the config; ``parallelism_config`` and ``compile_config`` may be written as
            mappings (as in a run file) or as their typed objects.

    Returns:
        The checked config, typed as :func:`load_config` returns it (a new object; ``cfg``
        is left as it is).

    Raises:
        ConfigError: listing every problem found, as :func:`load_config` does.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"Expected a TrainConfig, got {type(cfg).__name__}; use load_config().")
    raw = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    raw = {k: v for k, v in raw.items() if not (isinstance(v, str) and v == MISSING)}
    typed, problems = _check(raw)
    if problems:
        raise ConfigError(problems, f"TrainConfig(run_name={cfg.run_name!r})")
    return _checked_config(typed)


def is_checked(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` came from :func:`load_config` or :func:`validate_config` and still
    holds its typed sections (so :func:`~cadence.config.build.build_trainer` need not
    check it again). A copy made with :func:`dataclasses.replace` counts as unchecked."""
    return (bool(getattr(cfg, _CHECKED_MARK, False))
            and isinstance(cfg.parallelism_config, (ParallelismConfig, type(None)))
            and isinstance(cfg.compile_config, (CompileConfig, type(None))))


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain, YAML/JSON-serialisable Python values (enums as their values).

    Used as the run's ``hyperparameters``. ``parallelism_config`` and ``compile_config``
    read as a run file would write them: the settings that differ from the defaults
    (:meth:`ParallelismConfig.to_dict <cadence.parallel.config.ParallelismConfig.to_dict>`,
    :meth:`CompileConfig.to_dict <cadence.parallel.compile_config.CompileConfig.to_dict>`).
    """
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    sections = {key: values.pop(key) for key in TYPED_SECTIONS}
    container = OmegaConf.to_container(OmegaConf.structured(RunFile(**values)), resolve=True)
    assert isinstance(container, dict)
    for key, section in sections.items():
        container[key] = (section.to_dict()
                          if isinstance(section, (ParallelismConfig, CompileConfig)) else section)
    ordered = {f.name: container[f.name] for f in dataclasses.fields(cfg)}
    return typing.cast(Dict[str, Any], _plain(ordered))


def _checked_config(typed: Mapping[str, Any]) -> TrainConfig:
    """The :class:`TrainConfig` of values that passed both stages, marked as checked."""
    cfg = TrainConfig(**typed)
    setattr(cfg, _CHECKED_MARK, True)
    return cfg


# ---------------------------------------------------------------------------------------------
# Loading and overrides.


def _load_raw(source: Union[str, Path, Mapping[str, Any], DictConfig], label: str) -> DictConfig:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ConfigError([ConfigProblem("<root>", f"run file {str(path)!r} does not exist.")],
                              label)
        size = path.stat().st_size
        if size > MAX_RUN_FILE_BYTES:
            raise ConfigError([ConfigProblem("<root>", (
                f"run file {str(path)!r} is {size / 2**20:.1f} MiB; a run file may be at most "
                f"{MAX_RUN_FILE_BYTES // 2**20} MiB (cadence.config.load.MAX_RUN_FILE_BYTES). "
                f"Keep data out of it: point at files (a dataset path, a tokenizer) instead."))],
                label)
        try:
            loaded = OmegaConf.load(path, max_yaml_expanded_nodes=MAX_YAML_NODES)
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            text = str(exc)
            if "node expansion exceeds" in text:
                text = (f"it has more than {MAX_YAML_NODES:,} YAML nodes (keys and values, "
                        f"aliases expanded), the most a run file may have "
                        f"(cadence.config.load.MAX_YAML_NODES)")
            problem = ConfigProblem("<root>", f"cannot parse YAML: {text}")
            raise ConfigError([problem], label) from None
    elif isinstance(source, DictConfig):
        loaded = source
    elif isinstance(source, Mapping):
        try:
            loaded = OmegaConf.create(dict(source))
        except OmegaConfBaseException as exc:
            raise ConfigError([ConfigProblem("<root>", first_line(exc))], label) from None
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
    for item in overrides:  # each value alone, so that a bad one is named
        try:
            OmegaConf.from_dotlist([item])
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            key, _, value = item.partition("=")
            problems.append(ConfigProblem(key.strip(), (
                f"the value of override {item!r} is not valid YAML ({first_line(exc)}); quote "
                f"it to give it as a string: {key.strip()}='{value}' (in a shell, wrap the "
                f"whole override in double quotes: \"{key.strip()}='{value}'\").")))
    if problems:
        raise ConfigError(problems, label)
    try:
        return typing.cast(DictConfig, OmegaConf.merge(raw, OmegaConf.from_dotlist(overrides)))
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        key = getattr(exc, "full_key", None) or "<overrides>"
        raise ConfigError(
            [ConfigProblem(str(key), f"cannot apply overrides {overrides}: {first_line(exc)}")],
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
    """Both stages: the schema (no heavy import), then, only when it passed, the values.
    ``world_size`` defaults to ``$WORLD_SIZE``, else 1."""
    typed, problems = check_schema(raw)
    if problems:
        return typed, problems
    return typed, check_values(typed, world_size)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
