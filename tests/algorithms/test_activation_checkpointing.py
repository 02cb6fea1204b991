"""Activation checkpointing: same loss and gradients, real recomputation, unchanged names,
selective (every n-th) blocks, CPU offload, less saved activation memory, FSDP2."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from cadence import Event
from cadence.algorithms import (
    ActivationCheckpointing, apply_activation_checkpointing, remove_activation_checkpointing,
)
from cadence.algorithms.activation_checkpointing import is_checkpointed
from cadence.parallel import plan_fsdp_units
from cadence.parallel.config import FSDPConfig
from tests.algorithms.algorithm_helpers import (
    CountingTokens, full, run_trainer, tiny_gpt, token_loader,
)
from tests.common.models import SimpleModel


def _batch(n: int = 4) -> dict[str, torch.Tensor]:
    ds = CountingTokens(n)
    return {"input_ids": ds.ids, "labels": ds.ids}


def _loss_and_grads(model: Any, seed: int = 5) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # same dropout masks in both models
    batch = _batch()
    loss = model.loss(model(batch), batch)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _count_calls(modules: list[torch.nn.Module]) -> list[int]:
    counts = [0] * len(modules)
    for i, module in enumerate(modules):
        def hook(*_: Any, i: int = i) -> None:
            counts[i] += 1
        module.register_forward_pre_hook(hook)
    return counts


@pytest.mark.parametrize("offload", [False, True])
def test_same_loss_and_gradients_as_without(offload: bool) -> None:
    plain = tiny_gpt(dropout=0.1)  # dropout: the recomputation must replay the RNG
    wrapped = copy.deepcopy(plain)
    done = apply_activation_checkpointing(wrapped, every_n=0 if offload else 1,
                                          offload_to_cpu=offload)
    assert len(done["offloaded" if offload else "checkpointed"]) == 2
    loss_a, grads_a = _loss_and_grads(plain)
    loss_b, grads_b = _loss_and_grads(wrapped)
    assert loss_a == loss_b
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=0, atol=0, msg=name)


def test_blocks_run_twice_per_step_with_checkpointing_once_without() -> None:
    def inner_calls(algorithms: list[Any]) -> list[int]:
        model = tiny_gpt()
        blocks = list(model.model.transformer.h)
        counts = _count_calls([b.mlp for b in blocks])  # inside the block: seen on recompute
        trainer = run_trainer(model, algorithms, steps=3)
        trainer.eval(token_loader(), subset_num_batches=1)  # no_grad: no recomputation
        return counts

    assert inner_calls([]) == [3 + 1, 3 + 1]
    assert inner_calls([ActivationCheckpointing()]) == [2 * 3 + 1, 2 * 3 + 1]


def test_state_dict_keys_class_names_and_fsdp_units_unchanged() -> None:
    model = tiny_gpt()
    keys = list(model.state_dict())
    units = [u.name for u in plan_fsdp_units(model, FSDPConfig())]
    done = apply_activation_checkpointing(model)
    assert done["checkpointed"] == ["model.transformer.h.0", "model.transformer.h.1"]
    assert list(model.state_dict()) == keys
    assert [type(b).__name__ for b in model.model.transformer.h] == ["GPT2Block"] * 2
    assert [u.name for u in plan_fsdp_units(model, FSDPConfig())] == units
    copy.deepcopy(model)(_batch())  # deep copies keep working (forward bound to the copy)
    assert remove_activation_checkpointing(model) == 2
    assert not any(is_checkpointed(m) for m in model.modules())


def test_every_n_and_layer_cls_select_blocks() -> None:
    model = tiny_gpt(n_layer=4)
    done = apply_activation_checkpointing(model, layer_cls=["GPT2Block"], every_n=2,
                                          offload_to_cpu=True)
    assert done == {"checkpointed": ["model.transformer.h.1", "model.transformer.h.3"],
                    "offloaded": ["model.transformer.h.0", "model.transformer.h.2"]}
    # nested selection: the outer module wins, its blocks are not wrapped again
    model = tiny_gpt()
    done = apply_activation_checkpointing(model, layer_cls=["GPT2Model", "GPT2Block"])
    assert done["checkpointed"] == ["model.transformer"]
    with pytest.raises(ValueError, match="NoSuchBlock"):
        apply_activation_checkpointing(tiny_gpt(), layer_cls=["NoSuchBlock"])
    with pytest.raises(ValueError, match="every_n"):
        ActivationCheckpointing(every_n=-1)


def test_model_without_blocks_is_left_alone_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    model = SimpleModel()
    algorithm = ActivationCheckpointing()
    with caplog.at_level(logging.WARNING, logger="cadence.algorithms.activation_checkpointing"):
        from cadence import State
        algorithm.apply(Event.INIT, State(model=model), None)
    assert "nothing is checkpointed" in caplog.text
    assert not any(is_checkpointed(m) for m in model.modules())


def _saved_bytes(model: Any) -> int:
    """Bytes of distinct storages autograd saves for backward in one forward, plus the
    inputs that checkpointed blocks keep for their recomputation."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    def keep_input(module: Any, args: tuple[Any, ...]) -> None:
        pack(args[0])

    for block in model.model.transformer.h:
        if is_checkpointed(block):
            block.register_forward_pre_hook(keep_input)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    batch = _batch(8)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(model(batch), batch)
    return sum(n for ptr, n in storages.items() if ptr not in params)


def test_checkpointing_saves_less_activation_memory() -> None:
    plain = tiny_gpt(n_layer=4)
    wrapped = copy.deepcopy(plain)
    apply_activation_checkpointing(wrapped)
    before, after = _saved_bytes(plain), _saved_bytes(wrapped)
    assert after < 0.5 * before, (before, after)


@pytest.mark.world_size(2)
def test_fsdp_same_losses_with_checkpointing() -> None:
    from cadence.loggers import InMemoryLogger

    def losses(algorithms: list[Any]) -> tuple[list[float], Any]:
        memory = InMemoryLogger()
        trainer = run_trainer(tiny_gpt(dropout=0.1), algorithms, steps=4, loggers=[memory],
                              log_interval="1ba", parallelism_config={"fsdp": {}})
        return [v for _, v in memory.data["loss/train/total"]], trainer

    reference, _ = losses([])
    checkpointed, trainer = losses([ActivationCheckpointing()])
    assert checkpointed == pytest.approx(reference, abs=1e-6)
    keys = list(trainer.state.model.state_dict())
    assert not any("_checkpoint_wrapped_module" in k for k in keys)
    assert all(torch.isfinite(full(p)).all() for p in trainer.state.model.parameters())
