"""Composer's ``prepare_fsdp_module``: shard a model with FSDP outside the Trainer, with the
optimizers pointed at the sharded parameters.

cadence shards with FSDP2 (``fully_shard``), through the same function its Trainer uses
(:func:`cadence.parallel.fsdp.apply_fsdp`); Composer 0.32 wraps with FSDP1. The model stays
the same object (sharded in place) and each optimizer's parameter groups are rebound, name
by name, to the new DTensor parameters.

Source: Composer 0.32.1 ``composer/distributed/dist_strategy.py`` (signature and contract).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import nn

from cadence.parallel.config import FSDPConfig, ParallelismConfig
from cadence.parallel.fsdp import apply_fsdp
from cadence.parallel.parallel_dims import build_mesh

__all__ = ["prepare_fsdp_module"]


def prepare_fsdp_module(model: nn.Module,
                        optimizers: Optional[Union[torch.optim.Optimizer,
                                                   list[torch.optim.Optimizer]]],
                        fsdp_config: Union[FSDPConfig, dict[str, Any]], precision: Any,
                        device: Any, auto_microbatching: bool,
                        te_rng_seed: int = 1234) -> dict[str, Any]:
    """Shard ``model`` in place with FSDP2 over every rank (a 1-D mesh, or 2-D for the
    hybrid strategies), and rebind ``optimizers`` to the sharded parameters.

    Args:
        model: the model (a ``ComposerModel`` usually); its ``fsdp_wrap_fn`` /
            ``_fsdp_wrap`` choose the units, as in the Trainer.
        optimizers: optimizers over ``model``'s parameters, with no state yet.
        fsdp_config: an :class:`~cadence.parallel.config.FSDPConfig` or its keys.
        precision: the run's precision (``"fp32"``, ``"amp_bf16"``, a ``Precision``).
        device: the device (a name, ``torch.device`` or cadence ``Device``).
        auto_microbatching: must be False (cadence's automatic microbatching lives in the
            Trainer).
        te_rng_seed: accepted for Composer's signature (TransformerEngine is not used).

    Returns:
        ``{}`` (Composer returns the FSDP1 modules' hooks; FSDP2 needs none).

    Raises:
        ValueError: an optimizer already has state; ``auto_microbatching`` is True.
        RuntimeError: no process group is initialised.
    """
    del te_rng_seed
    if auto_microbatching:
        raise ValueError("prepare_fsdp_module(auto_microbatching=True): cadence retries "
                         "microbatch sizes inside the Trainer (device_train_microbatch_size="
                         "'auto'); pass auto_microbatching=False here.")
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        raise RuntimeError("prepare_fsdp_module needs an initialised process group "
                           "(cadence.utils.dist.initialize_dist() or torchrun).")
    config = fsdp_config if isinstance(fsdp_config, FSDPConfig) else FSDPConfig(**fsdp_config)
    opts = [] if optimizers is None else (
        [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers))
    for opt in opts:
        if opt.state:
            raise ValueError("prepare_fsdp_module: an optimizer already has state; build the "
                             "optimizers before their first step, then shard.")
    names = {id(p): name for name, p in model.named_parameters()}
    if isinstance(device, torch.device):
        torch_device = device
    elif isinstance(getattr(device, "torch_device", None), torch.device):  # a cadence Device
        torch_device = device.torch_device
    else:
        torch_device = torch.device("cuda" if str(device) == "gpu" else str(device))
    mesh = build_mesh(ParallelismConfig(fsdp=config), torch_device.type)
    apply_fsdp(model, config, mesh, str(getattr(precision, "value", precision)), torch_device)
    sharded = dict(model.named_parameters())
    for opt in opts:
        for group in opt.param_groups:
            group["params"] = [sharded[names[id(p)]] for p in group["params"]]
    return {}
