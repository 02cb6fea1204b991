"""ALiBi (Press et al. 2022): the bias is the paper's ``-m_h (i - j)`` with ``m_h = 2^(-8h/H)``,
GPT-2 and BERT still run after surgery (eager and SDPA agree), a model trained on short
sequences evaluates on longer ones, and the algorithm reshapes training batches, in one
process and on 2 FSDP2 ranks."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM

from cadence import Callback, State, dist
from cadence.algorithms import Alibi, apply_alibi
from cadence.algorithms.alibi.attention_surgery_functions.utils import (
    BertAlibiSelfAttention,
    GPT2AlibiAttention,
    RobertaAlibiSelfAttention,
    ZeroPositionEmbedding,
    get_alibi_head_slopes,
)
from cadence.config.load import ConfigError, load_config
from cadence.models import HuggingFaceModel
from cadence.models.gpt import gpt2
from tests.algorithms.algorithm_helpers import SEQ, VOCAB, CountingTokens, run_trainer, tiny_gpt
from tests.common.models import SimpleModel


def paper_bias(n_heads: int, length: int, causal: bool) -> torch.Tensor:
    """``[H, L, L]``: ``-m_h * (i - j)`` (``|i - j|`` if not causal), ``m_h = 2^(-8h/H)``;
    causal entries above the diagonal are ``-inf``."""
    slopes = torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)])
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    distance = (i - j).float() if causal else (i - j).abs().float()
    bias = -slopes[:, None, None] * distance
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
    return bias


def test_slopes_are_the_papers_geometric_sequence() -> None:
    assert get_alibi_head_slopes(8) == pytest.approx([2.0 ** -h for h in range(1, 9)])
    assert get_alibi_head_slopes(4) == pytest.approx([2.0 ** (-2 * h) for h in range(1, 5)])
    # 6 heads: the 4-head slopes, then every other slope of the 8-head sequence
    assert get_alibi_head_slopes(6) == pytest.approx(
        [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])
    with pytest.raises(ValueError, match="n_heads"):
        get_alibi_head_slopes(0)


def _gpt(attn: str = "eager", heads: int = 4) -> Any:
    torch.manual_seed(0)
    return gpt2(n_layer=2, n_head=heads, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ,
                attn_implementation=attn)


def _bert(attn: str = "eager") -> HuggingFaceModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=SEQ,
                        attn_implementation=attn)
    return HuggingFaceModel(BertForMaskedLM(config))


def _roberta(attn: str = "eager") -> HuggingFaceModel:
    torch.manual_seed(0)
    # RoBERTa's positions start after padding_idx (1): SEQ tokens need SEQ + 2 rows
    config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64, pad_token_id=1,
                           max_position_embeddings=SEQ + 2, attn_implementation=attn)
    return HuggingFaceModel(RobertaForMaskedLM(config))


def test_roberta_gets_bert_style_alibi_and_runs_beyond_its_positions() -> None:
    model = _roberta("sdpa")
    apply_alibi(model, max_sequence_length=3 * SEQ)
    model.eval()
    inner = model.model.roberta
    assert all(isinstance(layer.attention.self, RobertaAlibiSelfAttention)
               for layer in inner.encoder.layer)
    assert isinstance(inner.embeddings.position_embeddings, ZeroPositionEmbedding)
    ids = torch.randint(2, VOCAB, (2, 3 * SEQ))  # 3x its position table; no padding id
    logits = model({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).logits
    assert logits.shape == (2, 3 * SEQ, VOCAB) and torch.isfinite(logits).all()
    eager = _roberta("eager")
    apply_alibi(eager, max_sequence_length=3 * SEQ)
    eager.eval()
    torch.testing.assert_close(eager({"input_ids": ids}).logits, logits, atol=1e-5, rtol=1e-4)


def test_gpt2_attention_logits_carry_the_papers_bias() -> None:
    model = _gpt("eager")
    apply_alibi(model, max_sequence_length=32)
    attn = model.model.transformer.h[0].attn
    assert isinstance(attn, GPT2AlibiAttention)
    hidden = torch.randn(2, 10, 32)
    _, weights = attn(hidden)
    q, k, _ = attn.c_attn(hidden).split(32, dim=2)
    q = q.view(2, 10, 4, 8).transpose(1, 2)
    k = k.view(2, 10, 4, 8).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) / math.sqrt(8) + paper_bias(4, 10, causal=True)
    torch.testing.assert_close(weights, logits.softmax(-1), atol=1e-6, rtol=1e-5)


def test_bert_bias_is_symmetric_and_respects_padding() -> None:
    model = _bert("eager")
    apply_alibi(model, max_sequence_length=32)
    model.eval()  # no attention dropout
    attn = model.model.bert.encoder.layer[0].attention.self
    assert isinstance(attn, BertAlibiSelfAttention)
    hidden = torch.randn(1, 6, 32)
    pad = torch.zeros(1, 1, 6, 6)
    pad[..., 4:] = torch.finfo(torch.float32).min  # the last two keys are padding
    _, weights = attn(hidden, attention_mask=pad)
    q = attn.query(hidden).view(1, 6, 4, 8).transpose(1, 2)
    k = attn.key(hidden).view(1, 6, 4, 8).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) / math.sqrt(8) + paper_bias(4, 6, causal=False)
    logits[..., 4:] = float("-inf")
    torch.testing.assert_close(weights, logits.softmax(-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("build", [_gpt, _bert], ids=["gpt2", "bert"])
def test_eager_and_sdpa_agree_after_surgery_beyond_the_original_length(build: Any) -> None:
    eager, sdpa = build("eager"), build("sdpa")
    for model in (eager, sdpa):
        apply_alibi(model, max_sequence_length=3 * SEQ)
        model.eval()
    ids = torch.randint(0, VOCAB, (2, 3 * SEQ))  # 3x the position table it was built with
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    out_eager, out_sdpa = eager(batch).logits, sdpa(batch).logits
    assert out_eager.shape == (2, 3 * SEQ, VOCAB)
    torch.testing.assert_close(out_eager[0], out_sdpa[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_eager[1, :-5], out_sdpa[1, :-5], atol=1e-5, rtol=1e-4)


def test_surgery_removes_positions_keeps_keys_and_updates_the_optimizer() -> None:
    model = _gpt("sdpa")
    keys = set(model.state_dict())
    old_wpe = model.model.transformer.wpe.weight
    optimizer = torch.optim.AdamW(model.parameters())
    apply_alibi(model, max_sequence_length=64, optimizers=optimizer)
    wpe = model.model.transformer.wpe
    assert isinstance(wpe, ZeroPositionEmbedding) and wpe.weight.shape == (64, 32)
    assert not wpe.weight.requires_grad and not wpe.weight.any()
    assert model.model.config.n_positions == 64
    assert set(model.state_dict()) == keys  # same keys: attention params are shared
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert id(old_wpe) not in in_optimizer
    with pytest.raises(ValueError, match="max_sequence_length=64"):
        model({"input_ids": torch.zeros(1, 65, dtype=torch.long)})


def test_a_model_without_a_policy_is_refused_naming_its_type() -> None:
    with pytest.raises(TypeError, match="SimpleModel has no ALiBi policy.*GPT2Attention"):
        apply_alibi(SimpleModel(), max_sequence_length=8)
    flex = _gpt("sdpa")
    flex.model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='flex_attention'.*'sdpa' or 'eager'"):
        apply_alibi(flex, max_sequence_length=8)
    with pytest.raises(ValueError, match="max_sequence_length must be a positive integer"):
        Alibi(max_sequence_length=0)
    with pytest.raises(ValueError, match=r"train_sequence_length_scaling must be in \(0, 1\]"):
        Alibi(max_sequence_length=8, train_sequence_length_scaling=1.5)


class Shapes(Callback):
    """The training batch's ``input_ids`` shape just before each forward."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def before_forward(self, state: State, logger: Any) -> None:
        self.shapes.append(tuple(state.batch["input_ids"].shape))


def _loss(model: Any, length: int) -> float:
    """Mean next-token loss on counting sequences of ``length`` tokens (longer than SEQ
    when ``length > SEQ``)."""
    starts = torch.arange(0, VOCAB, 8)[:, None]
    ids = (starts + torch.arange(length)) % VOCAB
    model.eval()
    with torch.no_grad():
        return float(model.loss(model({"input_ids": ids, "labels": ids}),
                                {"input_ids": ids, "labels": ids}))


def test_trainer_trains_short_and_evaluates_long() -> None:
    """Half-length training rows ([8, 16] -> [16, 8]); afterwards the model predicts
    counting sequences 8x longer than it saw as well as short ones."""
    model, shapes = tiny_gpt(), Shapes()
    untrained = copy.deepcopy(model)
    apply_alibi(untrained, max_sequence_length=4 * SEQ)
    before = _loss(untrained, 4 * SEQ)
    run_trainer(model, [Alibi(max_sequence_length=4 * SEQ, train_sequence_length_scaling=0.5)],
                steps=8, callbacks=[shapes])
    assert isinstance(model.model.transformer.h[1].attn, GPT2AlibiAttention)
    assert shapes.shapes == [(16, SEQ // 2)] * 8
    short, long = _loss(model, SEQ // 2), _loss(model, 4 * SEQ)
    assert long < before - 1.0  # it learned (untrained: ln 64 = 4.16)
    assert long < short + 0.05  # and 64-token sequences are no harder than 8-token ones


def test_a_batch_value_that_is_not_a_sequence_is_refused_by_key() -> None:
    class Labelled(CountingTokens):
        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {**super().__getitem__(index), "label": torch.tensor(0)}

    loader = torch.utils.data.DataLoader(Labelled(8), batch_size=4)
    with pytest.raises(ValueError, match=r"AFTER_DATALOADER.*'label' is \(4,\)"):
        run_trainer(tiny_gpt(), [Alibi(max_sequence_length=SEQ)], steps=1,
                    train_dataloader=loader)


def tiny_loader(batch_size: int) -> Any:
    return torch.utils.data.DataLoader(CountingTokens(8), batch_size=batch_size)


RUN = {
    "max_duration": "1ba", "global_train_batch_size": 4, "progress_bar": False,
    "model": {"name": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": VOCAB,
              "max_seq_len": SEQ},
    "train_loader": {"name": "tests.algorithms.test_alibi.tiny_loader"},
}


def test_run_file_names_alibi_and_its_arguments_are_checked() -> None:
    cfg = load_config({**RUN, "algorithms": {"alibi": {"max_sequence_length": 64}}})
    assert cfg.algorithms == {"alibi": {"max_sequence_length": 64}}
    with pytest.raises(ConfigError, match=r"algorithms\.alibi.*max_seq_len"):
        load_config({**RUN, "algorithms": {"alibi": {"max_seq_len": 64}}})
    with pytest.raises(ConfigError, match="max_sequence_length must be a positive integer"):
        load_config({**RUN, "algorithms": {"alibi": {"max_sequence_length": 0}}})


@pytest.fixture(scope="module")
def single_process_losses() -> list[float]:
    losses = _Losses()
    run_trainer(tiny_gpt(), [Alibi(max_sequence_length=SEQ, train_sequence_length_scaling=0.5)],
                steps=4, callbacks=[losses])
    return losses.values


class _Losses(Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        loss = state.loss.detach().clone()  # this rank's; the mean over ranks is the batch's
        dist.all_reduce(loss)
        self.values.append(float(loss) / dist.get_world_size())


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_fsdp_alibi_matches_one_process(single_process_losses: list[float]) -> None:
    losses = _Losses()
    trainer = run_trainer(tiny_gpt(), [Alibi(max_sequence_length=SEQ,
                                             train_sequence_length_scaling=0.5)],
                          steps=4, callbacks=[losses], parallelism_config={"fsdp": {}})
    blocks = trainer.state.model.model.transformer.h
    assert all(isinstance(block.attn, GPT2AlibiAttention) for block in blocks)
    assert losses.values == pytest.approx(single_process_losses, rel=1e-4)
    assert losses.values[-1] < losses.values[0]
    # surgery after sharding is refused, naming where the model is sharded
    with pytest.raises(TypeError, match="already parallelized.*at "):
        apply_alibi(trainer.state.model, max_sequence_length=2 * SEQ)
