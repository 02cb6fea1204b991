"""``cadence convert``: a trained GPT-2's full and sharded checkpoints export to a directory
that ``transformers`` loads with ``from_pretrained`` (same logits, same tokenizer), and a
sharded checkpoint merges into one file that ``load_path`` loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.callbacks.checkpoint_saver import CheckpointSaver
from cadence.cli import main as cli_main
from cadence.models.gpt import gpt2, load_tokenizer
from cadence.data.corpora import locate_package
from tests.common.models import SimpleModel, make_dataloader

REPO = Path(__file__).resolve().parents[2]
VOCAB, SEQ = 50257, 16  # the GPT-2 tokenizer's vocabulary
TEXTS = ["Hello world", "To be, or not to be: that is the question.", " spaces  and\nnewlines",
         "<|endoftext|>", "Ünïcödé 日本語"]


def tiny_gpt2(tokenizer: Any) -> Any:
    torch.manual_seed(0)
    return gpt2(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ,
                dropout=0.1, tokenizer=tokenizer)


def token_loader() -> DataLoader:
    ids = torch.randint(0, VOCAB, (12, SEQ), generator=torch.Generator().manual_seed(1))
    return DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny GPT-2 with the GPT-2 tokenizer, trained 3 steps (dropout on), saved in both
    formats at the same step."""
    root = tmp_path_factory.mktemp("convert")
    tokenizer = load_tokenizer(locate_package("gpt2") / "data")
    model = tiny_gpt2(tokenizer)
    trainer = Trainer(model=model, train_dataloader=token_loader(), max_duration="3ba",
                      seed=3, progress_bar=False, run_name="conv", save_folder=str(root / "full"),
                      save_interval="3ba")
    trainer.fit()
    saver = next(c for c in trainer.state.callbacks if isinstance(c, CheckpointSaver))
    sharded = CheckpointSaver(folder=str(root / "sharded"), state_dict_type="sharded",
                              metadata=saver.metadata)
    sharded.save(trainer.state)
    trainer.close()
    return {"root": root, "trainer": trainer, "tokenizer": tokenizer,
            "full": root / "full" / "ep0-ba3-rank0.pt", "sharded": root / "sharded" / "ep1-ba3"}


def reference_logits(trained: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
    hf_model = trained["trainer"].state.model.model
    hf_model.eval()
    with torch.no_grad():
        return hf_model(input_ids=ids).logits


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_to_hf_loads_with_from_pretrained(trained: dict[str, Any], tmp_path: Path,
                                          fmt: str) -> None:
    from transformers import AutoTokenizer, GPT2LMHeadModel

    out = tmp_path / "hf"
    assert cli_main(["convert", str(trained[fmt]), "--to", "hf", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    exported = GPT2LMHeadModel.from_pretrained(out)
    exported.eval()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        logits = exported(input_ids=ids).logits
    torch.testing.assert_close(logits, reference_logits(trained, ids), atol=1e-6, rtol=0)

    tokenizer = AutoTokenizer.from_pretrained(out)
    original = trained["tokenizer"]
    for text in TEXTS:
        assert tokenizer.encode(text) == original.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_token == original.eos_token == "<|endoftext|>"
    assert tokenizer.eos_token_id == original.eos_token_id == 50256


def test_to_hf_through_the_command_line(trained: dict[str, Any], tmp_path: Path) -> None:
    """The real entry point: ``python -m cadence convert`` in a fresh process."""
    out = tmp_path / "hf"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "cadence", "convert", str(trained["sharded"]),
                           "--to", "hf", str(out)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    from transformers import GPT2LMHeadModel

    exported = GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.arange(SEQ).unsqueeze(0)
    with torch.no_grad():
        logits = exported(input_ids=ids).logits
    torch.testing.assert_close(logits, reference_logits(trained, ids), atol=1e-6, rtol=0)


def test_to_full_merges_sharded_into_a_loadable_file(trained: dict[str, Any],
                                                     tmp_path: Path) -> None:
    out = tmp_path / "merged.pt"
    assert cli_main(["convert", str(trained["sharded"]), "--to", "full", str(out)]) == 0
    assert out.is_file() and not list(tmp_path.glob("*.tmp-*"))
    model = tiny_gpt2(trained["tokenizer"])
    trainer = Trainer(model=model, train_dataloader=token_loader(), max_duration="4ba",
                      progress_bar=False, load_path=str(out))
    source = trained["trainer"].state
    assert trainer.state.timestamp.batch == 3
    for (name, got), (_, want) in zip(trainer.state.model.state_dict().items(),
                                      source.model.state_dict().items()):
        assert torch.equal(got, want), name
    got_optim = trainer.state.optimizers[0].state_dict()["state"]
    want_optim = source.optimizers[0].state_dict()["state"]
    assert got_optim.keys() == want_optim.keys()
    for index in want_optim:
        for key, value in want_optim[index].items():
            assert torch.equal(got_optim[index][key], value), (index, key)
    trainer.fit()  # and it trains on from there
    assert trainer.state.timestamp.batch == 4
    trainer.close()


def test_non_huggingface_checkpoint_to_hf_fails_clearly(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(2),
                      max_duration="2ba", progress_bar=False, run_name="mlp",
                      save_folder=str(tmp_path / "run"))
    trainer.fit()
    trainer.close()
    checkpoint = tmp_path / "run" / "ep0-ba2-rank0.pt"
    out = tmp_path / "hf"
    assert cli_main(["convert", str(checkpoint), "--to", "hf", str(out)]) == 1
    err = capsys.readouterr().err
    assert str(checkpoint) in err and "not saved from a HuggingFaceModel" in err
    assert "--to full" in err and "Traceback" not in err
    assert not out.exists()


def test_missing_checkpoint_fails_clearly(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.pt"
    for to in ("hf", "full"):
        assert cli_main(["convert", str(missing), "--to", to, str(tmp_path / "out")]) == 1
        assert f"{missing} does not exist" in capsys.readouterr().err


def test_hf_from_composer_checkpoint_returns_the_trained_model(trained: dict[str, Any],
                                                               tmp_path: Path) -> None:
    from cadence.models import HuggingFaceModel

    saved = torch.load(trained["full"], weights_only=True)["state"]  # Composer's layout
    assert saved["integrations"]["huggingface"]["model"]["config"]["class"] == "GPT2LMHeadModel"
    keep = tmp_path / "kept" / "copy.pt"
    model, tokenizer = HuggingFaceModel.hf_from_composer_checkpoint(
        str(trained["full"]), local_checkpoint_save_location=keep)
    assert keep.read_bytes() == trained["full"].read_bytes()
    model.eval()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.testing.assert_close(logits, reference_logits(trained, ids), atol=1e-6, rtol=0)
    for text in TEXTS:
        assert tokenizer.encode(text) == trained["tokenizer"].encode(text), text
    bigger, _ = HuggingFaceModel.hf_from_composer_checkpoint(
        str(trained["full"]), model_instantiation_class="GPT2LMHeadModel",
        model_config_kwargs={"resid_pdrop": 0.0})
    assert bigger.config.resid_pdrop == 0.0


def test_hf_from_composer_checkpoint_puts_a_new_head_on_the_pretrained_body(
        trained: dict[str, Any]) -> None:
    """Composer's pretrain -> fine-tune flow: another class on the saved body loads every
    weight that fits, warns once naming the keys that did not, and refuses only a shape
    mismatch (naming the key and both shapes)."""
    from transformers import GPT2ForSequenceClassification

    from cadence.checkpoint.errors import CheckpointError
    from cadence.models import HuggingFaceModel

    with pytest.warns(UserWarning) as record:
        model, _ = HuggingFaceModel.hf_from_composer_checkpoint(
            str(trained["full"]), model_instantiation_class=GPT2ForSequenceClassification,
            model_config_kwargs={"num_labels": 3})
    messages = [str(w.message) for w in record if "new head" in str(w.message)]
    assert len(messages) == 1, [str(w.message) for w in record]
    assert "score.weight" in messages[0] and "lm_head.weight" in messages[0]
    assert isinstance(model, GPT2ForSequenceClassification) and model.num_labels == 3
    body = trained["trainer"].state.model.model.transformer.state_dict()
    for key, value in model.transformer.state_dict().items():
        assert torch.equal(value, body[key]), key
    with pytest.raises(CheckpointError, match=r"transformer\.wpe\.weight.*\[16, 32\].*\[32, 32\]"):
        HuggingFaceModel.hf_from_composer_checkpoint(
            str(trained["full"]), model_instantiation_class=GPT2ForSequenceClassification,
            model_config_kwargs={"n_positions": 32})


def test_write_huggingface_pretrained_loads_with_from_pretrained(trained: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from cadence.models import write_huggingface_pretrained_from_composer_checkpoint

    out = tmp_path / "hf"
    write_huggingface_pretrained_from_composer_checkpoint(trained["full"], out)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / "pytorch_model.bin").exists()  # no pickle to load
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.testing.assert_close(logits, reference_logits(trained, ids), atol=1e-6, rtol=0)
