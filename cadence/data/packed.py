"""Packed next-token datasets over the real-text corpora, and their distributed dataloader.

Pipeline (each step cached on disk, see :mod:`cadence.data.cache`):

1. read the corpus' documents (:mod:`cadence.data.corpora`);
2. split every document by characters: the last ``val_fraction`` of it (cut at a line
   boundary) is validation, the rest train, so the splits never overlap and do not depend on
   ``seq_len``;
3. tokenize (:mod:`cadence.data.tokenizer`; the BPE is trained on the train split
   only), each document followed by ``<|endoftext|>``, into one id stream per split, saved as
   ``<source>-<split>-<tokenizer><vocab>-<key>.npy`` (``uint16`` below 65,536 tokens, else
   ``int32``);
4. pack the stream into ``seq_len``-token sequences, dropping the remainder
   (:class:`PackedTokenDataset`), read through a memory map.

Sequences therefore cross document boundaries, marked by ``<|endoftext|>`` tokens, as in
GPT-2/nanoGPT pretraining.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from cadence.data.cache import atomic_write, cache_key, file_lock, resolve_cache_dir
from cadence.data.corpora import SOURCES, Corpus, locate_corpus, split_documents
from cadence.data.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    MIN_BPE_VOCAB_SIZE,
    TOKENIZERS,
    encode_documents,
    tokenizer_fingerprint,
    tokenizer_for_corpus,
)
from cadence.utils.dist import get_global_rank, get_world_size

__all__ = ["SPLITS", "PackedTokenDataset", "load_token_ids", "build_text_dataset",
           "build_text_dataloader"]

logger = logging.getLogger(__name__)

#: The split names.
SPLITS: tuple[str, ...] = ("train", "val")

PathLike = Union[str, os.PathLike[str]]


class PackedTokenDataset(Dataset):
    """Fixed-length sequences cut from one token stream (map-style).

    Sequence ``i`` is ``token_ids[i * seq_len : (i + 1) * seq_len]``; the tail shorter than
    ``seq_len`` is dropped.

    Args:
        token_ids: ``[num_tokens]`` integer ids (a numpy array or memmap; kept as is and
            converted per item).
        seq_len: tokens per sequence (>= 1).
        tokenizer: the tokenizer that produced the ids (kept as ``.tokenizer`` for decoding).
        vocab_size: vocabulary size in tokens; defaults to ``len(tokenizer)``, else
            ``max(token_ids) + 1``.
        max_samples: keep only the first ``max_samples`` sequences (``None``: all).

    Attributes:
        tokenizer: as given (may be ``None``).
        vocab_size: the vocabulary size (tokens), for sizing a model's embedding.
        seq_len: tokens per sequence.
        num_tokens: tokens in the stream, before packing.
    """

    def __init__(
        self,
        token_ids: np.ndarray,
        seq_len: int,
        tokenizer: Any = None,
        vocab_size: Optional[int] = None,
        max_samples: Optional[int] = None,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}.")
        self.token_ids = token_ids
        self.seq_len = seq_len
        self.tokenizer = tokenizer
        if vocab_size is None:
            if tokenizer is not None:
                vocab_size = len(tokenizer)
            else:
                vocab_size = int(token_ids.max()) + 1 if len(token_ids) else 0
        self.vocab_size = vocab_size
        self.num_tokens = len(token_ids)
        num_sequences = self.num_tokens // seq_len
        if max_samples is not None:
            num_sequences = min(num_sequences, max_samples)
        self._num_sequences = num_sequences

    def __len__(self) -> int:
        """The number of sequences."""
        return self._num_sequences

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Sequence ``index``.

        Returns:
            ``{"input_ids": [seq_len] int64, "labels": [seq_len] int64}``; labels equal the
            inputs (causal LMs such as Hugging Face's shift them internally).

        Raises:
            IndexError: ``index`` outside ``[-len, len)``.
        """
        if index < 0:
            index += self._num_sequences
        if not 0 <= index < self._num_sequences:
            raise IndexError(f"index {index} out of range for {self._num_sequences} sequences")
        start = index * self.seq_len
        window = self.token_ids[start:start + self.seq_len]
        ids = torch.from_numpy(np.asarray(window, dtype=np.int64))  # [seq_len]
        return {"input_ids": ids, "labels": ids.clone()}


def load_token_ids(
    corpus: Corpus,
    split: str,
    tokenizer: Any,
    tokenizer_kind: str,
    val_fraction: float = 0.05,
    cache_dir: Optional[PathLike] = None,
) -> np.ndarray:
    """The token stream of one split, from the cache or built (both splits at once) and cached.

    The cache key hashes the corpus name and fingerprint (files, sizes, mtimes), the split,
    ``val_fraction``, the tokenizer kind and size, and the tokenizer's full serialised state.

    Args:
        corpus: the located corpus.
        split: ``"train"`` or ``"val"``.
        tokenizer: from :func:`~cadence.data.tokenizer.tokenizer_for_corpus`.
        tokenizer_kind: ``"bpe"`` or ``"gpt2"`` (for the key and file name).
        val_fraction: share of each document's characters held out for validation.
        cache_dir: the cache folder.

    Returns:
        ``[num_tokens]`` ids as a read-only memmap (``uint16`` or ``int32``).
    """
    folder = resolve_cache_dir(cache_dir)
    vocab_size = len(tokenizer)
    common = dict(
        corpus=corpus.name, files=corpus.fingerprint(), val_fraction=val_fraction,
        tokenizer=tokenizer_kind, vocab_size=vocab_size,
        tokenizer_hash=tokenizer_fingerprint(tokenizer), format=1,
    )
    paths = {
        name: folder / (f"{corpus.name}-{name}-{tokenizer_kind}{vocab_size}-"
                        f"{cache_key(split=name, **common)}.npy")
        for name in SPLITS
    }
    target = paths[split]
    if not target.exists():
        # One lock for both splits: ranks asking for different splits build them once.
        with file_lock(paths["train"]):
            if not all(p.exists() for p in paths.values()):
                start = time.perf_counter()
                texts = split_documents(corpus.documents(), val_fraction)
                for name in SPLITS:
                    ids = encode_documents(tokenizer, texts[name])
                    atomic_write(paths[name], lambda file, ids=ids: np.save(file, ids))
                    logger.info(
                        "Tokenized %s/%s with %s-%d: %d documents -> %d tokens; cached at %s",
                        corpus.name, name, tokenizer_kind, vocab_size, len(texts[name]),
                        len(ids), paths[name],
                    )
                logger.info("Built the %s token cache in %.2f s", corpus.name,
                            time.perf_counter() - start)
    return np.load(target, mmap_mode="r")


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = f"an integer >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}.")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"Unknown {name} {value!r}; allowed: {', '.join(map(repr, allowed))}.")


def _check_optional_bool(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None (split default), got {value!r}.")


def build_text_dataset(
    source: str = "shakespeare",
    split: str = "train",
    seq_len: int = 128,
    tokenizer: str = "bpe",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    path: Optional[PathLike] = None,
    val_fraction: float = 0.05,
    max_samples: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
) -> PackedTokenDataset:
    """A :class:`PackedTokenDataset` of one split of a real-text corpus.

    Args:
        source: ``"shakespeare"``, ``"kjv"`` or ``"text"``
            (see :mod:`~cadence.data.corpora`).
        split: ``"train"`` or ``"val"``.
        seq_len: tokens per sequence (>= 2).
        tokenizer: ``"bpe"`` (trained on this corpus' train split) or ``"gpt2"``.
        vocab_size: BPE vocabulary size in tokens (>= 257); ignored for ``"gpt2"`` (50,257).
        path: for ``source="text"``: a text file or a folder of ``*.txt`` files.
        val_fraction: share of each document's characters held out for ``"val"``, in [0, 1).
        max_samples: keep only the first N sequences (quick runs and tests).
        cache_dir: the cache folder (default ``$CADENCE_CACHE_DIR`` or ``~/.cache/cadence/data``).

    Returns:
        The dataset, with ``.tokenizer`` and ``.vocab_size``.

    Raises:
        ValueError: a bad argument (the message names it, its value and what is allowed), a
            missing package or path, or a split with fewer than ``seq_len`` tokens.
    """
    _check_choice("source", source, SOURCES)
    _check_choice("split", split, SPLITS)
    _check_choice("tokenizer", tokenizer, TOKENIZERS)
    _check_int("seq_len", seq_len, 2)
    _check_int("vocab_size", vocab_size, MIN_BPE_VOCAB_SIZE)
    _check_int("max_samples", max_samples, 1, allow_none=True)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not (
        0.0 <= val_fraction < 1.0
    ):
        raise ValueError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}.")
    val_fraction = float(val_fraction)
    if split == "val" and val_fraction == 0.0:
        raise ValueError("split='val' needs val_fraction > 0 (val_fraction=0 holds nothing out).")

    corpus = locate_corpus(source, path)
    tok = tokenizer_for_corpus(corpus, tokenizer, vocab_size, val_fraction, cache_dir)
    ids = load_token_ids(corpus, split, tok, tokenizer, val_fraction, cache_dir)
    if len(ids) < seq_len:
        raise ValueError(
            f"The {split!r} split of source {source!r} has {len(ids)} tokens, fewer than "
            f"seq_len={seq_len}: use a smaller seq_len, a larger val_fraction, or more text."
        )
    return PackedTokenDataset(ids, seq_len, tokenizer=tok, max_samples=max_samples)


def build_text_dataloader(
    source: str = "shakespeare",
    split: str = "train",
    seq_len: int = 128,
    batch_size: int = 8,
    tokenizer: str = "bpe",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    path: Optional[PathLike] = None,
    val_fraction: float = 0.05,
    shuffle: Optional[bool] = None,
    drop_last: Optional[bool] = None,
    num_workers: int = 0,
    seed: int = 17,
    max_samples: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
) -> DataLoader:
    """A distributed dataloader of packed next-token sequences from a real-text corpus.

    The sampler is always a ``DistributedSampler`` over ``get_world_size()`` ranks (1 without
    a process group), so each rank reads a distinct ``1/world_size`` share; call
    ``loader.sampler.set_epoch(epoch)`` each epoch for a new shuffle. Batches are
    ``{"input_ids": [batch_size, seq_len] int64, "labels": [batch_size, seq_len] int64}``.
    The dataset (``loader.dataset``) carries ``.tokenizer`` and ``.vocab_size``.

    The first call for a (corpus, tokenizer, vocabulary, val_fraction) trains the BPE and
    tokenizes both splits (a few seconds for Shakespeare on 2 cores); later calls read the
    cache (well under a second).

    Args:
        source: ``"shakespeare"``, ``"kjv"`` or ``"text"``.
        split: ``"train"`` or ``"val"``.
        seq_len: tokens per sequence (>= 2).
        batch_size: sequences per batch *per rank* (>= 1).
        tokenizer: ``"bpe"`` or ``"gpt2"``.
        vocab_size: BPE vocabulary size in tokens; ignored for ``"gpt2"``.
        path: file or folder for ``source="text"``.
        val_fraction: share of each document's characters held out for validation, in [0, 1).
        shuffle: shuffle each epoch; default ``True`` for train, ``False`` for val.
        drop_last: drop the tail that does not divide evenly across ranks and the last
            partial batch; default ``True`` for train, ``False`` for val.
        num_workers: dataloader worker processes (>= 0).
        seed: shuffling seed (the same on every rank, as ``DistributedSampler`` needs).
        max_samples: keep only the first N sequences before sharding across ranks.
        cache_dir: the cache folder.

    Returns:
        The ``torch.utils.data.DataLoader``.

    Raises:
        ValueError: a bad argument (named, with its value and the allowed values), a
            missing package or path, or a split shorter than ``seq_len`` tokens.
    """
    _check_int("batch_size", batch_size, 1)
    _check_int("num_workers", num_workers, 0)
    _check_int("seed", seed, 0)
    _check_optional_bool("shuffle", shuffle)
    _check_optional_bool("drop_last", drop_last)
    dataset = build_text_dataset(
        source=source, split=split, seq_len=seq_len, tokenizer=tokenizer, vocab_size=vocab_size,
        path=path, val_fraction=val_fraction, max_samples=max_samples, cache_dir=cache_dir,
    )
    is_train = split == "train"
    shuffle = is_train if shuffle is None else shuffle
    drop_last = is_train if drop_last is None else drop_last
    sampler = DistributedSampler(
        dataset, num_replicas=get_world_size(), rank=get_global_rank(), shuffle=shuffle,
        seed=seed, drop_last=drop_last,
    )
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
        drop_last=drop_last,
    )
