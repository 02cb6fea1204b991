"""``cadence.utils.module_surgery``: modules are really swapped in the model, counted,
indexed and recursed into as asked, and the optimizer steps the new parameters."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import nn

from cadence.utils import module_surgery
from cadence.utils.module_surgery import (
    count_module_instances,
    replace_module_classes,
    update_params_in_optimizer,
)


class Scaled(nn.Module):
    """``x [batch, in] -> [batch, out]``: a Linear without bias times a learned scalar (its
    parameters differ from the Linear's in number and shape)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.randn(out_features, in_features))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * (x @ self.weight.T)


class Nest(nn.Linear):
    """A Linear holding a smaller Linear (so recursion has something to find)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.inner = nn.Linear(in_features, out_features - 1)


def to_scaled(module: nn.Module, index: int) -> Optional[nn.Module]:
    assert isinstance(module, nn.Linear)
    return Scaled(module.in_features, module.out_features)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def in_optimizer(param: torch.Tensor, opt: torch.optim.Optimizer) -> bool:
    return any(p is param for group in opt.param_groups for p in group["params"])


def test_replaced_linear_is_swapped_and_the_optimizer_steps_the_new_parameters() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = [model[0], model[2]]
    swapped = replace_module_classes(model, {nn.Linear: to_scaled}, optimizers=opt)

    assert list(swapped) == old and [swapped[m] for m in old] == [model[0], model[2]]
    assert all(type(model[i]) is Scaled for i in (0, 2))
    for module in old:
        assert not any(in_optimizer(p, opt) for p in module.parameters())
    params = opt.param_groups[0]["params"]
    assert {id(p) for p in params} == {id(p) for p in model.parameters()}
    assert len(params) == len({id(p) for p in params})  # nothing listed twice

    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(5, 4)).square().sum().backward()
    opt.step()
    after = list(model.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, after))  # every new param moved


def test_shape_changing_replacement_drops_the_old_state_and_adam_steps() -> None:
    """Adam's moments of a removed parameter go with it; the new parameters, of other
    shapes, start fresh and step."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    old_weight = model[0].weight
    assert old_weight in opt.state
    replace_module_classes(model, {nn.Linear: to_scaled}, optimizers=opt)
    assert old_weight not in opt.state and len(opt.state) == 0  # all Linear params replaced
    opt.zero_grad()
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    assert model[0].scale in opt.state and opt.state[model[0].scale]["exp_avg"].shape == (1,)


def test_shared_parameters_stay_and_unshared_ones_are_swapped() -> None:
    """A replacement that keeps the old bias object: the bias stays in the optimizer once,
    the new weight replaces the old."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = model[2]

    def copy(linear: nn.Module, index: int) -> nn.Module:
        new = nn.Linear(linear.in_features, linear.out_features)
        new.bias = linear.bias
        return new

    replace_module_classes(model, {nn.Linear: lambda m, i: copy(m, i) if i == 1 else None},
                           optimizers=opt)
    assert model[2] is not old and model[2].bias is old.bias
    assert in_optimizer(old.bias, opt) and not in_optimizer(old.weight, opt)
    assert in_optimizer(model[2].weight, opt)
    assert len(opt.param_groups[0]["params"]) == 4


def test_indices_count_each_class_and_carry_across_calls() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.Linear(2, 2))
    seen: list[int] = []

    def second_only(module: nn.Module, index: int) -> Optional[nn.Module]:
        seen.append(index)
        return nn.Identity() if index == 1 else None

    swapped = replace_module_classes(model, {nn.Linear: second_only})
    assert seen == [0, 1, 2] and len(swapped) == 1
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Identity, nn.Linear]

    indices = {nn.Linear: 5}
    replace_module_classes(model, {nn.Linear: second_only}, indices=indices)
    assert seen[3:] == [5, 6] and indices == {nn.Linear: 7}


def test_policies_apply_in_order_and_unmatched_classes_are_never_called() -> None:
    model = mlp()

    def never(module: nn.Module, index: int) -> Optional[nn.Module]:
        raise AssertionError("no Conv2d in the model")

    calls: list[str] = []

    def first(module: nn.Module, index: int) -> Optional[nn.Module]:
        calls.append("first")
        return None

    def second(module: nn.Module, index: int) -> Optional[nn.Module]:
        calls.append("second")
        return nn.Identity()

    swapped = replace_module_classes(model, {nn.Conv2d: never, nn.ReLU: first,
                                             nn.Module: second})
    assert calls[:2] == ["second", "first"]  # Linear (only nn.Module matches), then ReLU
    assert all(type(m) is nn.Identity for m in model) and len(swapped) == 3


@pytest.mark.parametrize("recurse", [False, True])
def test_recursion_off_and_on(recurse: bool) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(4, 2))

    def nest(module: nn.Module, index: int) -> Optional[nn.Module]:
        if type(module) is nn.Linear and module.out_features in (3, 2):
            return Nest(module.in_features, module.out_features)
        return None

    swapped = replace_module_classes(model, {nn.Linear: nest}, recurse_on_replacements=recurse)
    assert type(model[0]) is Nest and type(model[1]) is Nest
    if recurse:  # Nest(4, 3).inner is Linear(4, 2): replaced too; its inner Linear(4, 1) not
        assert type(model[0].inner) is Nest and type(model[0].inner.inner) is nn.Linear
        assert type(model[1].inner) is nn.Linear  # Linear(4, 1)
        assert len(swapped) == 3
    else:
        assert type(model[0].inner) is nn.Linear and len(swapped) == 2


def test_children_of_a_replaced_module_are_not_visited() -> None:
    """The Linear inside a replaced block is no longer in the model: no policy runs on it,
    and no parameter of it reaches the optimizer."""
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    swapped = replace_module_classes(
        model, {nn.Sequential: lambda m, i: nn.Identity(), nn.Linear: to_scaled}, optimizers=opt)
    assert type(model[0]) is nn.Identity and type(model[1]) is Scaled and len(swapped) == 2
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in model.parameters()}


def test_a_module_held_twice_is_replaced_everywhere_once() -> None:
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    swapped = replace_module_classes(model, {nn.Linear: to_scaled})
    assert len(swapped) == 1 and model[0] is model[2] and type(model[0]) is Scaled
    assert count_module_instances(nn.Sequential(shared, shared), nn.Linear) == 1


def test_replacement_is_moved_to_the_device_of_the_module_it_replaces() -> None:
    meta_model = nn.Sequential(nn.Linear(2, 2, device="meta"), nn.ReLU())
    replace_module_classes(meta_model, {nn.Linear: to_scaled, nn.ReLU: lambda m, i: nn.GELU()})
    assert meta_model[0].weight.device.type == "meta" and type(meta_model[1]) is nn.GELU


def test_count_module_instances() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.ReLU())
    assert count_module_instances(model, nn.Linear) == 2
    assert count_module_instances(model, (nn.Linear, nn.ReLU)) == 4
    assert count_module_instances(model, nn.Sequential) == 1  # the root is not counted
    assert count_module_instances(model, nn.Conv2d) == 0


def test_new_parameters_join_the_group_of_the_removed_ones() -> None:
    model = mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": model[2].parameters(), "lr": 0.5}], lr=0.1)
    replace_module_classes(model, {nn.Linear: lambda m, i: to_scaled(m, i) if i == 1 else None},
                           optimizers=opt)
    assert {id(p) for p in opt.param_groups[1]["params"]} == {id(p) for p in model[2].parameters()}
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in model[0].parameters()}


def test_ambiguous_parameter_groups_raise_a_clear_error() -> None:
    """A module whose parameters are split over two groups: where its replacement's go is
    unclear (Composer raises here too)."""
    model = mlp()
    opt = torch.optim.SGD([{"params": [model[0].weight]},
                           {"params": [model[0].bias, *model[2].parameters()]}], lr=0.1)
    with pytest.raises(RuntimeError, match=r"parameter groups \[0, 1\].*unclear"):
        replace_module_classes(model, {nn.Linear: lambda m, i: to_scaled(m, i) if i == 0
                                       else None}, optimizers=opt)


def test_parameters_missing_from_the_optimizer_raise_with_several_groups() -> None:
    model = mlp()
    other = mlp()
    opt = torch.optim.SGD([{"params": [other[0].weight]}, {"params": [other[0].bias]}], lr=0.1)
    with pytest.raises(RuntimeError, match="not in the optimizer"):
        update_params_in_optimizer(model[0].parameters(), to_scaled(model[0], 0).parameters(), opt)


def test_several_optimizers_the_one_holding_the_module_gets_the_new_parameters() -> None:
    model = mlp()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters(), lr=0.1)
    replace_module_classes(model, {nn.Linear: to_scaled}, optimizers=[first, second])
    assert {id(p) for p in first.param_groups[0]["params"]} == {
        id(p) for p in model[0].parameters()}
    assert {id(p) for p in second.param_groups[0]["params"]} == {
        id(p) for p in model[2].parameters()}


def test_surgery_on_a_parallelized_model_is_refused() -> None:
    from torch.distributed.fsdp import FSDPModule

    model = nn.Sequential(nn.Linear(2, 2))
    # what fully_shard does to a module: its class becomes FSDP<class>(FSDPModule, class)
    model[0].__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
    with pytest.raises(TypeError, match="already parallelized"):
        replace_module_classes(model, {nn.Linear: to_scaled})


def test_public_names() -> None:
    assert set(module_surgery.__all__) == {"ReplacementFunction", "replace_module_classes",
                                           "count_module_instances", "update_params_in_optimizer"}
