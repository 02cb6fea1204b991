"""GatedLinearUnits (Shazeer 2020): BERT's feed-forward blocks become
``LayerNorm(W_o (act(x W_g) * x W_n) + x)`` with the expected shapes and parameter count, and
a BERT trains with them through the Trainer, in one process and on 2 FSDP2 ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForMaskedLM
from transformers.activations import ACT2FN
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput

from cadence import Callback, State, dist
from cadence.algorithms import GatedLinearUnits, apply_gated_linear_units
from cadence.algorithms.gated_linear_units.gated_linear_units import BERTGatedFFOutput
from cadence.algorithms.warnings import NoEffectWarning
from cadence.models import HuggingFaceModel
from tests.algorithms.algorithm_helpers import SEQ, VOCAB, run_trainer, tiny_gpt

D, FF, LAYERS = 32, 64, 2


def tiny_bert(seed: int = 0, hidden_act: str = "gelu") -> HuggingFaceModel:
    """A 2-layer BERT MLM; untied embeddings (cadence's FSDP2 plan refuses BERT's tied
    decoder, which lives outside the encoder blocks)."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS,
                        num_attention_heads=2, intermediate_size=FF, max_position_embeddings=SEQ,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        hidden_act=hidden_act, tie_word_embeddings=False)
    return HuggingFaceModel(BertForMaskedLM(config))


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_surgery_shapes_and_parameter_count() -> None:
    model = tiny_bert()
    before = _count(model)
    optimizer = torch.optim.AdamW(model.parameters())
    apply_gated_linear_units(model, optimizer)
    layer = model.model.bert.encoder.layer[0]
    assert not any(isinstance(m, (BertIntermediate, BertOutput)) for m in model.modules())
    ffn = layer.output
    assert isinstance(ffn, BERTGatedFFOutput)
    assert ffn.gated_layer.weight.shape == (FF, D) and ffn.gated_layer.bias is None
    assert ffn.non_gated_layer.weight.shape == (FF, D) and ffn.non_gated_layer.bias is None
    assert ffn.wo.weight.shape == (D, FF) and ffn.wo.bias is not None
    assert type(ffn.act) is type(ACT2FN["gelu"])  # the model's own activation
    # per layer: + one [FF, D] matrix, - the intermediate's bias [FF]
    assert _count(model) == before + LAYERS * (D * FF - FF)
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters()}
    out = model({"input_ids": torch.randint(0, VOCAB, (2, SEQ))}).logits
    assert out.shape == (2, SEQ, VOCAB)


def test_gated_block_computes_the_glu_formula() -> None:
    torch.manual_seed(0)
    block = BERTGatedFFOutput(D, FF, 0.0, torch.nn.functional.silu, 1e-12,
                              gated_layer_bias=True, non_gated_layer_bias=True)
    x, residual = torch.randn(3, 5, D), torch.randn(3, 5, D)
    w_g, b_g = block.gated_layer.weight, block.gated_layer.bias
    w_n, b_n = block.non_gated_layer.weight, block.non_gated_layer.bias
    hidden = torch.nn.functional.silu(x @ w_g.T + b_g) * (x @ w_n.T + b_n)
    expected = torch.nn.functional.layer_norm(hidden @ block.wo.weight.T + block.wo.bias
                                              + residual, (D,), eps=1e-12)
    torch.testing.assert_close(block(x, residual), expected)


def test_act_fn_choices_and_refusals() -> None:
    model = tiny_bert()
    apply_gated_linear_units(model, act_fn="relu")
    assert isinstance(model.model.bert.encoder.layer[1].output.act, nn.ReLU)
    with pytest.warns(NoEffectWarning, match="applied already"):
        apply_gated_linear_units(model)
    mixed = tiny_bert()
    mixed.model.bert.encoder.layer[0].intermediate.intermediate_act_fn = nn.ReLU()
    with pytest.raises(ValueError, match="different activations.*pass act_fn"):
        apply_gated_linear_units(mixed)
    with pytest.raises(ValueError, match="act_fn='swishy' is not a transformers activation"):
        GatedLinearUnits(act_fn="swishy")
    with pytest.raises(TypeError, match="GPT2LMHeadModel is not a transformers BertPreTrained"):
        apply_gated_linear_units(tiny_gpt())


class Losses(Callback):
    """The batch loss (mean over ranks) after each step."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        loss = state.loss.detach().clone()
        dist.all_reduce(loss)
        self.values.append(float(loss) / dist.get_world_size())


def test_trainer_applies_glu_at_init_and_trains() -> None:
    model, losses = tiny_bert(), Losses()
    run_trainer(model, [GatedLinearUnits()], steps=6, callbacks=[losses])
    assert all(isinstance(layer.output, BERTGatedFFOutput)
               for layer in model.model.bert.encoder.layer)
    assert losses.values[-1] < losses.values[0] - 0.5


@pytest.fixture(scope="module")
def single_process_losses() -> list[float]:
    losses = Losses()
    run_trainer(tiny_bert(), [GatedLinearUnits()], steps=3, callbacks=[losses])
    return losses.values


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_fsdp_glu_matches_one_process(single_process_losses: list[float]) -> None:
    losses = Losses()
    trainer = run_trainer(tiny_bert(), [GatedLinearUnits()], steps=3, callbacks=[losses],
                          parallelism_config={"fsdp": {}})
    layers = trainer.state.model.model.bert.encoder.layer
    assert all(isinstance(layer.output, BERTGatedFFOutput) for layer in layers)
    assert losses.values == pytest.approx(single_process_losses, rel=1e-4)
