"""Which modules become FSDP units: _fsdp_wrap > transformer_layer_cls > fsdp_wrap_fn >
min_num_params, children before parents, the root last."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from cadence import ComposerModel
from cadence.models.gpt import gpt2
from cadence.parallel import plan_fsdp_units
from cadence.parallel.config import parse_parallelism_config


def fsdp(**kwargs: Any):  # type: ignore[no-untyped-def]
    cfg = parse_parallelism_config({"fsdp": kwargs}).fsdp
    assert cfg is not None
    return cfg


class Stack(ComposerModel):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)          # 1,600 params
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))  # 272 each
        self.head = nn.Linear(16, 100)               # 1,700

    def forward(self, batch: Any) -> torch.Tensor:
        x = self.embed(batch)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        return outputs.mean()


def names(model: nn.Module, **kwargs: Any) -> list[str]:
    return [u.name for u in plan_fsdp_units(model, fsdp(**kwargs))]


def test_hf_model_defaults_to_its_no_split_modules() -> None:
    model = gpt2(n_layer=3, n_head=2, n_embd=16, vocab_size=50, max_seq_len=8)
    assert names(model) == [f"model.transformer.h.{i}" for i in range(3)]
    assert names(model, auto_wrap=False) == []


def test_transformer_layer_cls_from_the_config_beats_the_model_default() -> None:
    model = gpt2(n_layer=2, n_head=2, n_embd=16, vocab_size=50, max_seq_len=8)
    assert names(model, transformer_layer_cls=["GPT2MLP"]) == [
        "model.transformer.h.0.mlp", "model.transformer.h.1.mlp"]
    with pytest.raises(ValueError, match="does not contain"):
        names(model, transformer_layer_cls=["LlamaDecoderLayer"])


def test_fsdp_wrap_attribute_beats_everything_and_kwargs_pass_through() -> None:
    model = Stack()
    model.blocks[1]._fsdp_wrap = True  # type: ignore[assignment]
    model.fsdp_wrap_fn = lambda m: {"reshard_after_forward": False} if m is model.head else False
    units = plan_fsdp_units(model, fsdp())
    assert [u.name for u in units] == ["blocks.1", "head"]
    assert units[1].kwargs == {"reshard_after_forward": False}
    model.fsdp_wrap_fn = lambda m: {"bogus": 1} if m is model.head else False
    with pytest.raises(ValueError, match="fully_shard takes"):
        plan_fsdp_units(model, fsdp())


def test_size_based_wrapping_counts_params_not_already_in_a_unit() -> None:
    model = Stack()
    assert names(model, min_num_params=1000) == ["embed", "head"]
    assert names(model, min_num_params=800) == ["embed", "blocks", "head"]  # 3 x 272
