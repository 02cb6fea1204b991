"""Materialise a model built on the meta device, after sharding, and initialise it: the
contract between the parallelize plan and a model's init hook.

A model built on the meta device (``gpt2(init_device="meta")``, ``hf_pretrained(...,
init_device="meta")``, or any model built under ``with torch.device("meta"):``) holds no
memory. :func:`~cadence.parallel.plan.parallelize` shards it (tensor parallelism, then
FSDP2, both of which accept meta parameters), and only then calls
:func:`materialize_and_init`, so each rank allocates its own shards and nothing else:

1. ``model.to_empty(device=device)``: each parameter's local shard (the whole tensor when
   nothing shards it) allocated, uninitialised, on ``device``; FSDP2 re-registers its
   sharded parameters (``FSDPModule`` handles ``to_empty``). Parameters shared by several
   modules (tied embeddings), which ``to_empty`` would split, are tied again.
2. the model's init hook, looked up on the unwrapped model (inside DDP), first found wins:

   - ``init_weights()`` (torchtitan's name): initialise (or load) the whole model in place.
     It sees the sharded parameters (DTensors under FSDP2 / TP) and writes into them in
     place: ``nn.init`` functions, ``tensor.normal_()``, ``copy_`` of this rank's slice.
     :class:`~cadence.models.HuggingFaceModel` defines it: the wrapped model's own
     ``init_weights`` (its normal random init), or the pretrained weights streamed into the
     shards when built by ``hf_pretrained(init_device="meta")``.
   - ``param_init_fn(module)`` (Composer's name): called once per module, children before
     their parent (``nn.Module.apply``'s order, so a parent may override its children's
     init, as GPT-2's scaled residual projections do); it initialises the module's own
     parameters and buffers (it may touch a child's, as Hugging Face ``_init_weights``
     does).

   A meta model with neither hook is refused before anything is sharded
   (:func:`check_init_hook`).

The same seed gives the same full weights on every layout. The hook runs with the RNG of
every device seeded with one seed agreed by all ranks (the ``seed`` argument, or rank 0's
draw broadcast), under :class:`LayoutInvariantRandom`: an in-place random fill of a DTensor
(``normal_``, ``uniform_``, ``bernoulli_``, ..., the ops tagged
``torch.Tag.nondeterministic_seeded``) draws the *full* tensor on this rank's device and
keeps this rank's slice. Every rank then consumes the same random stream in the same order
as an unsharded build does, so a 4-rank FSDP x TP model gathers to exactly the 1-rank
model's weights. The cost is one full tensor at a time in memory (the largest tensor
bounds it) and the full model's random draws on each rank. DTensor's own offset-based RNG
(``torch.distributed.tensor._random.OffsetBasedRNGTracker``) would draw only the local
slice, but it needs a Philox generator (CUDA-like devices; ``is_rng_supported_mesh`` is
False on CPU, where random ops on a DTensor draw from each rank's own generator and the
weights then depend on the layout); this mode works on every device, CPU/gloo included. Out-of-place random ops (``torch.randn(...)`` then ``copy_``) are not intercepted:
write into the parameter in place.

Sources: torchtitan (``model.to_empty(device=...)`` then ``model.init_weights()`` after
``fully_shard``); Composer's ``param_init_fn`` (``composer/distributed/dist_strategy.py``);
llm-foundry's ``init_device: meta``; PyTorch ``torch.distributed.tensor.distribute_tensor``
(``src_data_rank=None``: each rank keeps its slice of a tensor it holds whole).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from cadence.utils import dist
from cadence.utils.dtensor import local_chunk
from cadence.utils.misc import unwrap_model

__all__ = ["materialize_and_init", "run_init_hook", "init_hook", "check_init_hook",
           "has_meta_tensors", "LayoutInvariantRandom", "shared_parameters", "retie_parameters"]


def has_meta_tensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def init_hook(model: nn.Module) -> Optional[str]:
    """The init hook :func:`materialize_and_init` will call: ``"init_weights"``,
    ``"param_init_fn"``, or ``None`` when the (unwrapped) model defines neither."""
    inner = unwrap_model(model)
    for name in ("init_weights", "param_init_fn"):
        if callable(getattr(inner, name, None)):
            return name
    return None


def check_init_hook(model: nn.Module) -> None:
    """Refuse a meta model that cannot be initialised after sharding.

    Raises:
        ValueError: ``model`` has meta parameters or buffers and defines neither
            ``init_weights()`` nor ``param_init_fn(module)``.
    """
    if has_meta_tensors(model) and init_hook(model) is None:
        raise ValueError(
            f"The model ({type(unwrap_model(model)).__name__}) has parameters on the meta device "
            f"but defines neither init_weights() nor param_init_fn(module), so nothing can "
            f"initialise it after sharding. Define one of them on the model (see "
            f"cadence.parallel.param_init), build the model on the CPU instead, or let rank 0 "
            f"hold the real weights and set parallelism_config.fsdp.cpu_ram_efficient_loading: "
            f"true to broadcast them.")


def shared_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Groups of ``(module, attribute)`` that hold one parameter object (tied weights),
    only groups of two or more; taken before a conversion that may split them."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, name))
    return [group for group in holders.values() if len(group) > 1]


def retie_parameters(groups: list[list[tuple[nn.Module, str]]]) -> None:
    """Make every holder in each group of :func:`shared_parameters` hold its first
    holder's (current) parameter again."""
    for (first, first_name), *rest in groups:
        param = first._parameters[first_name]
        for module, name in rest:
            if module._parameters[name] is not param:
                module._parameters[name] = param


def _agreed_seed(seed: Optional[int]) -> int:
    """``seed``, or a draw from rank 0's torch RNG broadcast to every rank."""
    if seed is not None:
        return int(seed)
    drawn = [int(torch.randint(0, 2**62, (1,)).item())]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(drawn, src=0)
    return drawn[0]


class LayoutInvariantRandom(TorchDispatchMode):
    """In-place random fills of DTensors draw the full tensor and keep this rank's slice.

    Under this mode, an op tagged ``torch.Tag.nondeterministic_seeded`` that writes into a
    DTensor in place (``aten.normal_``, ``aten.uniform_``, ``aten.bernoulli_``, ...) is run
    on a plain tensor of the DTensor's global shape on its local device, and the local
    shard is overwritten with this rank's slice of it (``distribute_tensor(...,
    src_data_rank=None)``: no communication). Everything else runs unchanged. Each such
    op allocates one full tensor for its duration (the shard is copied from a view of it).

    Source: PyTorch ``TorchDispatchMode``; DTensor's random-op rule
    (``torch/distributed/tensor/_random.py``), here made independent of the generator.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else None
        if (isinstance(target, DTensor) and torch.Tag.nondeterministic_seeded in func.tags
                and func._schema.is_mutable):
            local = target._local_tensor
            full = torch.empty(target.shape, dtype=target.dtype, device=local.device)
            func(full, *args[1:], **kwargs)
            try:  # this rank's rectangle of the full tensor, copied from a view: no 2nd copy
                local, offsets = local_chunk(target)
                piece = full[tuple(slice(o, o + n) for o, n in zip(offsets, local.shape))]
            except ValueError:  # a layout that is not one rectangle per rank
                piece = distribute_tensor(full, target.device_mesh, target.placements,
                                          src_data_rank=None).to_local()
            local.copy_(piece)
            del full, piece
            return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Fork the CPU RNG (and ``device``'s, if an accelerator) and seed both with ``seed``."""
    devices = [device] if device.type not in ("cpu", "meta") else []
    device_type = device.type if devices else "cuda"
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        torch.manual_seed(seed)
        yield


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def materialize_and_init(model: nn.Module, device: torch.device | str,
                         seed: Optional[int] = None) -> None:
    """Allocate ``model``'s (sharded) meta tensors on ``device`` and initialise them with
    the model's init hook; a no-op for a model with no meta tensor.

    The contract with models (see the module docstring): after ``to_empty`` and re-tying,
    with every RNG seeded by one seed all ranks agree on and under
    :class:`LayoutInvariantRandom`, and with autograd off (``torch.no_grad``), call the
    unwrapped model's ``init_weights()`` if it has one, else its ``param_init_fn(module)``
    on every submodule, children first (the model itself last). The hook must leave every
    parameter and buffer initialised: ``to_empty`` leaves garbage (buffers included: keep
    a copy of buffers computed at construction, or recompute them). It may run
    collectives (every rank calls it at the same point). On a sharded model each
    parameter holds only this rank's shard; the hook writes into it in place.

    Every rank of a distributed run must call this together (the seed is agreed by a
    broadcast when ``seed`` is None; FSDP2's parameters are re-registered).

    Args:
        model: the model, sharded in place (FSDP2, TP) or whole, possibly inside DDP (not
            recommended: materialise before wrapping).
        device: where the shards are allocated (the mesh's device).
        seed: the init seed, the same on every rank; None: rank 0 draws one from its torch
            RNG and broadcasts it.

    Raises:
        ValueError: the model has meta tensors and no init hook (:func:`check_init_hook`).
    """
    if not has_meta_tensors(model):
        return
    check_init_hook(model)
    device = torch.device(device)
    ties = shared_parameters(model)
    model.to_empty(device=device)
    retie_parameters(ties)
    run_init_hook(model, device, seed)


def run_init_hook(model: nn.Module, device: torch.device | str,
                  seed: Optional[int] = None) -> None:
    """Step 2 of :func:`materialize_and_init` alone: the (unwrapped) model's init hook, with
    every RNG seeded by ``seed`` (agreed by all ranks when None), autograd off and under
    :class:`LayoutInvariantRandom`. A pipeline rank calls it on the whole model once its own
    stages are allocated (:mod:`cadence.parallel.pipeline`).

    Raises:
        ValueError: the model defines no init hook.
    """
    device = torch.device(device)
    inner = unwrap_model(model)
    if init_hook(model) is None:
        raise ValueError(f"{type(inner).__name__} defines neither init_weights() nor "
                         f"param_init_fn(module), so nothing can initialise it; define one "
                         f"(see cadence.parallel.param_init).")
    hook: Callable[..., Any]
    with _seeded(_agreed_seed(seed), device), torch.no_grad(), LayoutInvariantRandom():
        if init_hook(model) == "init_weights":
            inner.init_weights()  # type: ignore[operator]
        else:
            hook = inner.param_init_fn  # type: ignore[assignment]
            for module in list(_post_order(inner)):
                hook(module)
