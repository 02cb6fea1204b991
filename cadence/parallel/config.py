"""``parallelism_config``: what a run file's ``parallelism_config: {fsdp: {...}, tp: {...}}``
means.

cadence shards with FSDP2 (``torch.distributed.fsdp.fully_shard`` on a ``DeviceMesh``).
Keys are Composer's, and Accelerate's (``fsdp_``-prefixed) are accepted too. Every key is
either mapped to what it meant under FSDP1 or refused with the reason and what to use
instead; none is silently ignored.

``sharding_strategy`` -> mesh and ``reshard_after_forward``:

============================  ===============================  =========================
strategy                      mesh (dims)                      reshard_after_forward
============================  ===============================  =========================
``FULL_SHARD`` (ZeRO-3)       1-D ``(dp_shard,)``              True
``SHARD_GRAD_OP`` (ZeRO-2)    1-D ``(dp_shard,)``              False
``NO_SHARD`` (DDP-like)       2-D ``(dp_replicate=N, 1)``      False (replicated)
``HYBRID_SHARD``              2-D ``(dp_replicate, dp_shard)`` True
``HYBRID_SHARD_ZERO2``        2-D ``(dp_replicate, dp_shard)`` False
============================  ===============================  =========================

``mixed_precision`` -> ``MixedPrecisionPolicy`` (``low`` is the Trainer's autocast dtype:
bf16 for ``amp_bf16``, fp16 for ``amp_fp16``, none for ``fp32``):

- ``FULL``: parameters and gradient reduction in fp32.
- ``DEFAULT``: parameters all-gathered and computed in ``low``; gradients reduced in fp32
  (safer than FSDP1/Composer's DEFAULT, which reduced in low precision).
- ``PURE``: parameters and reduction in ``low``.
- a dict of ``param_dtype`` / ``reduce_dtype`` / ``output_dtype`` (``fp32``, ``bf16``,
  ``fp16``) and ``cast_forward_inputs`` (bool).

``tp`` -> :class:`TPConfig` (``tensor_parallel_degree``, ``layer_plan``, ``verbose``):
tensor parallelism on the mesh's innermost ``tp`` dimension, applied before FSDP2 (see
:mod:`cadence.parallel.tp`); ``device_mesh`` and pipeline keys are refused.

``ep`` -> :class:`EPConfig` (``expert_parallel_degree``): each mixture-of-experts block's
experts split over ``ep`` ranks taken from the fsdp shard ranks, tokens sent to their
experts with all-to-all (see :mod:`cadence.parallel.expert_parallel`).
``pp`` -> :class:`~cadence.parallel.pipeline_config.PPConfig` (``pipeline_parallel_degree``,
``schedule``, ``microbatch_size`` / ``num_microbatches``, ``split_points``,
``stages_per_rank``): pipeline parallelism on the mesh's outermost ``pp`` dimension (see
:mod:`cadence.parallel.pipeline`).

Sources: PyTorch FSDP2 docs (``torch.distributed.fsdp.fully_shard``), Composer's
``FSDPConfig`` and ``TPConfig`` (``composer/utils/parallelism.py``), Accelerate's
``FullyShardedDataParallelPlugin``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Union

from cadence.parallel.pipeline_config import PPConfig, pp_values
from cadence.parallel.tp_styles import tp_style_problem
from cadence.registry.errors import ConfigError, ConfigProblem, did_you_mean

__all__ = [
    "FSDPConfig", "TPConfig", "EPConfig", "PPConfig", "ParallelismConfig", "ShardingStrategy",
    "parse_parallelism_config",
    "check_parallelism_config", "layer_plan_problems",
    "SHARDING_STRATEGIES", "SYNC_GRADIENTS", "REFUSED_KEYS",
]

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                       "HYBRID_SHARD_ZERO2")
ShardingStrategy = str
_STRATEGY_ALIASES = {"_HYBRID_SHARD_ZERO2": "HYBRID_SHARD_ZERO2"}
_MIXED_PRECISION_NAMES = ("DEFAULT", "PURE", "FULL")
_DTYPE_NAMES = ("fp32", "bf16", "fp16")
_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "float": "fp32"}
_PREFETCH = ("BACKWARD_PRE",)
SYNC_GRADIENTS = ("every_microbatch", "last_microbatch")
"""``fsdp.sync_gradients`` values: when FSDP2 reduces gradients during accumulation."""

# Keys with another spelling elsewhere (Accelerate, older Composer) -> our field.
_ALIASES = {
    "offload_params": "cpu_offload",
    "transformer_layer_cls_to_wrap": "transformer_layer_cls",
    "load_monolith_rank0_only": "cpu_ram_efficient_loading",
}

# Keys that mean nothing under FSDP2 (or that cadence sets another way): key -> why / instead.
REFUSED_KEYS = {
    "process_group": "FSDP2 shards over a DeviceMesh built from data_parallel_shard_degree / "
                     "data_parallel_replicate_degree; set those instead.",
    "device_mesh": "the mesh is built from data_parallel_shard_degree / "
                   "data_parallel_replicate_degree; set those instead.",
    "ignored_modules": "not supported: every parameter is sharded. Freeze a module with "
                       "requires_grad=False, or use child tuning to train a subset.",
    "keep_low_precision_grads": "FSDP2 reduces gradients in mixed_precision's reduce_dtype and "
                                "hands the optimizer fp32 gradients; set "
                                "mixed_precision: {reduce_dtype: bf16} for low-precision reduction.",
    "activation_checkpointing_reentrant": "cadence uses non-reentrant checkpointing only (the "
                                          "reentrant form is deprecated upstream).",
    "sharded_ckpt_prefix_dir": "checkpoint paths are set on the Trainer (save_folder).",
    "param_init_fn": "define param_init_fn(module) on the model; FSDP2 materialises meta "
                     "modules through it.",
    "auto_wrap_policy": "set transformer_layer_cls (TRANSFORMER_BASED_WRAP), min_num_params "
                        "(SIZE_BASED_WRAP) or auto_wrap: false (NO_WRAP).",
    "wrap_custom_modules": "set _fsdp_wrap = True on the module, or define fsdp_wrap_fn on the model.",
}


@dataclass
class FSDPConfig:
    """FSDP2 settings. See the module docstring for how each maps onto FSDP2.

    Attributes:
        sharding_strategy: one of :data:`SHARDING_STRATEGIES`; default ``FULL_SHARD``.
        mixed_precision: ``DEFAULT`` / ``PURE`` / ``FULL`` or a dict of dtypes; default
            ``DEFAULT``.
        cpu_offload: keep sharded parameters, gradients and optimizer state on the CPU
            (``CPUOffloadPolicy``); default False.
        forward_prefetch: all-gather the next ``forward_prefetch_limit`` units' parameters
            before the current unit's forward (explicit FSDP2 prefetching); default False.
        forward_prefetch_limit: how many units ahead to prefetch in forward; default 1.
        backward_prefetch: ``BACKWARD_PRE``, FSDP2's only behaviour: the previous unit's
            all-gather is issued before the current unit's gradient computation. ``NONE`` and
            ``BACKWARD_POST`` have no FSDP2 equivalent and are refused.
        backward_prefetch_limit: how many units ahead to prefetch in backward; default 1.
        limit_all_gathers: FSDP1's rate limiter; FSDP2 always bounds in-flight all-gathers
            through its stream semantics, so only ``True`` is accepted.
        use_orig_params: FSDP2 always keeps the original parameters (as DTensors); only
            ``True`` is accepted.
        sync_module_states: broadcast rank 0's parameters and buffers to every rank before
            tensor parallelism and FSDP2 slice them (for models initialised differently per
            rank); default False.
        cpu_ram_efficient_loading: rank 0 holds the real weights, the other ranks build the
            model on the meta device; after sharding, rank 0's full state dict is broadcast
            and each rank keeps its shard (the Llama-70B FSDP recipe). Default False.
        auto_wrap: make submodules FSDP units (by ``_fsdp_wrap``, ``fsdp_wrap_fn``,
            ``transformer_layer_cls`` or ``min_num_params``); False shards the root only.
        transformer_layer_cls: class names of the modules to wrap; default for a
            ``HuggingFaceModel``: its ``_no_split_modules``.
        min_num_params: wrap any module with at least this many parameters not already in
            a unit (size-based wrapping); used when nothing else picks units.
        reshard_after_forward: override the strategy's value (bool or an int mesh size).
        data_parallel_shard_degree: ranks that shard each parameter; -1 (default) infers it.
        data_parallel_replicate_degree: replicas for HYBRID strategies; -1 (default) infers
            it (the number of nodes for HYBRID_*; the world size for NO_SHARD).
        verbose: print the wrap plan (each unit, its parameter count, the strategy) on rank 0.
        state_dict_type: checkpoint format: ``sharded`` (default; a DCP directory, each rank
            writing its shards) or ``full`` (one file gathered on rank 0).
        activation_checkpointing: Composer's spelling for adding the
            :class:`~cadence.algorithms.ActivationCheckpointing` algorithm (every transformer
            block, non-reentrant, applied at INIT before sharding); default False.
        activation_cpu_offload: with it, offload the saved activations to the CPU
            (the algorithm's ``offload_to_cpu``); default False.
        sync_gradients: when gradients are reduced while a batch accumulates over
            microbatches (:mod:`cadence.trainer.grad_sync`). ``every_microbatch`` (default,
            FSDP2's and torchtitan's behaviour): reduce-scatter after each microbatch, so each
            rank holds only its gradient shard (HSDP's all-reduce across replicas still waits
            for the last microbatch). ``last_microbatch``: no reduction until the last
            microbatch (``set_requires_gradient_sync(False)`` before it), one reduce-scatter
            per unit per step, at the cost of every rank holding each unit's whole
            (unsharded) gradient between microbatches: the gradient memory of DDP.
    """

    sharding_strategy: str = "FULL_SHARD"
    mixed_precision: Union[str, dict[str, Any]] = "DEFAULT"
    cpu_offload: bool = False
    forward_prefetch: bool = False
    forward_prefetch_limit: int = 1
    backward_prefetch: str = "BACKWARD_PRE"
    backward_prefetch_limit: int = 1
    limit_all_gathers: bool = True
    use_orig_params: bool = True
    sync_module_states: bool = False
    cpu_ram_efficient_loading: bool = False
    auto_wrap: bool = True
    transformer_layer_cls: Optional[list[str]] = None
    min_num_params: Optional[int] = None
    reshard_after_forward: Optional[Union[bool, int]] = None
    data_parallel_shard_degree: int = -1
    data_parallel_replicate_degree: int = -1
    verbose: bool = False
    state_dict_type: str = "sharded"
    activation_checkpointing: bool = False
    activation_cpu_offload: bool = False
    sync_gradients: str = "every_microbatch"

    def __post_init__(self) -> None:
        """Check every setting that differs from its default with the run file's own checks
        (:func:`check_parallelism_config`), and store the canonical spelling
        (``full_shard`` -> ``FULL_SHARD``).

        Raises:
            ConfigError: each bad value named by its key path
                (``parallelism_config.fsdp.sharding_strategy``), with the allowed values and
                a "did you mean".
        """
        problems: Problems = []
        values = _fsdp_values(_changed(self), f"{_PREFIX}.fsdp", problems)
        _raise(problems)
        for key, value in values.items():
            setattr(self, key, value)


@dataclass
class TPConfig:
    """Tensor parallelism (Composer's ``TPConfig``); see :mod:`cadence.parallel.tp`.

    Attributes:
        tensor_parallel_degree: ranks in each tensor-parallel group (the ``tp`` mesh
            dimension, innermost: ranks ``k * degree ... (k + 1) * degree - 1`` form group
            ``k``); must divide the world size. Default 1: no tensor parallelism.
        layer_plan: ``{module-name pattern: style}`` (``*`` matches one name segment);
            styles: ``colwise``, ``rowwise``, ``sequence_parallel``, ``fused_qkv_colwise``,
            ``replicate``, a ``ParallelStyle`` object or a dotted path to a ``ParallelStyle``
            class. Default: the model's ``tp_plan()``, else the built-in plans for
            ``GPT2Block`` and ``LlamaDecoderLayer``.
        verbose: print the mesh and the TP plan on rank 0 (as ``fsdp.verbose`` does).
        device_mesh: Composer's first argument, accepted as None only (the mesh is built
            from the degrees; a mesh given here is refused, naming the fix).
    """

    device_mesh: Optional[Any] = None
    tensor_parallel_degree: int = 1
    layer_plan: Optional[dict[str, Any]] = None
    verbose: bool = False

    def __post_init__(self) -> None:
        """Check the settings with the run file's own checks (a ``layer_plan`` style given as
        a dotted path is resolved where it is used, as in the run file's first stage).

        Raises:
            ConfigError: each bad value named by its key path
                (``parallelism_config.tp.tensor_parallel_degree``).
        """
        problems: Problems = []
        _tp_values(_changed(self), f"{_PREFIX}.tp", problems, import_paths=False)
        _raise(problems)


@dataclass
class EPConfig:
    """Expert parallelism for mixture-of-experts blocks; see
    :mod:`cadence.parallel.expert_parallel`.

    Attributes:
        expert_parallel_degree: ranks over which each MoE block's experts are split (the
            ``ep`` dimension of the experts' mesh). As in torchtitan, these ranks are taken
            from the data-parallel shard ranks (they load different samples), so ``ep`` does
            not multiply into the world size: it must divide the fsdp shard degree and each
            block's number of experts, and ``parallelism_config.fsdp`` must be set (FSDP2
            shards everything else over the data-parallel ranks). Default 1: no expert
            parallelism.
    """

    expert_parallel_degree: int = 1

    def __post_init__(self) -> None:
        """Check the settings with the run file's own checks.

        Raises:
            ConfigError: a bad value named by its key path
                (``parallelism_config.ep.expert_parallel_degree``).
        """
        problems: Problems = []
        _ep_values(_changed(self), f"{_PREFIX}.ep", problems)
        _raise(problems)


# TP keys with another meaning elsewhere: key -> why / instead.
_TP_REFUSED_KEYS = {
    "device_mesh": "the mesh is built from tensor_parallel_degree and the fsdp degrees; set "
                   "tensor_parallel_degree instead.",
    "pipeline_parallel_degree": "set it under parallelism_config.pp.",
}


@dataclass
class ParallelismConfig:
    """``parallelism_config``: ``fsdp`` (an :class:`FSDPConfig`), ``tp`` (a
    :class:`TPConfig`), ``ep`` (an :class:`EPConfig`, with ``fsdp``) and/or ``pp`` (a
    :class:`PPConfig`); none: DDP when the world size is above 1, else a single process."""

    fsdp: Optional[FSDPConfig] = field(default=None)
    tp: Optional[TPConfig] = field(default=None)
    ep: Optional[EPConfig] = field(default=None)
    pp: Optional[PPConfig] = field(default=None)

    def __post_init__(self) -> None:
        """Check the sections: each is an :class:`FSDPConfig` / :class:`TPConfig` (checked when
        it was built), a dict of their settings (checked and typed here), or None.

        Raises:
            ConfigError: a section of another type, or a bad setting in a dict section.
        """
        problems: Problems = []
        if isinstance(self.fsdp, Mapping):
            self.fsdp = _parse_fsdp(self.fsdp, f"{_PREFIX}.fsdp", problems)
        elif self.fsdp is not None and not isinstance(self.fsdp, FSDPConfig):
            _problem(problems, f"{_PREFIX}.fsdp",
                     f"{self.fsdp!r} must be an FSDPConfig, a dict of FSDP settings or None.")
        if isinstance(self.tp, Mapping):
            self.tp = _parse_tp(self.tp, f"{_PREFIX}.tp", problems, import_paths=False)
        elif self.tp is not None and not isinstance(self.tp, TPConfig):
            _problem(problems, f"{_PREFIX}.tp",
                     f"{self.tp!r} must be a TPConfig, a dict like {{tensor_parallel_degree: "
                     f"2}} or None.")
        if isinstance(self.ep, Mapping):
            self.ep = EPConfig(**_ep_values(self.ep, f"{_PREFIX}.ep", problems))
        elif self.ep is not None and not isinstance(self.ep, EPConfig):
            _problem(problems, f"{_PREFIX}.ep",
                     f"{self.ep!r} must be an EPConfig, a dict like {{expert_parallel_degree: "
                     f"2}} or None.")
        if isinstance(self.pp, Mapping):
            self.pp = _parse_pp(self.pp, f"{_PREFIX}.pp", problems)
        elif self.pp is not None and not isinstance(self.pp, PPConfig):
            _problem(problems, f"{_PREFIX}.pp",
                     f"{self.pp!r} must be a PPConfig, a dict like {{pipeline_parallel_degree: "
                     f"2}} or None.")
        _raise(problems)

    @property
    def tp_degree(self) -> int:
        """Ranks per tensor-parallel group (1: no tensor parallelism)."""
        return self.tp.tensor_parallel_degree if self.tp is not None else 1

    @property
    def ep_degree(self) -> int:
        """Ranks each MoE block's experts are split over (1: no expert parallelism)."""
        return self.ep.expert_parallel_degree if self.ep is not None else 1

    @property
    def pp_degree(self) -> int:
        """Pipeline ranks (1: no pipeline parallelism)."""
        return self.pp.pipeline_parallel_degree if self.pp is not None else 1

    def to_dict(self) -> dict[str, Any]:
        """The settings as a run file would write them (the run's ``hyperparameters``):
        ``fsdp``, ``tp``, ``ep`` and ``pp`` when set, each with the keys whose values differ from the
        defaults, under their canonical names.

        Returns:
            A new dict; parsing it again gives an equal config.
        """
        out: dict[str, Any] = {}
        for name in ("fsdp", "tp", "ep", "pp"):
            section = getattr(self, name)
            if section is not None:
                out[name] = {f.name: copy.copy(getattr(section, f.name))
                             for f in fields(section) if getattr(section, f.name) != f.default}
        return out


Problems = list[tuple[str, str]]  # (full key path, message)
_PREFIX = "parallelism_config"


def _changed(config: Any) -> dict[str, Any]:
    """A dataclass's settings that differ from their defaults (what a run file would write)."""
    return {f.name: getattr(config, f.name) for f in fields(config)
            if getattr(config, f.name) != f.default}


def _raise(problems: Problems) -> None:
    """Raise the run file's error for ``problems`` (nothing when there are none)."""
    if problems:
        raise ConfigError([ConfigProblem(key, message) for key, message in problems])


def _problem(problems: Problems, key: str, message: str) -> None:
    problems.append((key, message))


def _choice(problems: Problems, key: str, value: Any, allowed: tuple[str, ...],
            aliases: Mapping[str, str] = {}) -> Optional[str]:
    text = str(value)
    canonical = aliases.get(text, aliases.get(text.lower(), text))
    for option in allowed:
        if canonical.upper() == option.upper():
            return option
    hint = did_you_mean(canonical, allowed, ignore_case=True)
    _problem(problems, key, f"{value!r} is not one of: {', '.join(allowed)}.{hint}")
    return None


def _typed(problems: Problems, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, (int,)))
    if not ok:
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        _problem(problems, key, f"{value!r} ({type(value).__name__}) is not a {name}.")
        return None
    return value


def _parse_mixed_precision(problems: Problems, key: str, value: Any) -> Any:
    if isinstance(value, str):
        return _choice(problems, key, value, _MIXED_PRECISION_NAMES)
    if not isinstance(value, Mapping):
        _problem(problems, key, f"{value!r} must be DEFAULT, PURE, FULL or a dict of dtypes.")
        return None
    allowed = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
    parsed: dict[str, Any] = {}
    for sub, sub_value in value.items():
        sub_key = f"{key}.{sub}"
        if sub == "buffer_dtype":
            _problem(problems, sub_key, "FSDP2 does not manage buffers (they stay in their own "
                                        "dtype); remove it, or cast buffers in the model.")
        elif sub == "cast_forward_inputs":
            parsed[sub] = _typed(problems, sub_key, sub_value, bool)
        elif sub in allowed:
            parsed[sub] = None if sub_value is None else _choice(
                problems, sub_key, sub_value, _DTYPE_NAMES, _DTYPE_ALIASES)
        else:
            _problem(problems, sub_key, f"unknown key.{did_you_mean(sub, allowed)} Allowed: "
                                        f"{', '.join(allowed)}.")
    return parsed


def _parse_fsdp(raw: Mapping[str, Any], prefix: str, problems: Problems) -> FSDPConfig:
    """An :class:`FSDPConfig` of ``raw``'s valid settings; the bad ones go to ``problems``."""
    return FSDPConfig(**_fsdp_values(raw, prefix, problems))


def _fsdp_values(raw: Mapping[str, Any], prefix: str, problems: Problems) -> dict[str, Any]:
    """The one check of FSDP settings (run file and :meth:`FSDPConfig.__post_init__`): the
    valid values of ``raw`` by field name, canonically spelled; problems appended."""
    names = {f.name for f in fields(FSDPConfig)}
    values: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key = str(raw_key)
        if key.startswith("fsdp_"):  # Accelerate's spelling
            key = key[len("fsdp_"):]
        key = _ALIASES.get(key, key)
        where = f"{prefix}.{raw_key}"
        if key == "version":
            if value != 2:
                _problem(problems, where, f"{value!r}: cadence runs FSDP2 only (FSDP1 is "
                                          f"deprecated upstream); remove it or set 2.")
            continue
        if key in REFUSED_KEYS:
            _problem(problems, where, f"not supported under FSDP2: {REFUSED_KEYS[key]}")
            continue
        if key not in names:
            candidates = sorted(names | set(_ALIASES) | set(REFUSED_KEYS))
            _problem(problems, where, f"unknown FSDP key.{did_you_mean(key, candidates)} "
                                      f"Allowed: {', '.join(sorted(names))}.")
            continue
        values[key] = (where, value)

    parsed_values: dict[str, Any] = {}
    for key, (where, value) in values.items():
        before = len(problems)
        if key == "sharding_strategy":
            parsed = _choice(problems, where, value, SHARDING_STRATEGIES, _STRATEGY_ALIASES)
        elif key == "mixed_precision":
            parsed = _parse_mixed_precision(problems, where, value)
        elif key == "state_dict_type":
            parsed = _choice(problems, where, value, ("full", "sharded"),
                             {"FULL_STATE_DICT": "full", "SHARDED_STATE_DICT": "sharded",
                              "full_state_dict": "full", "sharded_state_dict": "sharded"})
        elif key == "sync_gradients":
            parsed = _choice(problems, where, value, SYNC_GRADIENTS)
        elif key == "backward_prefetch":
            if str(value).upper() in ("BACKWARD_POST", "NONE"):
                _problem(problems, where, f"{value!r} has no FSDP2 equivalent: FSDP2 always "
                                          "issues the next unit's all-gather before each unit's "
                                          "backward (BACKWARD_PRE). Use BACKWARD_PRE, and "
                                          "backward_prefetch_limit for more overlap.")
                parsed = None
            else:
                parsed = _choice(problems, where, value, _PREFETCH)
        elif key in ("limit_all_gathers", "use_orig_params"):
            parsed = _typed(problems, where, value, bool)
            if parsed is False:
                _problem(problems, where, "False has no FSDP2 equivalent: "
                         + ("FSDP2 always bounds in-flight all-gathers."
                            if key == "limit_all_gathers"
                            else "FSDP2 always exposes the original parameters (as DTensors).")
                         + " Remove the key.")
        elif key == "transformer_layer_cls":
            if isinstance(value, str):
                value = [value]
            parsed = _typed(problems, where, value, (list, tuple))
            if parsed is not None:
                parsed = [str(v) for v in parsed]
        elif key == "min_num_params":
            parsed = None if value is None else _typed(problems, where, value, int)
            if isinstance(parsed, int) and parsed <= 0:
                _problem(problems, where, f"{parsed} must be a positive number of parameters.")
        elif key == "reshard_after_forward":
            parsed = None if value is None else _typed(problems, where, value, (bool, int))
        elif key in ("data_parallel_shard_degree", "data_parallel_replicate_degree"):
            parsed = _typed(problems, where, value, int)
            if isinstance(parsed, int) and (parsed == 0 or parsed < -1):
                _problem(problems, where, f"{parsed} must be a positive int or -1 (infer).")
        elif key in ("forward_prefetch_limit", "backward_prefetch_limit"):
            parsed = _typed(problems, where, value, int)
            if isinstance(parsed, int) and parsed < 1:
                _problem(problems, where, f"{parsed} must be at least 1.")
        else:  # plain bools
            parsed = _typed(problems, where, value, bool)
        if parsed is not None and len(problems) == before:  # only values without a problem
            parsed_values[key] = parsed
    return parsed_values


def _parse_pp(raw: Mapping[str, Any], prefix: str, problems: Problems) -> PPConfig:
    """A :class:`PPConfig` of ``raw``'s valid settings; the bad ones go to ``problems``."""
    before = len(problems)
    values = pp_values(raw, prefix, problems)
    if len(problems) > before:  # a partial pipeline (split points without their degree) is
        values = {}             # not worth checking further
    return PPConfig(**values)


def _parse_tp(raw: Mapping[str, Any], prefix: str, problems: Problems,
              import_paths: bool = True) -> TPConfig:
    """A :class:`TPConfig` of ``raw``'s valid settings; the bad ones go to ``problems``."""
    return TPConfig(**_tp_values(raw, prefix, problems, import_paths))


def _tp_values(raw: Mapping[str, Any], prefix: str, problems: Problems,
               import_paths: bool = True) -> dict[str, Any]:
    """The one check of TP settings (run file and :meth:`TPConfig.__post_init__`): the valid
    values of ``raw`` by field name; problems appended. ``import_paths=False`` leaves a
    dotted-path style unchecked."""
    names = [f.name for f in fields(TPConfig) if f.name not in _TP_REFUSED_KEYS]
    config: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key, where = str(raw_key), f"{prefix}.{raw_key}"
        if key in _TP_REFUSED_KEYS:
            _problem(problems, where, f"not supported: {_TP_REFUSED_KEYS[key]}")
        elif key not in names:
            _problem(problems, where, f"unknown TP key.{did_you_mean(key, names)} Allowed: "
                                      f"{', '.join(names)}.")
        elif key == "tensor_parallel_degree":
            degree = _typed(problems, where, value, int)
            if isinstance(degree, int) and degree < 1:
                _problem(problems, where, f"{degree} must be a positive int (1: no tensor "
                                          "parallelism).")
            elif isinstance(degree, int):
                config["tensor_parallel_degree"] = degree
        elif key == "verbose":
            if _typed(problems, where, value, bool) is not None:
                config["verbose"] = value
        elif value is not None:  # layer_plan
            if not isinstance(value, Mapping) or not value:
                _problem(problems, where, f"{value!r} must be a non-empty dict of "
                                          "{module pattern: style}.")
                continue
            plan: dict[str, Any] = {}
            before = len(problems)
            for pattern, style in value.items():
                problem = tp_style_problem(style, import_paths)
                if problem is not None:
                    _problem(problems, f"{where}.{pattern}", problem)
                plan[str(pattern)] = style
            if len(problems) == before:  # only a plan without a problem
                config["layer_plan"] = plan
    return config


def _ep_values(raw: Mapping[str, Any], prefix: str, problems: Problems) -> dict[str, Any]:
    """The one check of EP settings (run file and :meth:`EPConfig.__post_init__`): the valid
    values of ``raw`` by field name; problems appended."""
    names = [f.name for f in fields(EPConfig)]
    config: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key, where = str(raw_key), f"{prefix}.{raw_key}"
        if key not in names:
            _problem(problems, where, f"unknown EP key.{did_you_mean(key, names)} Allowed: "
                                      f"{', '.join(names)}.")
            continue
        degree = _typed(problems, where, value, int)
        if isinstance(degree, int) and degree < 1:
            _problem(problems, where, f"{degree} must be a positive int (1: no expert "
                                      "parallelism).")
        elif isinstance(degree, int):
            config[key] = degree
    return config


def layer_plan_problems(config: ParallelismConfig, prefix: str = "parallelism_config",
                        ) -> Problems:
    """Check the ``layer_plan`` styles of a typed config that are dotted paths, by importing
    them (the run file's second stage: the first, torch-free one left them unchecked).

    Args:
        config: the config :func:`check_parallelism_config` returned.
        prefix: the key path used in messages.

    Returns:
        ``(full key path, message)`` for each style that does not resolve to a
        ``ParallelStyle`` class.
    """
    problems: Problems = []
    plan = config.tp.layer_plan if config.tp is not None else None
    for pattern, style in (plan or {}).items():
        problem = tp_style_problem(style, import_paths=True)
        if problem is not None:
            _problem(problems, f"{prefix}.tp.layer_plan.{pattern}", problem)
    return problems


def parse_parallelism_config(
    raw: Union[None, Mapping[str, Any], ParallelismConfig], prefix: str = "parallelism_config",
) -> ParallelismConfig:
    """Validate ``raw`` (a dict as written in YAML or Python) into a :class:`ParallelismConfig`.

    Raises:
        ValueError: every problem at once, each naming the full key, the bad value and what
            to use instead (unknown keys get a "did you mean").
    """
    result, problems = check_parallelism_config(raw, prefix)
    if problems:
        raise ValueError(
            f"{len(problems)} problem(s) in {prefix}:\n"
            + "\n".join(f"  - {key}: {message}" for key, message in problems)
        )
    return result


def check_parallelism_config(
    raw: Union[None, Mapping[str, Any], ParallelismConfig], prefix: str = "parallelism_config",
    import_paths: bool = True,
) -> tuple[ParallelismConfig, Problems]:
    """Like :func:`parse_parallelism_config`, but returns ``(config, problems)`` where each
    problem is ``(full key path, message)``; the config holds the valid settings only.
    ``import_paths=False`` (the run file's torch-free first stage) leaves a ``layer_plan``
    style given as a dotted path unchecked."""
    if raw is None:
        return ParallelismConfig(), []
    if isinstance(raw, ParallelismConfig):
        return raw, []
    problems: Problems = []
    if not isinstance(raw, Mapping):
        _problem(problems, prefix, f"{raw!r} must be a dict like {{fsdp: {{...}}}} or null.")
        return ParallelismConfig(), problems
    result = ParallelismConfig()
    sections = {  # key -> (its class, its parser, what a value looks like)
        "fsdp": (FSDPConfig, lambda v, p: _parse_fsdp(v, p, problems), "a dict of FSDP settings"),
        "tp": (TPConfig, lambda v, p: _parse_tp(v, p, problems, import_paths),
               "a dict like {tensor_parallel_degree: 2}"),
        "ep": (EPConfig, lambda v, p: EPConfig(**_ep_values(v, p, problems)),
               "a dict like {expert_parallel_degree: 2}"),
        "pp": (PPConfig, lambda v, p: _parse_pp(v, p, problems),
               "a dict like {pipeline_parallel_degree: 2}"),
    }
    for key, value in raw.items():
        if key in sections:
            if value is None:
                continue
            cls, parse, example = sections[key]
            if isinstance(value, cls):  # checked when it was built
                setattr(result, key, value)
            elif isinstance(value, Mapping):
                setattr(result, key, parse(value, f"{prefix}.{key}"))
            else:
                _problem(problems, f"{prefix}.{key}", f"{value!r} must be {example}.")
        elif key in ("tensor_parallel", "pipeline_parallel", "cp", "context_parallel"):
            _problem(problems, f"{prefix}.{key}", "not supported: cadence runs data parallelism "
                                                  "(fsdp), tensor parallelism (tp), expert "
                                                  "parallelism (ep) and pipeline parallelism "
                                                  "(pp); context parallelism needs "
                                                  "CUDA ring attention.")
        else:
            _problem(problems, f"{prefix}.{key}",
                     f"unknown key.{did_you_mean(str(key), list(sections))} "
                     f"Allowed: {', '.join(sections)}.")
    return result, problems
