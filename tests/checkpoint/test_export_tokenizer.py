"""``cadence convert --to hf`` on a GPT run trained from a YAML file (the ``gpt2`` builder and
the byte-level BPE trained on the run's own text) writes the run's tokenizer: the export
loads with ``AutoTokenizer.from_pretrained`` and encodes and decodes as the run did, and the
exported model's logits equal the trained model's."""

from __future__ import annotations

from pathlib import Path

import torch

from cadence.cli import main as cli_main
from cadence.config.build import build_trainer
from cadence.config.load import load_config

TEXTS = ["To be, or not to be: that is the question.", "Hello world", " spaces  and\nnewlines",
         "Whether 'tis nobler in the mind to suffer"]
CORPUS = "\n".join(
    f"Line {i}: to be, or not to be, that is the question; whether 'tis nobler in the mind "
    f"to suffer the slings and arrows of outrageous fortune ({i * 7 % 13})."
    for i in range(200)
)


def test_convert_to_hf_writes_the_runs_bpe_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, GPT2LMHeadModel

    (tmp_path / "corpus.txt").write_text(CORPUS)
    run = tmp_path / "run.yaml"
    run.write_text(f"""\
run_name: export-tok
max_duration: 2ba
global_train_batch_size: 4
progress_bar: false
save_folder: {tmp_path / 'ckpt'}
save_interval: 2ba
model: {{name: gpt2, n_layer: 1, n_head: 2, n_embd: 32, vocab_size: 320, max_seq_len: 16}}
train_loader: {{name: text, path: {tmp_path / 'corpus.txt'}, seq_len: 16, vocab_size: 320}}
""")
    trainer = build_trainer(load_config(run))
    trainer.fit()
    run_tokenizer = trainer.state.train_dataloader.dataset.tokenizer
    trained = trainer.state.model.model.eval()
    trainer.close()

    out = tmp_path / "hf"
    (checkpoint,) = [p for p in (tmp_path / "ckpt").glob("*.pt") if not p.is_symlink()]
    assert cli_main(["convert", str(checkpoint), "--to", "hf", str(out)]) == 0
    assert (out / "tokenizer.json").is_file()

    exported = AutoTokenizer.from_pretrained(out)
    assert len(exported) == len(run_tokenizer) > 256  # the trained BPE, not an empty one
    for text in TEXTS:
        ids = exported.encode(text)
        assert ids == run_tokenizer.encode(text)
        assert exported.decode(ids) == text
    assert exported.eos_token == "<|endoftext|>"

    model = GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.tensor([exported.encode(TEXTS[0])[:16]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, trained(ids).logits)
