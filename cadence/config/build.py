"""Build a :class:`~cadence.Trainer` from a checked :class:`~cadence.config.load.TrainConfig`.

The order follows llm-foundry's ``train.py``: seed, model, dataloaders, optimizer, schedule,
algorithms, callbacks, loggers, then the Trainer. Every component comes from its registry
(:mod:`cadence.registry.registry`) by name or dotted import path::

    model      = models.get(name)(**kwargs)
    loader     = datasets.get(name)(batch_size=<per-device batch>, **kwargs)
    optimizer  = optimizers.get(name)(<trainable parameters>, **kwargs)
    scheduler  = schedulers.get(name)(**kwargs)
    callbacks  = [callbacks.get(name)(**kwargs) for name, kwargs in section.items()]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from cadence.registry import registry
from cadence.config.load import (
    ConfigError, ConfigProblem, Precision, TrainConfig, check_global_batch_size, config_to_dict,
    is_checked, validate_config,
)
from cadence.parallel.config import ParallelismConfig
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.trainer.trainer import Trainer

__all__ = ["build_trainer", "per_device_batch_size"]


def per_device_batch_size(global_batch_size: int, world_size: int) -> int:
    """Samples each rank loads per optimizer step: ``global_batch_size / world_size``.

    Raises:
        ConfigError: ``global_batch_size`` is not a multiple of ``world_size``.
    """
    problems = check_global_batch_size(global_batch_size, world_size)
    if problems:
        raise ConfigError(problems)
    return global_batch_size // world_size


def build_trainer(cfg: TrainConfig) -> Trainer:
    """Build every component named in ``cfg`` and the :class:`~cadence.Trainer` that runs them.

    ``random``, NumPy and torch are seeded with ``cfg.seed`` (the same on every rank) before
    the model is built, so its initial weights are reproducible and identical across ranks;
    the Trainer then seeds each rank with ``seed + rank`` for the run itself.

    Args:
        cfg: the run config: from :func:`~cadence.config.load.load_config` (checked and
            typed there, so not checked again), or built in Python (checked here first, by
            :func:`~cadence.config.load.validate_config`).

    Returns:
        The Trainer, ready for ``fit()``; ``hyperparameters`` holds the config as a plain dict.

    Raises:
        ConfigError: a config built in Python has problems (every check of
            :func:`~cadence.config.load.load_config`: nothing is built when one fails), the
            global batch does not divide over the data-parallel ranks, or a component's
            constructor rejected its arguments with a ``ValueError`` (the message names the
            section; the original is chained). Errors of the Trainer itself (a checkpoint
            that does not load, a save folder in use) are not config problems and propagate
            unchanged.
    """
    if not is_checked(cfg):
        cfg = validate_config(cfg)
    from cadence.trainer.trainer import Trainer  # lazy: keep config loading light
    from cadence.trainer.trainer_config import FLAT_KEYS
    from cadence.utils.reproducibility import seed_all

    from cadence.parallel.parallel_dims import ParallelDims

    # typed once, where the run file entered (load_config); the Trainer and the plan take it
    parallelism = cfg.parallelism_config or ParallelismConfig()
    # the ranks of one tensor-parallel group load the same samples
    train_batch = per_device_batch_size(cfg.global_train_batch_size,
                                        ParallelDims.from_config(parallelism).dp_size)
    eval_batch = cfg.device_eval_batch_size or train_batch
    seed_all(cfg.seed)

    model = _build_model(cfg, parallelism)
    train_dataloader = _build("train_loader", registry.datasets, cfg.train_loader,
                              batch_size=train_batch)
    eval_dataloader = None
    if cfg.eval_loader is not None:
        eval_dataloader = _build("eval_loader", registry.datasets, cfg.eval_loader,
                                 batch_size=eval_batch)
    optimizer = None
    if cfg.optimizer is not None:
        from cadence.optim.optimizers import trainable_parameters

        optimizer = _build("optimizer", registry.optimizers, cfg.optimizer,
                           positional=(trainable_parameters(model),))
    scheduler = None
    if cfg.scheduler is not None:
        scheduler = _build("scheduler", registry.schedulers, cfg.scheduler)
    algorithms = _build_all("algorithms", registry.algorithms, cfg.algorithms)
    callbacks = _build_all("callbacks", registry.callbacks, cfg.callbacks)
    loggers = _build_all("loggers", registry.loggers, cfg.loggers)

    _share_tokenizer(model, train_dataloader)
    # every setting goes over as it is: the Trainer types it into the same TrainerConfig
    settings = {key: getattr(cfg, key) for key in FLAT_KEYS if hasattr(cfg, key)}
    settings["parallelism_config"] = parallelism
    settings["precision"] = Precision(cfg.precision).value  # the run file types it an enum
    return Trainer(model=model, train_dataloader=train_dataloader,
                   eval_dataloader=eval_dataloader, optimizers=optimizer, schedulers=scheduler,
                   algorithms=algorithms, callbacks=callbacks, loggers=loggers,
                   hyperparameters=config_to_dict(cfg), **settings)


def _share_tokenizer(model: Any, train_dataloader: Any) -> None:
    """Give a model without a tokenizer (``gpt2`` trained from scratch) the tokenizer of its
    training data (the text datasets keep theirs as ``dataset.tokenizer``), so checkpoints
    carry it and ``cadence convert --to hf`` writes it next to the weights."""
    if not hasattr(model, "tokenizer") or model.tokenizer is not None:
        return
    tokenizer = getattr(getattr(train_dataloader, "dataset", None), "tokenizer", None)
    if tokenizer is not None:
        model.tokenizer = tokenizer


def _build_model(cfg: TrainConfig, parallelism: ParallelismConfig) -> Any:
    """The model; on the meta device on ranks other than 0 when FSDP's
    ``cpu_ram_efficient_loading`` is set (rank 0 reads the weights and broadcasts them after
    sharding). A builder that takes ``init_device`` is given ``init_device="meta"``; any
    other is called under ``torch.device("meta")``.

    When fsdp or tp shards the model, a builder that streams pretrained weights per shard
    (``streams_pretrained_weights``: ``hf_pretrained``) and whose ``init_device`` the run
    file leaves unset gets ``init_device="meta"`` on every rank: each rank reads only its
    shards' slices after sharding (a run file that sets ``init_device: null`` loads the whole
    model on every rank instead). With ``cpu_ram_efficient_loading`` that holds too when the
    weights are safetensors (they can be sliced; the switch is there to spare host memory);
    ``.bin`` weights stay rank 0's, broadcast."""
    fsdp = parallelism.fsdp
    rank0_loading = fsdp is not None and fsdp.cpu_ram_efficient_loading
    if ((fsdp is not None or parallelism.tp_degree > 1) and "init_device" not in cfg.model
            and getattr(registry.models.get(cfg.model["name"]), "streams_pretrained_weights",
                        False)
            and (not rank0_loading or _sliceable(cfg.model.get("pretrained_model_name_or_path")))):
        return _build("model", registry.models, cfg.model, init_device="meta")
    if fsdp is None or not fsdp.cpu_ram_efficient_loading or dist.get_global_rank() == 0:
        return _build("model", registry.models, cfg.model)
    import inspect

    import torch

    builder = registry.models.get(cfg.model["name"])
    if "init_device" in inspect.signature(builder).parameters:
        return _build("model", registry.models, cfg.model, init_device="meta")
    with torch.device("meta"):
        return _build("model", registry.models, cfg.model)


def _sliceable(path: Any) -> bool:
    """Whether ``path`` is a local ``save_pretrained`` folder of safetensors, which every
    rank can read its own slices of (so ``cpu_ram_efficient_loading``, whose purpose is to
    spare host memory, streams them instead of rank 0 reading the whole model)."""
    if path is None:
        return False
    from cadence.parallel.hf_weights import find_checkpoint_files
    from cadence.utils.packages import resolve_package_path

    try:
        return find_checkpoint_files(resolve_package_path(path)).format == "safetensors"
    except (OSError, ValueError):  # a hub name, a missing folder: loaded as before
        return False


def _build(
    section: str,
    reg: registry.Registry[Callable[..., Any]],
    spec: Mapping[str, Any],
    positional: tuple[Any, ...] = (),
    **filled: Any,
) -> Any:
    """``reg.get(spec["name"])(*positional, **filled, **rest_of_spec)``."""
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    return _construct(section, reg, spec["name"], positional, {**filled, **kwargs})


def _build_all(
    section: str,
    reg: registry.Registry[Callable[..., Any]],
    specs: Mapping[str, Mapping[str, Any]],
) -> list[Any]:
    """One component per ``name: {kwargs}`` entry, in order."""
    return [_construct(f"{section}.{name}", reg, name, (), dict(kwargs or {}))
            for name, kwargs in specs.items()]


def _construct(
    path: str,
    reg: registry.Registry[Callable[..., Any]],
    name: str,
    positional: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    target = reg.get(name)
    try:
        return target(*positional, **kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError([ConfigProblem(path, (
            f"{reg.kind} {name!r} rejected its arguments {_short(kwargs)}: {exc}"))]) from exc


def _short(kwargs: Mapping[str, Any], limit: int = 200) -> str:
    text = repr(dict(kwargs))
    return text if len(text) <= limit else text[: limit - 3] + "..."
