"""``torch.compile`` as a step of the parallelize plan: per transformer block or whole model.

The plan's order is torchtitan's: activation checkpointing, then compile, then tensor
parallelism, then FSDP2 ``fully_shard`` per block and the root
(:mod:`cadence.parallel.plan`). Compiling comes before sharding
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

The settings are :class:`~cadence.parallel.compile_config.CompileConfig` (a run file's
``compile_config`` section, or ``Trainer(compile_config=...)``), checked without torch in
:mod:`cadence.parallel.compile_config`, the one home of their names, defaults and checks.

Sources: ``torch.compile`` and ``nn.Module.compile`` (PyTorch docs); torchtitan
``apply_compile`` (``torchtitan/models/llama3/infra/parallelize.py``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

from torch import nn

from cadence.parallel.compile_config import (
    COMPILE_MODES, CompileConfig, parse_compile_config,
)

__all__ = ["CompileConfig", "COMPILE_MODES", "apply_compile", "compile_targets",
           "parse_compile_config", "is_compiled"]

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
