"""``TrainerConfig``: one description of a run's settings, a tree of typed sections each
owned by the code that gives it meaning.

=====================  ==========================================  ===========================
section                class (home)                                flat keys
=====================  ==========================================  ===========================
``run``                :class:`RunConfig` (here)                   ``run_name``, ``seed``,
                                                                   ``max_duration``, ...
``eval``               :class:`EvalConfig` (here)                  ``eval_interval``, ...
``logging``            :class:`LoggingConfig` (here)               ``log_interval``, ...
``checkpoint``         ``cadence.checkpoint.checkpoint_config``    ``save_*``, ``load_*``, ...
``preemption``         ``cadence.trainer.preemption``              ``preemption_*``, ``requeue``
``parallelism``        ``cadence.parallel.ParallelismConfig``      ``parallelism_config``
``compile``            ``cadence.parallel.compile.CompileConfig``  ``compile_config``
=====================  ==========================================  ===========================

Every setting has one flat key (Composer's name), one field with its docstring, and one
check. The same tree is made from a YAML run file (:mod:`cadence.config`, whose schema is
generated from these sections), from Composer's flat ``Trainer`` keyword arguments
(:meth:`TrainerConfig.from_flat`), or directly in Python. Adding an option means adding a
field (with its docstring line) to the section that owns it, plus the code that uses it: the
run file, the Trainer's signature and ``build_trainer`` follow.

Standard library (and :mod:`cadence.core.time`) only, like every section: the run-file
check builds it before ``import torch``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from cadence.checkpoint.checkpoint_config import CheckpointConfig
from cadence.parallel.compile_config import CompileConfig, parse_compile_config
from cadence.registry.errors import ConfigError, ConfigProblem, choice_message, did_you_mean
from cadence.parallel.config import ParallelismConfig, parse_parallelism_config
from cadence.registry.section import Section, time_problem
from cadence.core.precision import Precision
from cadence.core.time import Time, TimeUnit
from cadence.trainer.preemption import PreemptionConfig

__all__ = ["TrainerConfig", "RunConfig", "EvalConfig", "LoggingConfig", "DDP_SYNC_STRATEGIES",
           "FLAT_KEYS", "SECTIONS", "flat_fields", "with_settings_signature"]

#: Composer's ``ddp_sync_strategy`` values cadence runs (``forced_sync`` is refused).
DDP_SYNC_STRATEGIES = ("single_auto_sync", "multi_auto_sync")


@dataclass
class RunConfig(Section):
    """The run itself: its name, seed, device, precision, length and step.

    Attributes:
        run_name: names the run in logs and paths; default ``$CADENCE_RUN_NAME``,
            ``$COMPOSER_RUN_NAME`` or ``$RUN_NAME``, else ``run-<unix time>`` (a run file
            names it after its file).
        seed: seeds ``random``, NumPy and torch with ``seed + global rank``; in
            ``[0, 2**32)``; default: a random seed, kept in ``state.rank_zero_seed`` and
            logged (a run file's default is 17, llm-foundry's).
        device: ``"cpu"``, ``"cuda"`` (``"gpu"``, ``"cuda:1"``, a ``Device`` from Python), or
            None (CUDA when available, else CPU).
        precision: ``fp32`` (default), ``amp_bf16`` or ``amp_fp16`` (``amp_bf16`` is refused on
            a GPU without native bf16).
        precision_config: Composer's FP8 settings; must be unset (cadence has no FP8).
        deterministic_mode: deterministic kernels only. Default False.
        dist_timeout: seconds a collective may wait for the other ranks before the job fails
            (Composer's name; default 600), on every process group of the run.
        python_log_level: the ``cadence`` logger's level (``"info"``, ``"debug"`` ...).
        auto_log_hparams: log the Trainer's arguments as hyperparameters. Default False.
        max_duration: how long ``fit`` trains (``"2ep"``, ``"1000ba"``, ``"1e6tok"``; an int
            means epochs); not in ``dur`` or ``iter``. A run file requires it.
        device_train_microbatch_size: samples per forward/backward (gradients accumulate over
            microbatches to the full batch's); ``None``: the whole per-device batch;
            ``'auto'``: the whole batch, halved when it runs out of memory.
        accumulate_train_batch_on_tokens: weight each microbatch's loss by its share of the
            global batch's loss tokens, so the step is the batch's mean per-token loss
            (Composer's; default False: by samples).
        train_dataloader_label: the train dataloader's label. Default ``"train"``.
        train_subset_num_batches: batches per epoch (``-1``, default: all).
        spin_dataloaders: accepted (Composer's); no effect: a resumed run continues its
            dataloader from the checkpoint's data position instead of spinning through it.
        scale_schedule_ratio: a factor on ``max_duration`` and the schedulers (> 0).
        step_schedulers_every_batch: step schedulers per batch (default: per batch unless a
            torch ``LRScheduler`` is given, then per epoch).
        ddp_sync_strategy: DDP gradient sync over microbatches: ``single_auto_sync``
            (default: the last microbatch only) or ``multi_auto_sync`` (every microbatch).
    """

    run_name: Optional[str] = None
    seed: Optional[int] = field(default=None, metadata={"run_file_default": 17})
    device: Optional[str] = field(default=None, metadata={"python_type": Any})
    precision: str = field(default="fp32", metadata={"run_file_type": Precision,
                                                     "run_file_default": Precision.FP32})
    precision_config: Optional[Dict[str, Any]] = field(default=None,
                                                       metadata={"run_file": False})
    deterministic_mode: bool = False
    dist_timeout: float = 600.0
    python_log_level: Optional[str] = None
    auto_log_hparams: bool = field(default=False, metadata={"run_file": False})
    max_duration: Optional[str] = field(default=None, metadata={"python_type": Any,
                                                                "run_file_required": True})
    device_train_microbatch_size: Optional[Any] = None
    accumulate_train_batch_on_tokens: bool = False
    train_dataloader_label: str = field(default="train", metadata={"run_file": False})
    train_subset_num_batches: int = -1
    spin_dataloaders: bool = field(default=True, metadata={"run_file": False})
    scale_schedule_ratio: float = 1.0
    step_schedulers_every_batch: Optional[bool] = None
    ddp_sync_strategy: Optional[str] = None

    def normalize(self) -> None:
        self.precision = str(getattr(self.precision, "value", self.precision))
        if isinstance(self.precision, str) and self.precision.lower() in [p.value for p in
                                                                          Precision]:
            self.precision = self.precision.lower()

    def problems(self) -> list[ConfigProblem]:
        found = []
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed < 2**32):
            found.append(ConfigProblem("seed", (
                f"{seed!r} is out of range; a seed is in [0, 2**32).")))
        if self.precision not in [p.value for p in Precision]:
            found.append(ConfigProblem("precision", choice_message(
                self.precision, [p.value for p in Precision])))
        if self.precision_config:
            found.append(ConfigProblem("precision_config", (
                f"{dict(self.precision_config)!r} configures FP8 (TransformerEngine), which "
                f"cadence does not support; leave it unset and use precision='amp_bf16'.")))
        if self.ddp_sync_strategy is not None and self.ddp_sync_strategy not in \
                DDP_SYNC_STRATEGIES:
            found.append(ConfigProblem("ddp_sync_strategy", (
                f"ddp_sync_strategy={self.ddp_sync_strategy!r} is not one of "
                f"{list(DDP_SYNC_STRATEGIES)} (Composer's 'forced_sync' all-reduces by hand "
                f"after the last microbatch; cadence lets DDP overlap it with backward "
                f"instead: use 'single_auto_sync').")))
        level = self.python_log_level
        if level is not None and not isinstance(logging.getLevelName(str(level).upper()), int):
            found.append(ConfigProblem("python_log_level", (
                f"python_log_level={level!r} is not a logging level (debug, info, warning, "
                f"error, critical).")))
        if isinstance(self.dist_timeout, bool) or not isinstance(
                self.dist_timeout, (int, float)) or not self.dist_timeout > 0:
            found.append(ConfigProblem("dist_timeout", (
                f"{self.dist_timeout!r} is out of range; use a number > 0 (seconds; default "
                f"600).")))
        found.extend(self._duration_problems())
        size = self.device_train_microbatch_size
        if size is not None and size != "auto" and (
                isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            found.append(ConfigProblem("device_train_microbatch_size", (
                f"{size!r} must be a positive int, 'auto' or null.")))
        subset = self.train_subset_num_batches
        if subset != -1 and (isinstance(subset, bool) or not isinstance(subset, int)
                             or subset < 1):
            found.append(ConfigProblem("train_subset_num_batches", (
                f"train_subset_num_batches must be -1 (all) or a positive int, got "
                f"{subset!r}.")))
        ratio = self.scale_schedule_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            found.append(ConfigProblem("scale_schedule_ratio",
                                       f"scale_schedule_ratio must be > 0, got {ratio}."))
        return found

    def _duration_problems(self) -> list[ConfigProblem]:
        if self.max_duration is None:
            return []
        problem = time_problem("max_duration", self.max_duration, TimeUnit.EPOCH)
        if problem is not None:
            return [problem]
        duration = Time.from_input(self.max_duration, TimeUnit.EPOCH)
        if duration.unit in (TimeUnit.DURATION, TimeUnit.ITERATION):
            return [ConfigProblem("max_duration", (
                f"{self.max_duration!r} is in '{duration.unit.value}'"
                + (", a fraction of max_duration itself" if duration.unit == TimeUnit.DURATION
                   else "") + "; give it in 'ep', 'ba', 'sp', 'tok' or 'sec'."))]
        return []


@dataclass
class EvalConfig(Section):
    """When the model is evaluated during ``fit``.

    Attributes:
        eval_interval: how often to evaluate (``"1ep"``, ``"500ba"``, ``"0.25dur"``; an int
            means epochs; ``0``: never), or a callable ``(state, event) -> bool``; the model is
            also evaluated when training ends. Default ``"1ep"``.
        eval_subset_num_batches: eval batches per evaluation; ``-1`` (default) for all; ``0``
            is refused (it would evaluate nothing: NaN metrics).
    """

    eval_interval: str = field(default="1ep", metadata={"python_type": Any})
    eval_subset_num_batches: int = -1

    def problems(self) -> list[ConfigProblem]:
        found = []
        problem = time_problem("eval_interval", self.eval_interval, TimeUnit.EPOCH,
                                allow_callable=True)
        if problem is not None:
            found.append(problem)
        subset = self.eval_subset_num_batches
        if subset is not None and subset != -1 and not (isinstance(subset, int) and subset >= 1):
            found.append(ConfigProblem("eval_subset_num_batches", (
                f"{subset!r} would evaluate "
                f"{'no batches (NaN metrics)' if subset == 0 else 'nothing'}; use -1 (all "
                f"batches) or a positive number of batches (leave the eval dataloader out to "
                f"skip evaluation).")))
        return found


@dataclass
class LoggingConfig(Section):
    """What the run reports, and how often.

    Attributes:
        log_interval: how often the training loss is logged, in its unit (``"10ba"``, the
            default; ``"1ep"`` at epoch ends; ``"0.25dur"`` as fractions of ``max_duration``;
            ``"1000sp"`` / ``"1e6tok"`` when the count crosses a multiple; an int means
            batches), on the first batch, at the end of training, and at a console logger's
            ``console_log_interval``. The loss stays on the device between logs.
        progress_bar: add a progress destination (a tqdm bar on a terminal, plain lines in
            logs) unless the loggers already have one. Default True.
        log_to_console: add a plain console logger (Composer's). Default False.
        console_stream: where it writes: ``'stdout'``, ``'stderr'`` (default) or a stream.
        console_log_interval: the console logger's interval (default ``log_interval``).
        log_traces: print algorithm traces to the console. Default False.
    """

    log_interval: str = field(default="10ba", metadata={"python_type": Any})
    progress_bar: bool = True
    log_to_console: bool = False
    console_stream: Any = field(default="stderr", metadata={"run_file": False})
    console_log_interval: Optional[str] = field(default=None, metadata={"python_type": Any})
    log_traces: bool = False

    def problems(self) -> list[ConfigProblem]:
        found = []
        for key in ("log_interval", "console_log_interval"):
            problem = time_problem(key, getattr(self, key), TimeUnit.BATCH)
            if problem is not None:
                found.append(problem)
        return found


#: ``TrainerConfig`` field -> the flat key of a section held whole (typed from a mapping).
_WHOLE_SECTIONS = {"parallelism": "parallelism_config", "compile": "compile_config"}


@dataclass
class TrainerConfig:
    """A run's settings, by owner. See the module docstring for the sections and their keys.

    Attributes:
        run / eval / logging / checkpoint / preemption: the sections of flat keys.
        parallelism: the typed ``parallelism_config`` (FSDP2 and tensor parallelism).
        compile: the typed ``compile_config``, or None (no ``torch.compile``).
    """

    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    compile: Optional[CompileConfig] = None

    @classmethod
    def from_flat(cls, values: Mapping[str, Any], source: str = "Trainer") -> TrainerConfig:
        """The tree of Composer's flat keys (``save_folder=...``, ``eval_interval=...``);
        keys left out take their defaults.

        Raises:
            ConfigError: every problem in every section at once, each naming its key; an
                unknown key is named with a "did you mean".
        """
        routed: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        problems: list[ConfigProblem] = []
        for key, value in values.items():
            owner = FLAT_KEYS.get(key)
            if owner in _WHOLE_SECTIONS:
                continue  # typed below, whole
            if owner is None:
                problems.append(ConfigProblem(key, (
                    f"is not a setting.{did_you_mean(key, list(FLAT_KEYS))} Settings: "
                    f"{', '.join(FLAT_KEYS)}.")))
            else:
                routed[owner][key] = value
        built: dict[str, Any] = {}
        for name, section in SECTIONS.items():
            try:
                built[name] = section(**routed[name])
            except ConfigError as exc:
                problems.extend(exc.problems)
        for name, key in _WHOLE_SECTIONS.items():
            if key in values:
                try:
                    built[name] = (parse_parallelism_config(values[key]) if name == "parallelism"
                                   else parse_compile_config(values[key], prefix=key))
                except ConfigError as exc:
                    problems.extend(exc.problems)
                except ValueError as exc:
                    problems.append(ConfigProblem(key, str(exc)))
        if problems:
            raise ConfigError(problems, source)
        if built.get("parallelism") is None:
            built.pop("parallelism", None)
        return cls(**built)

    def to_flat(self) -> dict[str, Any]:
        """Every setting by its flat key (the inverse of :meth:`from_flat`)."""
        flat: dict[str, Any] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            flat.update({f.name: getattr(section, f.name) for f in dataclasses.fields(section)})
        for name, key in _WHOLE_SECTIONS.items():
            flat[key] = getattr(self, name)
        return flat


#: The sections of flat keys, by ``TrainerConfig`` field.
SECTIONS: dict[str, type] = {"run": RunConfig, "eval": EvalConfig, "logging": LoggingConfig,
                             "checkpoint": CheckpointConfig, "preemption": PreemptionConfig}

#: Every flat key -> the ``TrainerConfig`` field that owns it.
FLAT_KEYS: dict[str, str] = {
    **{f.name: name for name, section in SECTIONS.items() for f in dataclasses.fields(section)},
    **{key: name for name, key in _WHOLE_SECTIONS.items()},
}


def flat_fields() -> dict[str, dataclasses.Field]:
    """Every flat key's field in its section (the whole sections' keys left out)."""
    return {f.name: f for section in SECTIONS.values() for f in dataclasses.fields(section)}


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def with_settings_signature(init: Any) -> Any:
    """``init`` (a ``__init__`` ending in ``**settings``) with a signature that lists every
    setting it does not name explicitly as a keyword-only parameter with its default, so
    ``inspect.signature(Trainer)`` and editors show every option a section defines."""
    import inspect

    signature = inspect.signature(init)
    params = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    named = {p.name for p in params}
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_default(f))
               for name, f in flat_fields().items() if name not in named]
    init.__signature__ = signature.replace(parameters=params)
    return init


def _check_unique() -> None:
    names = [f.name for section in SECTIONS.values() for f in dataclasses.fields(section)]
    duplicated = {n for n in names if names.count(n) > 1}
    assert not duplicated, f"a flat key belongs to two sections: {sorted(duplicated)}"


_check_unique()
