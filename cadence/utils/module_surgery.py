"""Model surgery: swap submodules of a model by class, keeping its optimizers in step.

An algorithm that changes a model's architecture (e.g. swapping every ``nn.Linear`` for a
factorized one) walks the model with :func:`replace_module_classes`, handing each submodule
of a chosen class to a :data:`ReplacementFunction` that returns its replacement (or ``None``
to keep it). The replaced parameters leave the optimizers given and the new ones join the
parameter group the old ones were in (:func:`update_params_in_optimizer`), so the next
``optimizer.step()`` trains the new module.

Surgery is done on the plain model, before it is parallelized: cadence's Trainer runs
``Event.INIT`` (where algorithms do surgery) before it applies DDP / FSDP2 / TP, and a model
already wrapped or sharded is refused here.

Source: the API of Composer's ``composer.utils.module_surgery`` (names, arguments, the
returned ``{old: new}`` mapping, the optimizer update); implemented anew for cadence.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

__all__ = [
    "ReplacementFunction",
    "count_module_instances",
    "replace_module_classes",
    "update_params_in_optimizer",
]

log = logging.getLogger(__name__)

#: ``(module, module_index) -> Optional[nn.Module]``: given a submodule of the class it is
#: registered for and how many submodules of that class it was handed before in this walk
#: (0 for the first; see ``indices`` of :func:`replace_module_classes`), return the module
#: to put in its place, or ``None`` to leave it.
ReplacementFunction = Callable[[nn.Module, int], Optional[nn.Module]]

ModuleClasses = Union[type[nn.Module], tuple[type[nn.Module], ...]]
Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


def _as_optimizer_list(optimizers: Optional[Optimizers]) -> list[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)


def _refuse_wrapped(module: nn.Module) -> None:
    """Raise TypeError if ``module`` is already wrapped (DDP, FSDP) or sharded (FSDP2)."""
    from torch.nn.parallel import DistributedDataParallel

    wrappers: list[type] = [DistributedDataParallel]
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
        wrappers += [FSDPModule, FullyShardedDataParallel]
    except ImportError:  # torch without distributed support
        pass
    for path, sub in module.named_modules():
        if isinstance(sub, tuple(wrappers)):
            where = f"at {path!r}" if path else "at its root"
            raise TypeError(
                f"Cannot do surgery on a model that is already parallelized ({type(sub).__name__} "
                f"{where}): replace modules in the plain model, then wrap or shard it. In a "
                f"cadence run, do surgery at Event.INIT (an algorithm's apply), which runs "
                f"before the Trainer applies DDP / FSDP2 / TP.")


def _device_of(module: nn.Module) -> Optional[torch.device]:
    """The device of ``module``'s first parameter or buffer, or None when it has neither."""
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return None


def _register(module: nn.Module, pending: dict[nn.Module, list[tuple[nn.Module, str]]]) -> None:
    """Add every submodule below ``module`` to ``pending`` (depth first, parents before
    children) with the ``(parent, attribute name)`` pairs that hold it; a module held in
    several places is listed once, with all of them."""
    # ``named_children`` lists a module held under two names once; every slot is needed
    for name, child in module._modules.items():
        if child is None:
            continue
        first_sight = child not in pending
        if first_sight:
            pending[child] = []
        pending[child].append((module, name))
        if first_sight:
            _register(child, pending)


def replace_module_classes(
    module: nn.Module,
    policies: Mapping[type[nn.Module], ReplacementFunction],
    optimizers: Optional[Optimizers] = None,
    recurse_on_replacements: bool = False,
    indices: Optional[dict[Any, int]] = None,
) -> dict[nn.Module, nn.Module]:
    """Replace submodules of ``module`` in place, by class, as ``policies`` say.

    Every submodule below ``module`` (not ``module`` itself) is visited once, depth first in
    registration order, parents before their children. For each class in ``policies`` (in
    the mapping's order) that the submodule is an instance of, that class's
    :data:`ReplacementFunction` is called with the submodule and the class's running index;
    the first one to return a module replaces it: the new module is moved to the old one's
    device (or, for a module without parameters or buffers, to ``module``'s) and set on
    every parent that held the old one. The children of a replaced module are not visited
    (they are no longer in the model), and a replacement's own submodules are visited only
    with ``recurse_on_replacements``.

    Args:
        module: the model to modify (in place). Not yet wrapped or sharded.
        policies: module class -> :data:`ReplacementFunction`.
        optimizers: one or more optimizers over ``module``'s parameters; the parameters of
            the replaced modules are swapped for those of their replacements in them
            (:func:`update_params_in_optimizer`). None: create the optimizer after surgery.
        recurse_on_replacements: also visit each replacement and its submodules, so a
            module returned by one policy can itself be replaced (policies must then stop
            matching eventually, or this does not end).
        indices: class -> how many modules of that class the policies were handed so far;
            updated in place, so passing the same dict to several calls keeps counting
            across them. Default: every class in ``policies`` starts at 0.

    Returns:
        ``{old module: its replacement}`` for every replacement made, including those of
        replacements when recursing (``old -> intermediate`` and ``intermediate -> final``).

    Raises:
        TypeError: ``module`` is already parallelized (DDP, FSDP or FSDP2 found in it).
        RuntimeError: as :func:`update_params_in_optimizer`, when the optimizers cannot
            take the new parameters.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> swapped = replace_module_classes(
        ...     model, {nn.ReLU: lambda relu, index: nn.GELU()})
        >>> model[1]
        GELU(approximate='none')
    """
    _refuse_wrapped(module)
    counts: dict[Any, int] = indices if indices is not None else {cls: 0 for cls in policies}
    default_device = _device_of(module)
    pending: dict[nn.Module, list[tuple[nn.Module, str]]] = {}
    _register(module, pending)
    removed: set[nn.Module] = set()  # replaced modules and what lies only below them
    replaced: dict[nn.Module, nn.Module] = {}

    while pending:
        child = next(iter(pending))
        holders = [(parent, name) for parent, name in pending.pop(child) if parent not in removed]
        if not holders:  # only held by a module that was replaced: no longer in the model
            removed.add(child)
            continue
        for cls, policy in policies.items():
            if not isinstance(child, cls):
                continue
            index = counts.get(cls, 0)
            counts[cls] = index + 1
            new = policy(child, index)
            if new is None:
                continue
            device = _device_of(child)
            device = default_device if device is None else device
            if device is not None:
                new = new.to(device)
            for parent, name in holders:
                setattr(parent, name, new)
            replaced[child] = new
            removed.add(child)
            if recurse_on_replacements:
                pending[new] = list(holders)
                _register(new, pending)
            break

    opts = _as_optimizer_list(optimizers)
    if opts:
        for old, new in replaced.items():
            update_params_in_optimizer(old.parameters(), new.parameters(), opts)
    elif replaced:
        log.info("Replaced %d modules without an optimizer: create the optimizer after the "
                 "surgery, or add the new parameters to it.", len(replaced))
    return replaced


def count_module_instances(module: nn.Module, module_class: ModuleClasses) -> int:
    """How many distinct submodules below ``module`` (not counting ``module`` itself) are
    instances of ``module_class``; a module held in several places counts once.

    Args:
        module: the model to search.
        module_class: a module class, or a tuple of them (an instance of any counts).

    Returns:
        The number of matching submodules.

    Example:
        >>> from torch import nn
        >>> count_module_instances(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear)
        1
    """
    return sum(1 for sub in module.modules() if sub is not module and isinstance(sub, module_class))


def _position(param: torch.Tensor, optimizer: torch.optim.Optimizer) -> int:
    """Index of the parameter group of ``optimizer`` that holds ``param`` (by identity),
    or -1."""
    for i, group in enumerate(optimizer.param_groups):
        if any(p is param for p in group["params"]):
            return i
    return -1


def _without(params: Iterable[torch.Tensor], drop: list[torch.Tensor]) -> list[torch.Tensor]:
    """``params`` (in order) minus those in ``drop``, by identity."""
    dropped = {id(p) for p in drop}
    return [p for p in params if id(p) not in dropped]


def _target_group(optimizer: torch.optim.Optimizer, removed: list[torch.Tensor]) -> int:
    """The parameter group that takes the new parameters: the only one, or the one that held
    every removed parameter."""
    if len(optimizer.param_groups) == 1:
        return 0
    if not removed:
        raise RuntimeError(
            f"The optimizer ({type(optimizer).__name__}) has {len(optimizer.param_groups)} "
            f"parameter groups and no parameter was removed, so it is unclear which group the "
            f"new parameters belong to; add them yourself with optimizer.add_param_group().")
    groups = [_position(p, optimizer) for p in removed]
    if -1 in groups:
        missing = sum(1 for g in groups if g == -1)
        raise RuntimeError(
            f"{missing} of the {len(removed)} replaced parameters are not in the optimizer "
            f"({type(optimizer).__name__}, {len(optimizer.param_groups)} parameter groups), so "
            f"it is unclear which group the new parameters belong to. Pass the optimizer that "
            f"was built over this model's parameters, or build it after the surgery.")
    if len(set(groups)) > 1:
        raise RuntimeError(
            f"The replaced parameters were in parameter groups {sorted(set(groups))} of the "
            f"optimizer ({type(optimizer).__name__}), so it is unclear which group the new "
            f"parameters belong to. Replace modules whose parameters share one group, or "
            f"rebuild the optimizer after the surgery.")
    return groups[0]


def update_params_in_optimizer(
    old_params: Iterable[torch.nn.Parameter],
    new_params: Iterable[torch.nn.Parameter],
    optimizers: Optimizers,
) -> None:
    """Swap ``old_params`` for ``new_params`` in ``optimizers``.

    Parameters in both (the same tensor object) are left where they are. The others in
    ``old_params`` are removed from every parameter group, with their optimizer state
    (momentum, Adam moments...); the others in ``new_params`` are appended, in order, to the
    group that held the removed ones, with fresh state. The two need not have the same
    number or shapes of parameters (e.g. a ``[out, in]`` weight replaced by ``[out, r]`` and
    ``[r, in]`` factors).

    With several optimizers, the new parameters go to the optimizer that held the removed
    ones (Composer accepts only one optimizer here).

    Args:
        old_params: the parameters of the module that was replaced.
        new_params: the parameters of its replacement.
        optimizers: one optimizer or several.

    Raises:
        RuntimeError: where the new parameters go is ambiguous: the optimizer has several
            parameter groups and the removed parameters were in more than one of them, or
            in none (or, with several optimizers, in more than one optimizer, or in none).
    """
    opts = _as_optimizer_list(optimizers)
    old, new = list(old_params), list(new_params)
    removed = _without(old, new)
    added = _without(new, old)
    if not opts or (not removed and not added):
        return
    if len(opts) == 1:
        target = opts[0]
    else:
        holding = [o for o in opts if any(_position(p, o) >= 0 for p in removed)]
        if len(holding) != 1 and added:
            raise RuntimeError(
                f"The replaced parameters are in {len(holding)} of the {len(opts)} optimizers, "
                f"so it is unclear which one the new parameters belong to; replace modules "
                f"trained by one optimizer, or rebuild the optimizers after the surgery.")
        target = holding[0] if holding else opts[0]
    group = _target_group(target, removed) if added else -1
    for opt in opts:
        for p in removed:
            opt.state.pop(p, None)
        for g in opt.param_groups:
            g["params"] = _without(g["params"], removed)
    if added:
        fresh = [p for p in added if _position(p, target) < 0]
        target.param_groups[group]["params"].extend(fresh)
        log.debug("Added %d parameters to group %d of %s.", len(fresh), group,
                  type(target).__name__)
