"""The on-disk cache for trained tokenizers and tokenized corpora.

Location: the ``cache_dir`` argument, else the ``CADENCE_CACHE_DIR`` environment variable,
else ``~/.cache/cadence/data``. Entries are named by a hash of everything that determines
their content, so a stale entry is never read, only left behind (delete the folder to
reclaim the space). Writes are atomic (a temporary file in the same folder, then
``os.replace``), and builders hold a per-entry file lock, so ranks that share a cache build an
entry once and the others wait and read it (the empty ``*.lock`` files stay behind).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

__all__ = ["CACHE_ENV_VAR", "resolve_cache_dir", "cache_key", "atomic_write", "file_lock"]

#: Environment variable that sets the cache folder.
CACHE_ENV_VAR = "CADENCE_CACHE_DIR"

PathLike = Union[str, os.PathLike[str]]


def resolve_cache_dir(cache_dir: Optional[PathLike] = None) -> Path:
    """The cache folder (created if missing).

    Args:
        cache_dir: explicit folder; ``None`` means ``$CADENCE_CACHE_DIR``, else
            ``~/.cache/cadence/data``.
    """
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "cadence" / "data"
    folder = Path(cache_dir).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cache_key(**fields: Any) -> str:
    """A 16-hex-digit hash of JSON-serialisable ``fields`` (order-independent)."""
    blob = json.dumps(fields, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write ``path`` atomically: ``write(file)`` into a temporary sibling, then rename.

    Readers see either no file or the complete file, never a partial one.

    Args:
        path: the destination.
        write: called with the open temporary file object.
        mode: ``"wb"`` or ``"w"`` (text, UTF-8).
    """
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes 0600; a shared cache needs more
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (POSIX ``flock``; a no-op where unavailable)."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic writes alone keep the cache consistent.
        yield
        return
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
