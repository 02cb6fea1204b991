"""``torch.compile`` as a step of the parallelize plan: per transformer block or whole model.

The plan's order is torchtitan's: activation checkpointing, then compile, then tensor
parallelism, then FSDP2 ``fully_shard`` per block and the root
(:mod:`cadence.trainer.parallel.plan`). Compiling comes before sharding
so each block's graph is traced from the plain module; FSDP2's hooks stay outside the
compiled graphs (dynamo skips them by default).

Modules are compiled in place with ``nn.Module.compile`` (the module keeps its class,
its parameters and its state-dict keys; no ``_orig_mod.`` prefix), as torchtitan does for
each transformer block. ``per_block`` compiles the modules the model names as its blocks:
the ones its ``fsdp_wrap_fn`` (or, failing that, ``activation_checkpointing_fn``) selects;
for a :class:`~cadence.models.HuggingFaceModel` these are the classes of the wrapped
model's ``_no_split_modules`` (``GPT2Block`` for GPT-2). Identical blocks share one
compiled graph (the cache is per code object), so compile time grows with the number of
distinct block kinds, not with depth.

Run-file form::

    compile:
      enabled: true
      mode: default          # default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
      fullgraph: false
      dynamic: null          # true | false | null (let dynamo decide)
      backend: inductor      # any name in torch._dynamo.list_backends(exclude_tags=())
      per_block: true

Sources: ``torch.compile`` and ``nn.Module.compile`` (PyTorch docs); torchtitan
``apply_compile`` (``torchtitan/models/llama3/infra/parallelize.py``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Optional, Union

from torch import nn

__all__ = ["CompileConfig", "COMPILE_MODES", "apply_compile", "compile_targets",
           "parse_compile_config", "is_compiled"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes (inductor's); any but ``default`` needs ``backend: inductor``."""

_BOOL_KEYS = ("enabled", "fullgraph", "per_block")


@dataclass
class CompileConfig:
    """How to compile the model. See the module docstring for the run-file form.

    Attributes:
        enabled: compile at all; default True (a ``compile`` section turns it on; set
            ``enabled: false`` to keep the section but run eagerly).
        mode: one of :data:`COMPILE_MODES`; default ``"default"``.
        fullgraph: refuse graph breaks (``torch.compile(fullgraph=True)``): a block that
            cannot be traced whole raises at its first call instead of running in pieces.
        dynamic: ``True`` traces shapes symbolically from the start, ``False`` specialises
            on every shape, ``None`` (default) specialises first and goes dynamic on a
            recompile.
        backend: a dynamo backend name; default ``"inductor"``. ``"aot_eager"`` and
            ``"eager"`` run the same tracing without code generation (for debugging and
            fast tests).
        per_block: compile each transformer block (default, torchtitan's choice: small
            graphs, one compile shared by identical blocks, and FSDP2's per-block hooks
            fall between graphs) instead of the whole model.
    """

    enabled: bool = True
    mode: str = "default"
    fullgraph: bool = False
    dynamic: Optional[bool] = None
    backend: str = "inductor"
    per_block: bool = True

    def compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``torch.compile`` / ``nn.Module.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph,
                                  "dynamic": self.dynamic}
        if self.mode != "default":
            kwargs["mode"] = self.mode
        return kwargs


def _did_you_mean(value: str, allowed: Any) -> str:
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _dynamo_backends() -> list[str]:
    import torch._dynamo

    return sorted(torch._dynamo.list_backends(exclude_tags=()))


def parse_compile_config(
    raw: Union[None, Mapping[str, Any], CompileConfig], prefix: str = "compile",
) -> Optional[CompileConfig]:
    """Validate ``raw`` into a :class:`CompileConfig` (``None`` stays ``None``: no compile).

    Args:
        raw: ``None``, a :class:`CompileConfig`, or a dict with any of the keys ``enabled``,
            ``mode``, ``fullgraph``, ``dynamic``, ``backend``, ``per_block``.
        prefix: the key path used in error messages.

    Raises:
        ValueError: every problem at once, each naming the key, the bad value and the
            allowed values (with a "did you mean" for near misses): an unknown key, a
            non-bool flag, an unknown mode or backend, or a mode other than ``default``
            with a backend other than ``inductor``.
    """
    if raw is None:
        return None
    if isinstance(raw, CompileConfig):
        raw = {f.name: getattr(raw, f.name) for f in fields(CompileConfig)}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{prefix} must be a dict like {{'enabled': True, 'per_block': True}} "
                         f"or None, got {raw!r} ({type(raw).__name__}).")
    names = [f.name for f in fields(CompileConfig)]
    problems: list[str] = []
    config = CompileConfig()
    for key, value in raw.items():
        where = f"{prefix}.{key}"
        if key not in names:
            problems.append(f"{where}: unknown key.{_did_you_mean(key, names)} "
                            f"Allowed: {', '.join(names)}.")
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                problems.append(f"{where}: {value!r} ({type(value).__name__}) must be true or "
                                f"false.")
            else:
                setattr(config, key, value)
        elif key == "dynamic":
            if value is not None and not isinstance(value, bool):
                problems.append(f"{where}: {value!r} must be true, false or null (let dynamo "
                                f"decide).")
            else:
                config.dynamic = value
        elif key == "mode":
            text = "default" if value is None else value
            if text not in COMPILE_MODES:
                problems.append(f"{where}: {value!r} is not one of: "
                                f"{', '.join(COMPILE_MODES)}.{_did_you_mean(text, COMPILE_MODES)}")
            else:
                config.mode = text
        elif key == "backend":
            backends = _dynamo_backends()
            if not isinstance(value, str) or value not in backends:
                problems.append(f"{where}: {value!r} is not a dynamo backend; allowed: "
                                f"{', '.join(backends)}.{_did_you_mean(value, backends)}")
            else:
                config.backend = value
    if not problems and config.mode != "default" and config.backend != "inductor":
        problems.append(f"{prefix}.mode: {config.mode!r} is an inductor mode, but backend is "
                        f"{config.backend!r}; use backend: inductor or mode: default.")
    if problems:
        raise ValueError(f"{len(problems)} problem(s) in {prefix}:\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return config


def _block_selector(model: nn.Module) -> Optional[Callable[[nn.Module], bool]]:
    """The model's own rule for its transformer blocks, or None if it has none."""
    for name in ("fsdp_wrap_fn", "activation_checkpointing_fn"):
        fn = getattr(model, name, None)
        if callable(fn):
            # fsdp_wrap_fn may answer a dict of fully_shard kwargs (even {}): that selects too.
            return lambda module, fn=fn: (lambda r: isinstance(r, Mapping) or bool(r))(fn(module))
    return None


def compile_targets(model: nn.Module, per_block: bool = True) -> list[tuple[str, nn.Module]]:
    """The modules :func:`apply_compile` compiles, as ``(qualified name, module)``.

    With ``per_block``, the outermost modules the model's ``fsdp_wrap_fn`` (else
    ``activation_checkpointing_fn``) selects, root excluded; otherwise the root alone
    (named ``""``).

    Raises:
        ValueError: ``per_block`` is set but the model names no blocks (it has neither hook,
            or they select nothing).
    """
    if not per_block:
        return [("", model)]
    selector = _block_selector(model)
    targets: list[tuple[str, nn.Module]] = []
    if selector is not None:
        for name, module in model.named_modules():
            if module is model or not selector(module):
                continue
            if any(name.startswith(outer + ".") for outer, _ in targets):
                continue  # inside a block already chosen
            targets.append((name, module))
    if not targets:
        raise ValueError(
            f"compile.per_block is true but {type(model).__name__} names no transformer blocks "
            "(define fsdp_wrap_fn(module) -> bool or activation_checkpointing_fn(module) -> "
            "bool on the model; a HuggingFaceModel uses its _no_split_modules). Set "
            "compile.per_block: false to compile the whole model."
        )
    return targets


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` was compiled in place (``nn.Module.compile``) or is an
    ``OptimizedModule`` (``torch.compile(module)``)."""
    import torch._dynamo.eval_frame

    return (getattr(module, "_compiled_call_impl", None) is not None
            or isinstance(module, torch._dynamo.eval_frame.OptimizedModule))


def apply_compile(model: nn.Module,
                  compile_config: Union[None, Mapping[str, Any], CompileConfig]) -> nn.Module:
    """Compile ``model`` in place, per transformer block or whole, as ``compile_config`` says.

    Call it in the parallelize plan after model surgery (activation checkpointing) and
    before FSDP2 / DDP wrapping.

    Args:
        model: the model (a ComposerModel such as a HuggingFaceModel, or any ``nn.Module``).
        compile_config: ``None`` (no compile), a :class:`CompileConfig`, or a dict of its
            fields (see :func:`parse_compile_config`).

    Returns:
        ``model`` itself (compiled modules keep their class and state-dict keys); unchanged
        when ``compile_config`` is ``None`` or has ``enabled: false``. Compilation happens
        lazily, at each compiled module's first call.

    Raises:
        ValueError: a bad ``compile_config`` (every problem listed), or ``per_block`` on a
            model that names no blocks.
    """
    config = (compile_config if isinstance(compile_config, CompileConfig)  # parsed already
              else parse_compile_config(compile_config))
    if config is None or not config.enabled:
        return model
    kwargs = config.compile_kwargs()
    for _, module in compile_targets(model, config.per_block):
        module.compile(**kwargs)
    return model
