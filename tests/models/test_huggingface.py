"""HuggingFaceModel on a tiny GPT-2 (and a recording module for the key filtering)."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from cadence.models import (
    ComposerModel,
    HuggingFaceModel,
    LanguageCrossEntropy,
    LanguagePerplexity,
    is_causal_lm,
    is_sequence_classifier,
)

VOCAB, SEQ = 64, 8


def tiny_gpt2(**overrides: Any) -> GPT2LMHeadModel:
    kwargs: dict[str, Any] = dict(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2,
                                  n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=None, eos_token_id=None, use_cache=False,
                                  attn_implementation="eager")
    kwargs.update(overrides)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**kwargs))
    model.loss_type = "ForCausalLM"
    return model


def tiny_bert_classifier(num_labels: int = 3) -> BertForSequenceClassification:
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16,
                        num_labels=num_labels, attn_implementation="eager")
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def lm_batch(with_labels: bool = True) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (2, SEQ))
    attention_mask = torch.ones(2, SEQ, dtype=torch.long)
    attention_mask[1, -3:] = 0
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_labels:
        labels = input_ids.clone()
        labels[attention_mask == 0] = -100
        batch["labels"] = labels
    return batch


class Recorder(nn.Module):
    """A model whose forward names two inputs and records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1, 1)
        self.seen: Optional[set[str]] = None

    def forward(self, input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None,
                **kwargs: Any) -> dict[str, torch.Tensor]:
        self.seen = {"input_ids", *([] if labels is None else ["labels"]), *kwargs}
        return {"logits": self.proj(input_ids.float().unsqueeze(-1))}


def test_is_a_composer_model_and_exposes_parts() -> None:
    inner = tiny_gpt2()
    tokenizer = _FakeTokenizer(VOCAB)
    model = HuggingFaceModel(inner, tokenizer=tokenizer)
    assert isinstance(model, ComposerModel)
    assert model.model is inner and model.tokenizer is tokenizer and model.config is inner.config
    assert model.shift_labels is True


def test_forward_passes_only_accepted_keys() -> None:
    inner = Recorder()
    model = HuggingFaceModel(inner)
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "sample_id": torch.arange(2),
             "text": ["a", "b"]}
    model(batch)
    assert inner.seen == {"input_ids"}


def test_forward_with_extra_key_on_gpt2() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    batch = lm_batch()
    batch["sample_id"] = torch.arange(2)
    out = model(batch)
    assert out["logits"].shape == (2, SEQ, VOCAB)
    assert torch.isfinite(model.loss(out, batch))


def test_forward_rejects_non_dict_batch() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    with pytest.raises(TypeError, match="dict batch"):
        model((torch.zeros(2, 3, dtype=torch.long),))


def test_loss_is_shifted_cross_entropy() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    batch = lm_batch()
    out = model(batch)
    logits = out["logits"]                                    # [batch, seq, vocab]
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                               batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(model.loss(out, batch), expected)


def test_loss_without_labels_names_the_fix() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    batch = lm_batch(with_labels=False)
    with pytest.raises(ValueError, match=r"'labels'.*-100"):
        model.loss(model(batch), batch)


def test_eval_forward_returns_logits_and_reuses_outputs() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    batch = lm_batch()
    out = model(batch)
    assert model.eval_forward(batch, out) is out["logits"]
    torch.testing.assert_close(model.eval_forward(batch), out["logits"])


def test_lm_metric_update_matches_model_loss() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    batch = lm_batch()
    out = model(batch)
    metrics = model.get_metrics(is_train=False)
    for metric in metrics.values():
        model.update_metric(batch, model.eval_forward(batch, out), metric)
    loss = model.loss(out, batch).item()
    assert metrics["LanguageCrossEntropy"].compute().item() == pytest.approx(loss, abs=1e-5)
    assert metrics["LanguagePerplexity"].compute().item() == pytest.approx(
        torch.tensor(loss).exp().item(), rel=1e-5)
    # 7 + 4 next-token targets (seq - 1 per row, minus 3 padded ones in row 1).
    assert int(metrics["LanguageCrossEntropy"].total_items) == 11


def test_default_metrics_causal_lm() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    eval_metrics = model.get_metrics(is_train=False)
    assert set(eval_metrics) == {"LanguageCrossEntropy", "LanguagePerplexity"}
    assert type(eval_metrics["LanguagePerplexity"]) is LanguagePerplexity
    assert model.get_metrics(is_train=True) == {}


def test_default_metrics_classifier() -> None:
    inner = tiny_bert_classifier(num_labels=3)
    assert is_sequence_classifier(inner) and not is_causal_lm(inner)
    model = HuggingFaceModel(inner)
    assert model.shift_labels is False
    eval_metrics = model.get_metrics(is_train=False)
    assert set(eval_metrics) == {"MulticlassAccuracy"}
    assert isinstance(eval_metrics["MulticlassAccuracy"], MulticlassAccuracy)
    assert eval_metrics["MulticlassAccuracy"].num_classes == 3
    assert model.get_metrics(is_train=True) == {}


def test_classifier_update_metric() -> None:
    model = HuggingFaceModel(tiny_bert_classifier(num_labels=3))
    batch = {"input_ids": torch.randint(0, VOCAB, (4, 5)), "labels": torch.tensor([0, 1, 2, 1])}
    logits = model.eval_forward(batch)                        # [batch, labels]
    assert logits.shape == (4, 3)
    metric = model.get_metrics()["MulticlassAccuracy"]
    model.update_metric(batch, logits, metric)
    expected = (logits.argmax(-1) == batch["labels"]).float().mean().item()
    assert metric.compute().item() == pytest.approx(expected)


def test_shift_labels_on_classifier_logits_is_refused() -> None:
    model = HuggingFaceModel(tiny_bert_classifier(), shift_labels=True)
    batch = {"input_ids": torch.randint(0, VOCAB, (2, 5)), "labels": torch.tensor([0, 1])}
    with pytest.raises(ValueError, match="shift_labels=False"):
        model.update_metric(batch, model.eval_forward(batch), MulticlassAccuracy(num_classes=3))


def test_get_metrics_returns_fresh_objects() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    first, second = model.get_metrics(), model.get_metrics()
    assert all(first[name] is not second[name] for name in first)
    batch = lm_batch()
    model.update_metric(batch, model.eval_forward(batch), first["LanguageCrossEntropy"])
    assert int(first["LanguageCrossEntropy"].total_items) > 0
    assert int(model.get_metrics()["LanguageCrossEntropy"].total_items) == 0
    assert int(second["LanguageCrossEntropy"].total_items) == 0


def test_user_metrics_follow_composer_rules() -> None:
    model = HuggingFaceModel(tiny_gpt2(), metrics=[LanguageCrossEntropy()])
    assert set(model.get_metrics(is_train=True)) == {"LanguageCrossEntropy"}
    assert set(model.get_metrics(is_train=False)) == {"LanguageCrossEntropy"}
    model = HuggingFaceModel(tiny_gpt2(), eval_metrics={"ppl": LanguagePerplexity()})
    assert set(model.get_metrics(is_train=False)) == {"ppl"}
    with pytest.raises(TypeError, match="torchmetrics.Metric"):
        HuggingFaceModel(tiny_gpt2(), metrics=[F.cross_entropy])  # type: ignore[list-item]


def test_num_tokens_counts_attention_mask() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    batch = lm_batch()
    assert model.num_tokens(batch) == 2 * SEQ - 3
    del batch["attention_mask"]
    assert model.num_tokens(batch) == 2 * SEQ


def test_flops_per_batch_is_palm_count() -> None:
    """6 N + 12 L H Q T per token (PaLM App. B), N without the position-embedding look-up;
    the tied token embedding counts once (as the output projection), an untied one not."""
    model = HuggingFaceModel(tiny_gpt2())
    n_params = sum(p.numel() for p in model.model.parameters())
    assert model.num_params() == n_params
    n_matmul = n_params - 16 * 16  # wpe: n_positions x n_embd
    attention = 12 * 2 * 2 * 8 * SEQ  # L=2, H=2, Q=16/2, T=SEQ
    assert model.flops_per_batch(lm_batch()) == 2 * SEQ * (6 * n_matmul + attention)
    untied = HuggingFaceModel(tiny_gpt2(tie_word_embeddings=False))
    assert untied.num_params() == n_params + VOCAB * 16
    assert untied.flops_per_batch(lm_batch()) == model.flops_per_batch(lm_batch())


def test_layer_classes_and_wrap_fns() -> None:
    model = HuggingFaceModel(tiny_gpt2())
    assert model.transformer_layer_classes() == {GPT2Block}
    wrapped = [m for m in model.modules() if model.fsdp_wrap_fn(m)]
    checkpointed = [m for m in model.modules() if model.activation_checkpointing_fn(m)]
    assert len(wrapped) == len(checkpointed) == 2
    assert not model.fsdp_wrap_fn(model.model.transformer.wte)
    assert HuggingFaceModel(Recorder()).transformer_layer_classes() == set()


class _FakeTokenizer:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def test_tokenizer_larger_than_vocab_is_refused_or_resized() -> None:
    with pytest.raises(ValueError, match="allow_embedding_resizing=True"):
        HuggingFaceModel(tiny_gpt2(), tokenizer=_FakeTokenizer(VOCAB + 6))
    model = HuggingFaceModel(tiny_gpt2(), tokenizer=_FakeTokenizer(VOCAB + 6),
                             allow_embedding_resizing=True)
    assert model.model.get_input_embeddings().num_embeddings == VOCAB + 6
    HuggingFaceModel(tiny_gpt2(), tokenizer=_FakeTokenizer(VOCAB - 4))   # smaller is fine
