"""Reading the pickles in a checkpoint without running code from them.

A pickle can name any importable callable and call it while loading (``__reduce__``); a
checkpoint is data, so every pickle cadence reads goes through an unpickler that admits
only what a checkpoint needs:

- ``.pt`` files (a full checkpoint, a sharded checkpoint's ``extra.pt``) and the non-tensor
  values inside DCP shards: ``torch.load(weights_only=True)``, torch's own restricted
  unpickler (tensors and their rebuild functions, ``torch.Size``, dtypes, builtins
  containers and scalars).
- DCP's ``.metadata``, which ``torch.distributed.checkpoint.FileSystemReader.read_metadata``
  reads with plain ``pickle.load``: :class:`CheckpointUnpickler` through
  :class:`SafeFileSystemReader`, which admits DCP's metadata dataclasses, ``torch.Size``,
  dtypes / layouts / memory formats, ``pathlib`` paths and plain builtins, and nothing else
  (no tensors: DCP never pickles one into ``.metadata``).

- A ``full`` checkpoint written by Composer 0.32 pickles a few objects beyond tensors (its
  ``Timestamp``, NumPy's RNG state, ``datetime.timedelta`` clocks, torch's version string):
  :func:`composer_globals` admits those, and only those, to ``torch.load(weights_only=True)``
  for the length of one load, each mapped to a cadence object or a plain value
  (:data:`COMPOSER_GLOBALS` lists them with why each is there); :func:`from_composer_objects`
  turns the stand-ins into cadence's ``Timestamp`` / ``Time``.

A refused object raises :class:`~cadence.checkpoint.errors.CheckpointError` naming
the file and the refused global, before the global is looked up, so nothing from it runs.

Sizes are bounded too, so a small hostile file cannot make the reader allocate gigabytes:
a ``.metadata`` over :data:`MAX_PICKLE_BYTES` is refused before it is read; every length the
pickle claims (a bytes or str object, a frame) must lie inside the file (checked with
``pickletools`` before unpickling: the C unpickler allocates a claimed length before reading
it); and an admitted builtin called while unpickling (``bytes(n)``, ``list(range(n))``) may
not be asked for more elements than the file has bytes.

:class:`SafeFileSystemReader` also names the shard file when one is missing or shorter than
``.metadata`` says (DCP's own reader reports a bare zip error).

Source: the Python docs, "Restricting Globals" (``pickle.Unpickler.find_class``); PyTorch's
``torch._weights_only_unpickler``; ``torch.distributed.checkpoint.filesystem``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import datetime
import io
import pathlib
import pickle
import pickletools
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.torch_version
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from cadence.checkpoint.errors import CheckpointError
from cadence.core.time import Time, Timestamp, TimeUnit

__all__ = ["COMPOSER_GLOBALS", "MAX_PICKLE_BYTES", "CheckpointUnpickler", "RefusedGlobal",
           "SafeFileSystemReader", "composer_globals", "from_composer_objects", "load_pickle",
           "refused_global"]

#: The largest ``.metadata`` read (DCP's metadata of a 70B-parameter model on 1,024 ranks is a
#: few hundred MB at most).
MAX_PICKLE_BYTES = 1 << 30

_SAFE_BUILTINS = frozenset({
    "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list",
    "range", "set", "slice", "str", "tuple",
})
_SAFE_PATHS = frozenset({"Path", "PosixPath", "PurePath", "PurePosixPath", "PureWindowsPath",
                         "WindowsPath"})
_TORCH_VALUE_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle names a global that is not allowed in a checkpoint (``global_name``)."""

    def __init__(self, module: str, name: str) -> None:
        self.global_name = f"{module}.{name}"
        super().__init__(f"GLOBAL {self.global_name} is not allowed in a checkpoint")


def refused_global(exc: BaseException) -> Optional[str]:
    """``Unsupported global: GLOBAL pkg.Class ...`` when ``exc`` is
    ``torch.load(weights_only=True)``'s refusal (its message is mostly advice on loading
    unsafely), else None."""
    text = str(exc)
    if "WeightsUnpickler error: Unsupported global:" not in text:
        return None  # random bytes also fail in the WeightsUnpickler, as another error
    return text.split("WeightsUnpickler error:", 1)[1].split(". Please", 1)[0].strip()


def _allowed(module: str, name: str) -> bool:
    if module == "builtins":
        return name in _SAFE_BUILTINS
    if module == "collections":
        return name == "OrderedDict"
    if module == "pathlib":
        return name in _SAFE_PATHS
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), _TORCH_VALUE_TYPES)
    if module == "torch.serialization":
        return name == "_get_layout"  # how torch.layout pickles: _get_layout("torch.strided")
    if module == dcp_metadata.__name__:  # Metadata, TensorStorageMetadata, ... (dataclasses)
        obj = getattr(dcp_metadata, name, None)
        return isinstance(obj, type) and obj.__module__ == module
    if module == _StorageInfo.__module__:
        return name == _StorageInfo.__name__
    return False


class TooLarge(pickle.UnpicklingError):
    """A pickle asks for an object larger than its file could hold."""


def _bounded(fn: Any, limit: int) -> Any:
    """``fn`` (an admitted builtin), refusing integer arguments and sized arguments beyond
    ``limit`` (``bytes(10**10)``, ``list(range(10**10))``)."""
    def call(*args: Any) -> Any:
        for arg in args:
            n = arg if isinstance(arg, int) and not isinstance(arg, bool) else (
                len(arg) if hasattr(arg, "__len__") else 0)
            if abs(n) > limit:
                raise TooLarge(f"{fn.__name__}() asked for {n} elements in a file of {limit} "
                               f"bytes")
        return fn(*args)

    return call


class CheckpointUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that admits only the globals a DCP ``.metadata`` needs (see
    the module docstring) and refuses the rest with :class:`RefusedGlobal` before importing
    anything. Persistent ids (how tensors' storages pickle) are refused too. ``limit``: the
    most elements an admitted builtin may be asked to build (default: no bound)."""

    def __init__(self, file: Any, limit: Optional[int] = None) -> None:
        super().__init__(file)
        self.limit = limit

    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise RefusedGlobal(module, name)
        if module == "builtins":
            fn = getattr(builtins, name)
            return fn if self.limit is None else _bounded(fn, self.limit)
        if module == "pathlib":
            return getattr(pathlib, name)
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids (tensor storages) are not allowed here")


def _check_lengths(data: bytes) -> None:
    """Every length ``data`` claims (bytes, str, frames) lies inside it: walk its opcodes
    with ``pickletools`` (which reads a claimed length from a BytesIO, never allocating it).

    Raises:
        TooLarge: a claimed length runs past the end of the data.
    """
    try:
        for _ in pickletools.genops(io.BytesIO(data)):
            pass
    except ValueError as exc:  # "expected 10000000000 bytes in a bytes8, but only 3 remain"
        raise TooLarge(str(exc)) from None


def load_pickle(path: Path) -> Any:
    """Unpickle the file at ``path`` with :class:`CheckpointUnpickler`, sizes bounded (see
    the module docstring).

    Raises:
        CheckpointError: the file does not exist, is larger than :data:`MAX_PICKLE_BYTES`,
            asks for an object larger than the file, holds an object that is not allowed in
            a checkpoint, or is not a complete pickle (each message names the file).
    """
    try:
        size = path.stat().st_size
        if size > MAX_PICKLE_BYTES:
            raise CheckpointError(
                f"Checkpoint file {path} is {size} bytes, more than the {MAX_PICKLE_BYTES} a "
                f"checkpoint's .metadata may have; it was not read. It is not a "
                f"torch.distributed.checkpoint .metadata written by cadence.")
        data = path.read_bytes()
        _check_lengths(data)
        return CheckpointUnpickler(io.BytesIO(data), limit=len(data)).load()
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path} does not exist.") from None
    except TooLarge as exc:
        raise CheckpointError(
            f"Checkpoint file {path} asks for an object larger than the file itself ({exc}); "
            f"refused before allocating it, and nothing in it ran. It is corrupt or hostile: "
            f"load an earlier checkpoint.") from None
    except RefusedGlobal as exc:
        raise CheckpointError(
            f"Checkpoint file {path} holds an object that is not allowed in a checkpoint "
            f"({exc.global_name}); it was not loaded and nothing in it ran. A checkpoint "
            f"written by cadence holds none: do not load a file whose origin you do not trust."
        ) from None
    except Exception as exc:  # EOFError, UnpicklingError, ... of a truncated or garbled file
        raise CheckpointError(
            f"Checkpoint file {path} cannot be read: it is truncated or corrupt. Load an "
            f"earlier checkpoint. ({type(exc).__name__}: {str(exc)[:300]})") from exc


class SafeFileSystemReader(FileSystemReader):
    """``torch.distributed.checkpoint.FileSystemReader`` that unpickles ``.metadata`` with
    :class:`CheckpointUnpickler` (DCP's own uses plain ``pickle.load``), reads shard files
    only inside the checkpoint directory, and names the shard file that is missing,
    truncated or unreadable.

    Raises (from ``read_metadata`` / ``read_data``):
        CheckpointError: see :func:`load_pickle`; a shard file shorter than ``.metadata``
            says; a shard whose data cannot be read.
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = load_pickle(path)
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"Checkpoint file {path} holds a {type(metadata).__name__}, "
                                  f"not torch.distributed.checkpoint metadata.")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read ``plan`` one shard file at a time, so an error names its file."""
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                []).append(item)
        for relative_path, items in per_file.items():
            shard = Path(self.path) / relative_path
            if Path(relative_path).name != relative_path or relative_path in ("", ".", ".."):
                raise CheckpointError(
                    f"{Path(self.path) / '.metadata'} places data in {relative_path!r}, which "
                    f"is not a file of its checkpoint directory; refusing to read it.")
            self._check_length(shard, items)
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except CheckpointError:
                raise
            except Exception as exc:
                if refused_global(exc) is not None:
                    raise  # not corrupt: an object torch.load(weights_only=True) refuses
                raise CheckpointError(
                    f"Shard file {shard} cannot be read: it is truncated or corrupt. Load an "
                    f"earlier checkpoint. ({type(exc).__name__}: {str(exc)[:300]})") from exc
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _check_length(self, shard: Path, items: list[Any]) -> None:
        """A shard shorter than the data ``.metadata`` places in it is truncated."""
        needed = max(self.storage_data[i.storage_index].offset
                     + self.storage_data[i.storage_index].length for i in items)
        size = shard.stat().st_size  # FileNotFoundError names the file: left as it is
        if size < needed:
            raise CheckpointError(
                f"Shard file {shard} is truncated: {size} bytes, but its checkpoint's .metadata "
                f"places data up to byte {needed}. Load an earlier checkpoint.")


# ---------------------------------------------------------------- Composer's checkpoints
class _ComposerObject:
    """Stand-in for a Composer class instance while unpickling: torch's restricted unpickler
    creates it (``NEWOBJ``, ``cls.__new__`` only) and hands it the pickled attributes
    (``BUILD`` -> :meth:`__setstate__`, which only stores them); nothing of Composer's runs.
    :func:`from_composer_objects` turns it into the cadence object afterwards."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"{type(self).__name__}: expected a dict of attributes, "
                                         f"got {type(state).__name__}")
        self.attributes = dict(state)


class _ComposerTimestamp(_ComposerObject):
    """``composer.core.time.Timestamp``: attributes ``_epoch``, ``_batch``... (``Time``) and
    ``_total_wct``... (``timedelta``)."""


class _ComposerTime(_ComposerObject):
    """``composer.core.time.Time``: attributes ``_value`` and ``_unit`` (a ``TimeUnit``)."""


def _time_unit(value: str) -> Any:
    """``composer.core.time.TimeUnit(value)`` (an Enum pickles as a call with its value):
    cadence's ``TimeUnit`` of the same value ("ep", "ba", "sp", "tok", "dur", "iter")."""
    if not isinstance(value, str):
        raise pickle.UnpicklingError(f"TimeUnit({value!r}): expected a string value")
    return TimeUnit(value)


def _np_reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    """``numpy.core.multiarray._reconstruct`` for plain arrays only (how an ndarray pickles:
    an empty array, then its bytes through ``ndarray.__setstate__``)."""
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"numpy array of type {subtype!r}: only numpy.ndarray")
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct

    return _reconstruct(np.ndarray, shape, dtype)


def _np_dtype(spec: Any, align: bool = False, copy: bool = False) -> Any:
    """``numpy.dtype`` of numbers and booleans only: an object dtype would let the array's
    ``__setstate__`` hold arbitrary Python objects."""
    dtype = np.dtype(spec, align, copy)
    if dtype.kind not in "biuf":
        raise pickle.UnpicklingError(f"numpy dtype {dtype} is not allowed in a checkpoint "
                                     f"(numbers and booleans only)")
    return dtype


#: The globals a ``full`` checkpoint written by Composer 0.32.1's ``Trainer`` pickles beyond
#: what ``torch.load(weights_only=True)`` admits by itself: pickled name -> (what stands in
#: for it here, why a Composer checkpoint holds it). Anything else stays refused.
COMPOSER_GLOBALS: dict[str, tuple[Any, str]] = {
    "composer.core.time.Timestamp": (
        _ComposerTimestamp, "State.timestamp is pickled as the object (the run's position)"),
    "composer.core.time.Time": (
        _ComposerTime, "the counters inside a pickled Timestamp (epoch, batch, sample...)"),
    "composer.core.time.TimeUnit": (
        _time_unit, "the unit of each pickled Time (an Enum: rebuilt from its string value)"),
    "datetime.timedelta": (
        datetime.timedelta, "the Timestamp's wall-clock fields (total_wct, batch_wct...), "
                            "also in CheckpointSaver's state; three integers"),
    "torch.torch_version.TorchVersion": (
        torch.torch_version.TorchVersion, "state.metadata.torch_version (a str subclass)"),
    "numpy._core.multiarray._reconstruct": (
        _np_reconstruct, "rng[rank].numpy: np.random.get_state()'s key array (numpy >= 2)"),
    "numpy.core.multiarray._reconstruct": (
        _np_reconstruct, "the same, as numpy 1.x names it"),
    "numpy.ndarray": (np.ndarray, "the class of that key array"),
    "numpy.dtype": (_np_dtype, "its dtype (uint32); numbers and booleans only"),
    # A dtype pickles as numpy.dtype(...) then BUILD with its byte order: torch's unpickler
    # BUILDs only instances of admitted classes, so the numeric dtype classes are listed too.
    **{f"numpy.dtypes.{type(np.dtype(c)).__name__}": (
        type(np.dtype(c)), "the class of an admitted dtype (BUILD sets its byte order)")
       for c in "?bBhHiIlLqQefd"},
}


@contextlib.contextmanager
def composer_globals() -> Iterator[None]:
    """Within the block, ``torch.load(weights_only=True)`` also admits
    :data:`COMPOSER_GLOBALS` (as their stand-ins); everything else it refused before, it
    still refuses. (torch keeps this list per process: a load in another thread meanwhile
    admits these few data types too, and nothing else.)"""
    with torch.serialization.safe_globals([(obj, name) for name, (obj, _) in
                                           COMPOSER_GLOBALS.items()]):
        yield


def from_composer_objects(obj: Any) -> Any:
    """``obj`` with the stand-ins of :func:`composer_globals` replaced by cadence objects:
    a Composer ``Timestamp`` becomes :class:`cadence.core.time.Timestamp`, a ``Time``
    :class:`cadence.core.time.Time`; containers are rebuilt, everything else is returned as
    it is.

    Raises:
        CheckpointError: a stand-in lacks an attribute cadence needs (not a Composer 0.32
            object).
    """
    if isinstance(obj, _ComposerTime):
        attrs = obj.attributes
        if "_value" not in attrs or "_unit" not in attrs:
            raise CheckpointError(f"A pickled composer Time has attributes {sorted(attrs)}, "
                                  f"not _value and _unit.")
        return Time(attrs["_value"], attrs["_unit"])
    if isinstance(obj, _ComposerTimestamp):
        fields = {}
        for key, value in obj.attributes.items():
            value = from_composer_objects(value)
            fields[key.lstrip("_")] = value.value if isinstance(value, Time) else value
        return Timestamp.from_state_dict(fields)
    if isinstance(obj, dict):
        out = {k: from_composer_objects(v) for k, v in obj.items()}
        return type(obj)(out) if type(obj) is not dict else out
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_composer_objects(v) for v in obj)
    return obj
