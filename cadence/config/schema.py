"""The schema of a run file and the first stage of its check, which imports no torch.

:class:`TrainConfig` is the schema: one typed field per top-level key. :func:`check_schema`
is the check's first stage (issue 15): unknown keys (with "did you mean"), field types,
enum values, Time strings, the ``parallelism_config`` keys, registry names and each
component's argument names and types. It reads what is registered from the light index
(:mod:`cadence.config.registry_index`) and from what this process has already registered
or imported, so a typo is reported without importing torch, transformers or any component
module. Components it cannot see without importing (a dotted path to user code not yet
imported) are left to the second stage, :mod:`cadence.config.values`, which
imports the components and checks the values; :func:`cadence.config.load.load_config`
runs the two in order.

``from __future__ import annotations`` is safe here: OmegaConf 2.4 resolves the dataclass
fields' string annotations with :func:`typing.get_type_hints`, so every type used in a field
annotation must be importable at module level (as they are).
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cadence.registry import registry
from cadence.config.arg_types import describe, mismatch
from cadence.parallel.compile_config import CompileConfig, check_compile_config
from cadence.registry.errors import (
    ConfigProblem, choice_message, did_you_mean, first_line, show,
)
from cadence.parallel.config import ParallelismConfig, check_parallelism_config
from cadence.core.precision import Precision
from cadence.config.registry_index import component_spec, indexed_names, lookup
from cadence.registry.targets import dotted_path_problem, is_dotted_path
from cadence.registry.section import section_problems
from cadence.trainer.trainer_config import SECTIONS

__all__ = ["TrainConfig", "RunFile", "check_schema", "argument_problems", "Section",
           "SINGLE_SECTIONS", "MULTI_SECTIONS", "TYPED_SECTIONS", "LOADER_FILLED_ARGS"]

#: Devices a run file may name; ``null`` means CUDA when available, else CPU.
_DEVICES = ("cpu", "cuda")

#: Loader arguments cadence passes itself (from the batch-size keys), so a run file must not.
LOADER_FILLED_ARGS = ("batch_size",)


#: A run file's own keys, beside the Trainer's settings: what the run is made of (the
#: components, each ``{name: <registered name or dotted path>, **kwargs}``), the batch sizes
#: the builder turns into per-rank loader batches, and free variables.
_COMPONENT_FIELDS: tuple[tuple[str, Any, Any, str], ...] = (
    ("global_train_batch_size", int, MISSING,
     "samples per optimizer step over all ranks; each data-parallel rank loads "
     "``global_train_batch_size / data-parallel size`` (must divide). Required."),
    ("model", Dict[str, Any], MISSING,
     "``{name: <registered model or dotted path>, **constructor kwargs}``. Required."),
    ("train_loader", Dict[str, Any], MISSING,
     "``{name: <registered dataset or dotted path>, **kwargs}``; the builder passes "
     "``batch_size`` itself. Required."),
    ("device_eval_batch_size", Optional[int], None,
     "eval samples per rank per batch; ``None``: the per-device train batch size."),
    ("eval_loader", Optional[Dict[str, Any]], None,
     "like ``train_loader``, built with ``device_eval_batch_size``; optional."),
    ("optimizer", Optional[Dict[str, Any]], None,
     "``{name: adamw|adam|sgd|<dotted path>, **kwargs}``, built as "
     "``cls(model.parameters(), **kwargs)``; default: the Trainer's (AdamW)."),
    ("scheduler", Optional[Dict[str, Any]], None,
     "``{name: <registered schedule or dotted path>, **kwargs}``; optional."),
    ("algorithms", Dict[str, Dict[str, Any]], dict, "``{name: {kwargs}}``, applied in this order."),
    ("callbacks", Dict[str, Dict[str, Any]], dict, "``{name: {kwargs}}``."),
    ("loggers", Dict[str, Dict[str, Any]], dict, "``{name: {kwargs}}``."),
    ("variables", Dict[str, Any], dict,
     "free-form values for interpolation (``${variables.seq_len}``); not read by the trainer "
     "(llm-foundry's convention)."),
)

#: The settings sections held whole, typed from their mapping: key -> type.
_WHOLE_SECTION_FIELDS = (("parallelism_config", ParallelismConfig),
                         ("compile_config", CompileConfig))


def _setting_specs() -> list[tuple[str, Any, Any]]:
    """``(name, run-file type, dataclasses.field)`` of every setting a run file may write,
    read from the sections of :class:`~cadence.trainer.trainer_config.TrainerConfig`."""
    specs = []
    for section in SECTIONS.values():
        hints = typing.get_type_hints(section)
        for f in section.run_file_fields():
            meta = f.metadata
            kind = meta.get("run_file_type", hints[f.name])
            if meta.get("run_file_required"):
                default = field(default=MISSING)
            elif "run_file_default" in meta:
                default = field(default=meta["run_file_default"])
            elif f.default_factory is not dataclasses.MISSING:
                default = field(default_factory=f.default_factory)
            else:
                default = field(default=f.default)
            specs.append((f.name, kind, default))
    return specs


def _train_config() -> type:
    """:class:`TrainConfig`: the run file's keys, flat, generated from the sections."""
    settings = _setting_specs()
    specs = [spec for spec in settings if spec[0] == "max_duration"]  # first: the run's length
    for name, kind, default, _ in _COMPONENT_FIELDS:
        specs.append((name, kind, field(default_factory=default) if default is dict
                      else field(default=default)))
    specs += [spec for spec in settings if spec[0] != "max_duration"]
    specs += [(name, Optional[kind], field(default=None)) for name, kind in _WHOLE_SECTION_FIELDS]
    cls = dataclasses.make_dataclass("TrainConfig", specs)
    cls.__module__ = __name__
    components = "\n".join(f"        {name}: {doc}" for name, _, _, doc in _COMPONENT_FIELDS)
    cls.__doc__ = f"""One training run, as written in a YAML run file: flat keys, Composer's names.

    What the run is made of is written here; every other key is a *setting*, a field of the
    section of :class:`~cadence.trainer.trainer_config.TrainerConfig` that owns it, where it
    is documented and checked (this class is generated from those sections, so a field added
    to a section is a run-file key at once):
    :class:`~cadence.trainer.trainer_config.RunConfig` (``run_name``, ``seed`` (default 17,
    llm-foundry's), ``max_duration`` (required), ``precision``, ``device``, ...),
    :class:`~cadence.trainer.trainer_config.EvalConfig`,
    :class:`~cadence.trainer.trainer_config.LoggingConfig`,
    :class:`~cadence.checkpoint.checkpoint_config.CheckpointConfig`,
    :class:`~cadence.trainer.preemption.PreemptionConfig`; ``parallelism_config``
    (:class:`~cadence.parallel.config.ParallelismConfig`) and ``compile_config``
    (:class:`~cadence.parallel.compile_config.CompileConfig`) are typed whole from their mappings.
    Time values are strings in :class:`~cadence.Time` syntax (``"2ep"``, ``"100ba"``).

    Args:
{components}
    """
    return cls


TrainConfig = _train_config()


#: Top-level keys written as a mapping and held typed: the first stage parses each once.
TYPED_SECTIONS = ("parallelism_config", "compile_config")


def _run_file_form() -> type:
    """:class:`TrainConfig` as a run file writes it: the :data:`TYPED_SECTIONS` as mappings.
    OmegaConf types the file's values against this form (it cannot hold the typed objects)."""
    hints = typing.get_type_hints(TrainConfig)
    specs = []
    for f in dataclasses.fields(TrainConfig):
        kind = Optional[Dict[str, Any]] if f.name in TYPED_SECTIONS else hints[f.name]
        default = (field(default_factory=f.default_factory)
                   if f.default_factory is not dataclasses.MISSING else field(default=f.default))
        specs.append((f.name, kind, default))
    form = dataclasses.make_dataclass("RunFile", specs)
    form.__module__ = __name__
    form.__doc__ = "The run file's form of :class:`TrainConfig` (typed sections as mappings)."
    return form


RunFile = _run_file_form()


# ---------------------------------------------------------------------------------------------
# Component sections: which registry, and which arguments the builder fills itself.


@dataclass(frozen=True)
class Section:
    """How a component section is built: from ``registry``; an optimizer's first positional
    argument (``params``) and a loader's ``filled`` arguments are passed by cadence."""

    registry: registry.Registry[Any]
    skip_first_positional: bool = False   # optimizers: ``params``
    filled: tuple[str, ...] = ()          # loaders: ``batch_size``


SINGLE_SECTIONS: dict[str, Section] = {
    "model": Section(registry.models),
    "train_loader": Section(registry.datasets, filled=LOADER_FILLED_ARGS),
    "eval_loader": Section(registry.datasets, filled=LOADER_FILLED_ARGS),
    "optimizer": Section(registry.optimizers, skip_first_positional=True),
    "scheduler": Section(registry.schedulers),
}
MULTI_SECTIONS: dict[str, Section] = {
    "algorithms": Section(registry.algorithms),
    "callbacks": Section(registry.callbacks),
    "loggers": Section(registry.loggers),
}
_BATCH_KEY_FOR = {
    "train_loader": "global_train_batch_size", "eval_loader": "device_eval_batch_size",
}
_REQUIRED_HINTS = {
    "max_duration": "how long to train, a Time string such as '2ep' or '1000ba'.",
    "global_train_batch_size": "samples per optimizer step over all ranks, e.g. 16.",
    "model": "a mapping such as {name: gpt2, n_layer: 4}.",
    "train_loader": "a mapping such as {name: shakespeare, split: train}.",
}
_EXAMPLE_NAME = {
    "model": "gpt2", "train_loader": "shakespeare", "eval_loader": "shakespeare",
    "optimizer": "adamw", "scheduler": "cosine_decay_with_warmup",
    "algorithms": "gradient_clipping", "callbacks": "lr_monitor", "loggers": "file",
}
_SCHEMA = OmegaConf.structured(RunFile)
_HINTS = typing.get_type_hints(RunFile)


# ---------------------------------------------------------------------------------------------
# The first stage.


def check_schema(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """Check the schema of a plain (resolved) config, importing no component.

    Args:
        raw: the config as plain Python values (overrides applied, interpolations resolved).

    Returns:
        ``(typed, problems)``: the values OmegaConf typed against :class:`RunFile`
        (``"5"`` -> ``5`` for an int field) for the keys that passed, with
        ``parallelism_config`` and ``compile_config`` parsed into their typed objects
        (``null`` stays ``None``): ``TrainConfig(**typed)`` once there are no problems. And
        every problem found (unknown keys, wrong types, bad enum values or Time strings,
        missing required keys, bad ``parallelism_config`` / ``compile_config`` keys, unknown
        component names, component arguments that the component does not take or of the
        wrong type, missing required arguments).
    """
    problems: list[ConfigProblem] = []
    hints = _HINTS
    allowed = [f.name for f in dataclasses.fields(TrainConfig)]
    typed: dict[str, Any] = {}

    for key, value in raw.items():
        if key not in hints:
            problems.append(ConfigProblem(str(key), (
                f"unknown key.{did_you_mean(str(key), allowed)} Allowed top-level keys: "
                f"{', '.join(allowed)}.")))
            continue
        if key in TYPED_SECTIONS and isinstance(value, (ParallelismConfig, CompileConfig)):
            typed[key], found = _typed_section(key, value)  # built in Python, typed already
            problems.extend(found)
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
                path, f"{show(value)} is not {describe(hints[key])} ({first_line(exc)})."))
            continue
        typed[key] = OmegaConf.to_container(converted, resolve=True)[key]
        if key in TYPED_SECTIONS:
            typed[key], found = _typed_section(key, typed[key])
            problems.extend(found)
        else:
            problems.extend(_field_schema_problems(key, typed[key]))

    problems.extend(_section_problems(typed))
    for f in dataclasses.fields(TrainConfig):
        if f.default is MISSING and f.name not in raw:
            problems.append(ConfigProblem(f.name, f"is required: {_REQUIRED_HINTS[f.name]}"))

    for section, spec in SINGLE_SECTIONS.items():
        if isinstance(typed.get(section), dict):
            kwargs = {k: v for k, v in typed[section].items() if k != "name"}
            problems.extend(_component_problems(
                section, typed[section].get("name"), kwargs, spec, name_path=f"{section}.name"))
    for section, spec in MULTI_SECTIONS.items():
        for name, kwargs in (typed.get(section) or {}).items():
            path = f"{section}.{name}"
            problems.extend(_component_problems(path, name, kwargs, spec, name_path=path))
    return typed, problems


def _normalize_field(key: str, value: Any) -> tuple[Any, Optional[ConfigProblem]]:
    """Per-field fixes and checks OmegaConf's own conversion would get wrong or word poorly."""
    if key == "precision" and not isinstance(value, Precision):
        allowed = [p.value for p in Precision]
        text = str(value).lower() if isinstance(value, str) else None
        if text in allowed:
            return Precision(text), None
        return value, ConfigProblem(key, choice_message(value, allowed))
    if key in MULTI_SECTIONS:
        if value is None:
            return {}, None
        if not isinstance(value, dict):
            return value, ConfigProblem(key, (
                f"expected a mapping of name -> arguments such as "
                f"{{{_EXAMPLE_NAME[key]}: {{}}}}, got {show(value)}."))
        for name, kwargs in value.items():
            if kwargs is not None and not isinstance(kwargs, dict):
                return value, ConfigProblem(f"{key}.{name}", (
                    f"expected a mapping of constructor arguments (or {{}} / null), got "
                    f"{show(kwargs)}."))
        return {name: dict(kwargs or {}) for name, kwargs in value.items()}, None
    if key in SINGLE_SECTIONS and value is not None and not isinstance(value, dict):
        return value, ConfigProblem(key, (
            f"expected a mapping such as {{name: {_EXAMPLE_NAME[key]}, ...}}, got {show(value)}."))
    return value, None


def _field_schema_problems(key: str, value: Any) -> list[ConfigProblem]:
    """The run file's own checks of a typed top-level value (the settings' checks are their
    sections', :func:`_section_problems`): a device a run file may name."""
    if key == "device" and value is not None and value not in _DEVICES:
        return [ConfigProblem(key, choice_message(value, [*_DEVICES, "null"]))]
    if key in ("global_train_batch_size", "device_eval_batch_size") and isinstance(
            value, int) and value < 1:
        return [ConfigProblem(key, f"{value!r} must be a positive number of samples.")]
    return []


def _section_problems(typed: Mapping[str, Any]) -> list[ConfigProblem]:
    """Every settings section's own checks (the same the Trainer's arguments go through),
    on the keys that passed their type check."""
    problems = []
    for section in SECTIONS.values():
        values = {f.name: typed[f.name] for f in dataclasses.fields(section) if f.name in typed}
        problems.extend(section_problems(section, values)[1])
    return problems


def _typed_section(key: str, value: Any) -> tuple[Any, list[ConfigProblem]]:
    """Parse a :data:`TYPED_SECTIONS` value once into its typed object (``None`` stays
    ``None``), with every problem the torch-free stage can see: a ``layer_plan`` style given
    as a dotted path and the compile ``backend`` name wait for the second stage."""
    if value is None:
        return None, []
    if key == "parallelism_config":
        config, found = check_parallelism_config(value, prefix=key, import_paths=False)
    else:
        config, found = check_compile_config(value, prefix=key, check_backend=False)
    return config, [ConfigProblem(path, message) for path, message in found]


# ---------------------------------------------------------------------------------------------
# Components: names and argument names and types.

#: A component the first stage cannot see without importing it (user code).
_DEFERRED: dict[str, Any] = {"target": "<deferred>", "params": None}


def _component_problems(
    path: str, name: Any, kwargs: Mapping[str, Any], section: Section, name_path: str
) -> list[ConfigProblem]:
    """Check a component's ``name`` and its arguments ``kwargs`` (from the index)."""
    reg = section.registry
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
        registered = ", ".join(_known_names(reg)) or "none registered"
        problems.append(ConfigProblem(name_path, (
            f"is required: the registered {reg.kind} to build (one of {registered}) or a dotted "
            f"import path.")))
        return problems
    if not isinstance(name, str):
        problems.append(
            ConfigProblem(name_path, f"expected a {reg.kind} name (a string), got {show(name)}."))
        return problems
    if reg.peek(name) is None and lookup(reg.kind, name) is None and is_dotted_path(name):
        refused = dotted_path_problem(reg.kind, name)  # os.system: refused, never imported
        if refused is not None:
            problems.append(ConfigProblem(name_path, refused))
            return problems
    spec = _visible_spec(reg, name)
    if spec is None:
        problems.append(ConfigProblem(
            name_path, registry.unknown_name_message(reg.kind, name, _known_names(reg))))
        return problems
    problems.extend(argument_problems(path, reg.kind, name, spec, kwargs, section))
    return problems


def _known_names(reg: registry.Registry[Any]) -> list[str]:
    return sorted(set(indexed_names(reg.kind)) | set(reg.names_so_far()))


def _visible_spec(reg: registry.Registry[Any], name: str) -> Optional[dict[str, Any]]:
    """The argument spec of ``name`` without importing anything: what this process has
    registered, else the index, else a dotted path into an already imported module; a
    dotted path to a module not yet imported is deferred; ``None`` for an unknown name."""
    registered = reg.peek(name)
    if registered is not None:
        return component_spec(registered)
    indexed = lookup(reg.kind, name)
    if indexed is not None:
        return indexed
    if "." not in name and ":" not in name:
        return None
    module_name, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    target = getattr(sys.modules.get(module_name), attr, None)
    return component_spec(target) if callable(target) else _DEFERRED


_NAMED_KINDS = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")


def argument_problems(
    path: str,
    kind: str,
    name: str,
    spec: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    section: Section,
) -> list[ConfigProblem]:
    """Check ``kwargs`` against a component's argument spec
    (:func:`cadence.config.registry_index.component_spec`): unknown names (with "did you
    mean"), types, missing required arguments, and that a loader takes ``batch_size``."""
    params = spec["params"]
    if params is None:
        return []  # no signature to check against (some builtins), or deferred
    if section.skip_first_positional and params and params[0]["kind"] in (
            "POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
        params = params[1:]
    takes_any = any(p["kind"] == "VAR_KEYWORD" for p in params)
    named = {p["name"]: p for p in params if p["kind"] in _NAMED_KINDS}
    label = f"{kind} {name!r} ({spec['target']})"
    problems = []
    for filled in section.filled:
        if named.pop(filled, None) is None and not takes_any:
            problems.append(ConfigProblem(path, (
                f"{label} does not take {filled!r}, which cadence passes to every {kind}; "
                f"add a {filled} parameter to it.")))
    for key, value in kwargs.items():
        param = named.get(key)
        if param is None:
            if not takes_any:
                problems.append(ConfigProblem(f"{path}.{key}", (
                    f"unknown argument for {label}.{did_you_mean(key, list(named))} It takes: "
                    f"{', '.join(named) or 'no arguments'}.")))
            continue
        expected = mismatch(param.get("type"), value)
        if expected is not None:
            problems.append(ConfigProblem(f"{path}.{key}", f"{show(value)} {expected}"))
    for param in named.values():
        if param.get("required") and param["name"] not in kwargs:
            problems.append(ConfigProblem(
                f"{path}.{param['name']}", f"is required by {label} (it has no default)."))
    return problems
