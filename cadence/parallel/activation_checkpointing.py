"""Activation checkpointing (recompute blocks in backward) and activation offloading to
CPU: the first step of the parallelize plan, and the functions behind the
:class:`~cadence.algorithms.ActivationCheckpointing` algorithm.

Each selected block keeps only its inputs in the forward pass; its activations are
recomputed during backward (non-reentrant ``torch.utils.checkpoint``, which also restores
the RNG so dropout recomputes identically). With ``offload_to_cpu`` the blocks that are
not recomputed keep their saved activations in (pinned) CPU memory instead
(``torch.autograd.graph.save_on_cpu``).

The block's ``forward`` is replaced in place by a checkpointed call of the class's own
``forward``: the module keeps its class, its parameter names and its state-dict keys (no
``_checkpoint_wrapped_module.`` prefix as with ``checkpoint_wrapper``), so FSDP wrap rules,
TP plans, optimizers and checkpoints see the same model. Applied before compile, tensor
parallelism and FSDP2 (torchtitan's order): FSDP2's hooks then sit around the checkpointed
forward and, in backward, gather the block's parameters before its recomputation.

Source: Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016;
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``; torchtitan's ``apply_ac``
(``ac_freq``: checkpoint every n-th block).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "ActivationCheckpointingConfig", "apply_activation_checkpointing",
    "remove_activation_checkpointing", "select_blocks", "is_checkpointed", "apply_ac",
]


@dataclass
class ActivationCheckpointingConfig:
    """What the plan's activation-checkpointing step does (the fsdp keys
    ``activation_checkpointing`` / ``activation_cpu_offload`` in Composer's spelling).

    Attributes:
        every_n: checkpoint every n-th transformer block; 0: none. Default 1 (all).
        offload_to_cpu: keep the saved activations of the blocks not checkpointed on CPU.
        layer_cls: class names of the blocks; default the model's own choice.
    """

    every_n: int = 1
    offload_to_cpu: bool = False
    layer_cls: Optional[list[str]] = None


_MARK = "_cadence_activation_checkpointing"  # on a wrapped module: {"checkpoint", "offload"}


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`apply_activation_checkpointing` wrapped ``module``'s forward."""
    return getattr(module, _MARK, None) is not None


def _wrapped_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The forward installed on a selected block (bound to it as ``self.forward``).

    Calls the class's forward (``type(self).forward``, not this instance attribute), so the
    recomputation in backward runs the original code.
    """
    options = getattr(self, _MARK)
    forward = type(self).forward
    if not torch.is_grad_enabled():  # eval / no_grad: nothing is saved, nothing to recompute
        return forward(self, *args, **kwargs)
    offload = (torch.autograd.graph.save_on_cpu(pin_memory=options["pin_memory"])
               if options["offload"] else contextlib.nullcontext())
    with offload:
        if options["checkpoint"]:
            return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)
        return forward(self, *args, **kwargs)


def select_blocks(
    model: nn.Module,
    layer_cls: Optional[Sequence[str]] = None,
    check_fn: Optional[Callable[[nn.Module], bool]] = None,
) -> list[tuple[str, nn.Module]]:
    """The ``(qualified name, module)`` blocks to checkpoint, in module order.

    Which modules count as blocks (first rule that applies):

    1. ``layer_cls``: modules whose class name is in it;
    2. ``check_fn(module)``;
    3. the model's ``activation_checkpointing_fn(module)`` (a ``HuggingFaceModel`` answers
       with its transformer blocks, the classes in ``_no_split_modules``).

    A block inside another block is not selected again (the outer one already recomputes it).

    Raises:
        ValueError: ``layer_cls`` names a class that the model does not contain.
    """
    if layer_cls:
        names = set(layer_cls)
        present = {type(m).__name__ for m in model.modules()}
        missing = sorted(names - present)
        if missing:
            raise ValueError(
                f"activation_checkpointing: layer_cls names {missing}, which the model does not "
                f"contain. Module classes in the model include: {', '.join(sorted(present)[:30])}."
            )

        def chosen(module: nn.Module) -> bool:
            return type(module).__name__ in names
    elif check_fn is not None:
        chosen = check_fn
    else:
        model_fn = getattr(model, "activation_checkpointing_fn", None)
        if not callable(model_fn):
            return []
        chosen = model_fn

    blocks: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            qualified = f"{prefix}.{name}" if prefix else name
            if chosen(child):
                blocks.append((qualified, child))
            else:
                visit(qualified, child)

    visit("", model)
    return blocks


def apply_activation_checkpointing(
    model: nn.Module,
    layer_cls: Optional[Sequence[str]] = None,
    check_fn: Optional[Callable[[nn.Module], bool]] = None,
    every_n: int = 1,
    offload_to_cpu: bool = False,
) -> dict[str, list[str]]:
    """Checkpoint (and/or offload) the blocks of ``model`` in place.

    Of the blocks :func:`select_blocks` finds, numbered 1, 2, ... in module order, block
    ``k`` is checkpointed when ``k % every_n == 0`` (torchtitan's ``ac_freq``): ``every_n=1``
    checkpoints all, ``2`` every second one, ``0`` none. With ``offload_to_cpu`` every
    selected block that is *not* checkpointed saves its activations on the CPU.

    Args:
        model: the unwrapped model (before DDP/FSDP); modified in place.
        layer_cls: class names of the blocks; default: see :func:`select_blocks`.
        check_fn: ``module -> bool`` choosing the blocks (when ``layer_cls`` is not given).
        every_n: checkpoint every n-th selected block; >= 0.
        offload_to_cpu: offload the saved activations of the selected blocks that are not
            checkpointed (``save_on_cpu``, pinned memory on CUDA).

    Returns:
        ``{"checkpointed": [names], "offloaded": [names]}``.

    Raises:
        ValueError: ``every_n`` is negative, or ``layer_cls`` names an absent class.
    """
    if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 0:
        raise ValueError(f"every_n must be an int >= 0 (0: checkpoint none), got {every_n!r}.")
    pin_memory = torch.cuda.is_available()
    done: dict[str, list[str]] = {"checkpointed": [], "offloaded": []}
    for index, (name, module) in enumerate(select_blocks(model, layer_cls, check_fn), start=1):
        do_checkpoint = every_n > 0 and index % every_n == 0
        do_offload = offload_to_cpu and not do_checkpoint
        if not (do_checkpoint or do_offload) or is_checkpointed(module):
            continue
        setattr(module, _MARK, {"checkpoint": do_checkpoint, "offload": do_offload,
                                "pin_memory": pin_memory})
        # An instance attribute: nn.Module.__call__ (and FSDP2's hooks around it) call it.
        module.forward = types.MethodType(_wrapped_forward, module)  # type: ignore[method-assign]
        done["checkpointed" if do_checkpoint else "offloaded"].append(name)
    return done


def remove_activation_checkpointing(model: nn.Module) -> int:
    """Undo :func:`apply_activation_checkpointing` on every module of ``model``.

    Returns:
        The number of modules restored.
    """
    restored = 0
    for module in model.modules():
        if is_checkpointed(module):
            delattr(module, _MARK)
            if "forward" in module.__dict__:
                del module.__dict__["forward"]
            restored += 1
    return restored


def apply_ac(model: nn.Module, config: Optional[ActivationCheckpointingConfig]
             ) -> dict[str, list[str]]:
    """The plan's step: checkpoint ``model`` as ``config`` says, unless blocks are already
    checkpointed (the :class:`~cadence.algorithms.ActivationCheckpointing` algorithm ran at
    ``INIT``: its settings stand) or ``config`` is None."""
    done: dict[str, list[str]] = {"checkpointed": [], "offloaded": []}
    if config is None or any(is_checkpointed(m) for m in model.modules()):
        return done
    return apply_activation_checkpointing(model, layer_cls=config.layer_cls,
                                          every_n=config.every_n,
                                          offload_to_cpu=config.offload_to_cpu)
