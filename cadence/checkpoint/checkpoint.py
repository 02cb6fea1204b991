"""Save and load a run's checkpoint, ``full`` or ``sharded``, from any world size to any other.

What a checkpoint holds: the model; the optimizer state (keyed by parameter name, so it
loads on any number of ranks); schedulers; the timestamp (which is also the data position);
every rank's RNG state; algorithm and callback state; and metadata (cadence and torch
versions, world size, format, the run's config, and for a ``HuggingFaceModel`` its
``transformers`` config and tokenizer, so ``cadence convert`` can export it).

Formats:

- ``full``: one file written by rank 0, the model and optimizer gathered to CPU
  (``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True``), in Composer's
  layout (``{"state": {...}, "rng": [...]}``, :mod:`~cadence.checkpoint.layout`). Loading:
  rank 0 reads it and broadcasts into the (possibly sharded) model (``broadcast_from_rank0``);
  cadence's older flat layout and a file written by Composer 0.32 load too.
- ``sharded``: a ``torch.distributed.checkpoint`` (DCP) directory, each rank writing its own
  shards, plus ``extra.pt`` (timestamp, schedulers, RNG, metadata) from rank 0. DCP reshards
  on load, so N ranks' checkpoint loads on M ranks.

Integrity (see :mod:`~cadence.checkpoint.manifest`,
:mod:`~cadence.checkpoint.safe_unpickle`, :mod:`~cadence.checkpoint.writing`):

- No code runs from a checkpoint: every ``torch.load`` here uses ``weights_only=True`` (DCP's
  own pickled values included, through :class:`SafeLoadPlanner`), and DCP's ``.metadata`` is
  read by :class:`~cadence.checkpoint.safe_unpickle.SafeFileSystemReader`.
- No corrupt byte loads silently: each file's CRC32C is computed while it is written and
  stored with it (a full file's in its zip comment, a sharded directory's in
  ``manifest.json``); loading checks every file before any tensor is used (after the
  restricted unpickling, so a hostile file is reported as such). A checkpoint without
  checksums (its manifest or zip comment removed, or written before cadence had them) is
  refused unless ``require_checksums=False``; then it loads with a warning.
- Strict loads (:mod:`~cadence.checkpoint.model_fit`): with ``strict`` (default) the model's
  keys and shapes must match the checkpoint's, checked before any tensor is loaded.
- A failed save removes its temporary on every rank and says which file it was writing and
  which checkpoint is intact.

Source: PyTorch DCP docs; torchtitan's checkpointing.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import logging
import os
import secrets
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_optimizer_state_dict, set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from cadence.utils import dist
from cadence._version import __version__
from cadence.checkpoint.adapter_only import (
    METADATA_KEY, adapter_metadata, base_mismatch, model_state_dict, saves_adapters_only,
)
from cadence.checkpoint.data_position import load_data_position, save_data_position
from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.files import (
    EXTRA_FILE, METADATA_FILE, TMP_MARK, is_complete, remove_checkpoint, temporary_path,
)
from cadence.checkpoint.manifest import verify_checkpoint
from cadence.checkpoint.metrics_state import load_metrics_state, metrics_state
from cadence.checkpoint.model_fit import model_mismatch, shapes_of
from cadence.checkpoint.optim_state import set_full_optimizer_state
from cadence.utils.rng import get_rng_state, set_rng_state
from cadence.checkpoint.layout import (
    drop_paths, first_value, is_composer_written, not_a_checkpoint, to_file, to_flat,
)
from cadence.checkpoint.safe_unpickle import (
    SafeFileSystemReader, composer_globals, refused_global,
)
from cadence.checkpoint.writing import (
    raise_if_save_failed, write_full_file, write_sharded_dir,
)
from cadence.core.state import State
from cadence.core.time import Timestamp

__all__ = ["FORMATS", "CheckpointError", "SafeLoadPlanner", "collect_checkpoint",
           "describe_dcp_failure", "load_checkpoint", "load_verified", "not_loadable",
           "read_metadata", "rename_into_place", "safe_torch_load", "save_checkpoint",
           "state_keys", "verify"]

FORMATS = ("full", "sharded")

log = logging.getLogger(__name__)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor values load with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


@contextlib.contextmanager
def _single_process_dcp() -> Any:
    """DCP warns on every call without a process group; in one process that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable "
                                                  "or uninitialized", category=UserWarning)
        yield


def _options(full: bool, strict: bool = True, broadcast: bool = False,
             frozen: bool = True) -> StateDictOptions:
    """``frozen=False``: leave out frozen parameters (adapter-only checkpoints)."""
    return StateDictOptions(full_state_dict=full, cpu_offload=full, strict=strict,
                            broadcast_from_rank0=broadcast, ignore_frozen_params=not frozen)


def _full_tensors(obj: Any) -> Any:
    """``obj`` with DTensors gathered to plain CPU tensors (a collective: all ranks call it)."""
    if isinstance(obj, DTensor):
        return obj.full_tensor().cpu()
    if isinstance(obj, dict):
        return {k: _full_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_full_tensors(v) for v in obj)
    return obj


def state_keys(objects: Sequence[Any]) -> list[str]:
    """Checkpoint keys of algorithms / callbacks: the class name, with ``#2``, ``#3``... for
    further instances of the same class (so two EarlyStoppers keep their own state)."""
    seen: dict[str, int] = {}
    keys = []
    for obj in objects:
        name = type(obj).__qualname__
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


def _named_states(objects: Sequence[Any]) -> dict[str, Any]:
    return {key: obj.state_dict() for key, obj in zip(state_keys(objects), objects)}


def _metadata(state: State, fmt: str, extra: Optional[dict[str, Any]]) -> dict[str, Any]:
    meta = {"cadence_version": __version__, "torch_version": str(torch.__version__),
            "world_size": dist.get_world_size(), "format": fmt, "run_name": state.run_name,
            "rank_zero_seed": state.rank_zero_seed}
    meta.update(extra or {})
    meta.update(adapter_metadata(state.model))
    return meta


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(state: State, path: Path, fmt: str = "full", weights_only: bool = False,
                    metadata: Optional[dict[str, Any]] = None, checksums: bool = True,
                    upload: Optional[Callable[[Path], None]] = None,
                    ignore_keys: Any = None) -> Path:
    """Write a checkpoint of ``state`` at ``path`` (a ``.pt`` file for ``full``, a directory
    for ``sharded``), atomically: written under a temporary name, renamed when every rank
    is done. Call on every rank.

    Args:
        checksums: record each file's CRC32C, computed while writing (default). Off only
            to measure what it costs.
        upload: called on every rank with the finished temporary once every rank's part is
            written, before the rename (a remote ``save_folder`` uploads this rank's files
            there, :mod:`~cadence.checkpoint.remote`); a failure on any rank fails
            the save on every rank as a write failure does.
        ignore_keys: for ``full``, what to leave out of the file (Composer's
            ``save_ignore_keys``: glob patterns over key paths in the file layout, or a
            callable editing it; :func:`~cadence.checkpoint.layout.drop_paths`).

    Raises:
        ValueError: unknown ``fmt``; ``ignore_keys`` with ``sharded``.
        CheckpointWriteError: writing failed on some rank (e.g. no space left on device); the
            temporary was removed and the previous checkpoint is intact.
    """
    if ignore_keys and fmt != "full":
        raise ValueError("save_ignore_keys applies to full checkpoints only, not sharded ones.")
    tensors, extra = collect_checkpoint(state, fmt, weights_only, metadata)
    full = fmt == "full"
    token = [secrets.token_hex(4)]
    dist.broadcast_object_list(token)
    tmp = temporary_path(path, state.run_name, token[0])
    rank0 = dist.get_global_rank() == 0
    _write_temporary(tensors, extra, path, tmp, full, state.run_name, checksums, ignore_keys)
    if upload is not None:
        failure: Optional[BaseException] = None
        try:
            upload(tmp)
        except Exception as exc:
            failure = exc
        raise_if_save_failed(failure, tmp, path)
    if rank0:
        rename_into_place(tmp, path)
    dist.barrier()
    return path


def collect_checkpoint(state: State, fmt: str, weights_only: bool = False,
                       metadata: Optional[dict[str, Any]] = None, gather: bool = True
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a checkpoint of ``state`` holds, as ``(tensors, extra)`` (a collective: call on
    every rank). ``tensors``: model, optimizers, algorithm and callback state (for ``full``
    gathered to CPU, the full tensors on rank 0); ``extra``: metadata, timestamp, schedulers,
    every rank's RNG state, the data position. The values may share memory with the live
    model (copy them before training on, as the asynchronous save does).

    Args:
        gather: for ``full``, gather the tensors to rank 0 (default). False: leave them
            sharded (DTensors, the same keys), for the caller to gather (the asynchronous
            save does, in its writer thread: :mod:`~cadence.checkpoint.cpu_staging`).

    Raises:
        ValueError: unknown ``fmt``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"checkpoint format {fmt!r} is not one of: {', '.join(FORMATS)}.")
    full = fmt == "full" and gather
    frozen = not saves_adapters_only(state.model)
    model_sd = model_state_dict(state.model, _options(full, frozen=frozen))
    tensors: dict[str, Any] = {"model": model_sd}
    if not weights_only:
        # a full file keys them by class name as Composer does; DCP keeps the index (the
        # sharded layout is unchanged, so older sharded checkpoints load)
        names = state_keys(state.optimizers) if fmt == "full" else [
            str(i) for i in range(len(state.optimizers))]
        tensors["optimizers"] = {
            name: get_optimizer_state_dict(state.model, opt, options=_options(full))
            for name, opt in zip(names, state.optimizers)}
        tensors["algorithms"] = _named_states(state.algorithms)
        tensors["callbacks"] = _named_states(state.callbacks)
        if full:
            tensors["algorithms"] = _full_tensors(tensors["algorithms"])
            tensors["callbacks"] = _full_tensors(tensors["callbacks"])
    extra: dict[str, Any] = {"metadata": _metadata(state, fmt, metadata),
                             "timestamp": state.timestamp.state_dict()}
    if not weights_only:
        extra["schedulers"] = _named_states(state.schedulers)
        extra["rng"] = dist.all_gather_object(get_rng_state())
        extra["data"] = save_data_position(state)  # the train dataloader's epoch, per rank
        if getattr(state, "save_metrics", False):
            extra.update(metrics_state(state))
    return tensors, extra


def rename_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished temporary ``tmp`` to the checkpoint's final ``path`` (rank 0,
    once every rank's part is on disk), replacing a checkpoint of that name (the caller
    checked it may), and sync the folder."""
    if path.is_dir() or (path.exists() and tmp.is_dir()):  # overwrite; the caller checked
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    os.replace(tmp, path)  # over a file, atomic: the old one is readable until replaced
    _fsync_dir(path.parent)


def _write_temporary(tensors: dict[str, Any], extra: dict[str, Any], path: Path, tmp: Path,
                     full: bool, run_name: str, checksums: bool, ignore_keys: Any = None) -> None:
    """Write the checkpoint under ``tmp`` (rank 0 for ``full``, every rank for ``sharded``);
    when this returns, every rank's part is on disk. A failure anywhere removes ``tmp`` and
    raises on every rank (:func:`~cadence.checkpoint.writing.raise_if_save_failed`)."""
    failure: Optional[BaseException] = None
    try:
        if full:
            if dist.get_global_rank() == 0:
                obj = to_file({**tensors, **extra})
                if ignore_keys:
                    drop_paths(obj, ignore_keys)
                write_full_file(obj, path, tmp, run_name, checksums)
        else:
            with _single_process_dcp():
                write_sharded_dir(tensors, extra, tmp, run_name, checksums)
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        failure = exc
    except BaseException:  # interrupted: no collective, just do not leave the temporary
        if dist.get_global_rank() == 0:
            remove_checkpoint(tmp)
        raise
    raise_if_save_failed(failure, tmp, path)


def not_loadable(path: Path) -> str:
    """Why ``path`` (not :func:`~cadence.checkpoint.files.is_complete`) cannot be
    loaded, naming it and what to do."""
    if TMP_MARK in path.name:
        return (f"{path} is the temporary of an unfinished save ('{TMP_MARK}' in its name); load "
                f"the checkpoint that the latest-* pointer in its folder names.")
    if not path.exists():
        return f"Checkpoint {path} does not exist."
    if path.is_dir():
        missing = [n for n in (METADATA_FILE, EXTRA_FILE) if not (path / n).is_file()]
        return (f"Sharded checkpoint directory {path} has no {' or '.join(missing)}: its save did "
                f"not finish, or it is not a cadence checkpoint. Load an earlier checkpoint.")
    return f"Checkpoint file {path} is empty (its save did not finish); load an earlier one."


def describe_dcp_failure(exc: BaseException) -> str:
    """A one-line-per-rank summary of a DCP failure (``CheckpointException`` is a
    ``BaseException`` whose ``str`` is every rank's whole traceback): ``rank 0:
    FileNotFoundError: ... '<dir>/__0_0.distcp'``."""
    def one(err: BaseException) -> str:
        if isinstance(err, CheckpointError):  # raised by SafeFileSystemReader: names the file
            return str(err)
        refused = refused_global(err)
        if refused is not None:
            return (f"it holds an object that is not allowed in a checkpoint "
                    f"(torch.load(weights_only=True) refuses {refused})")
        return f"{type(err).__name__}: {str(err)[:300]}"

    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {rank}: {one(err)}" for rank, (err, _) in
                         sorted(exc.failures.items()))
    return one(exc)


def _optimizer_mismatch(path: Path, optimizer: Optional[torch.optim.Optimizer],
                        detail: str) -> str:
    """The message for a checkpoint whose optimizer state does not fit the run's optimizer
    (another optimizer class, or SGD with momentum against one without)."""
    which = f" ({type(optimizer).__name__})" if optimizer is not None else ""
    return (f"The optimizer state in {path} does not fit this run's optimizer{which}: "
            f"{detail[:400].rstrip('.')}. If the run's optimizer changed (e.g. AdamW to SGD), "
            f"start from the checkpoint's weights only: load_weights_only=True, or "
            f"load_ignore_keys=['optimizers'] to keep its schedulers and timestamp.")


def _torch_reason(exc: BaseException) -> str:
    """What ``torch.load`` said, without its advice to retry with ``weights_only=False``
    (never passed on: that would run the file's code)."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation")[0]
    elif "trusted source." in text:
        text = text.split("trusted source.", 1)[1].split("Check the documentation")[0]
    if "weights_only" in text or not text.strip():
        text = "it cannot be unpickled safely"
    return f"{type(exc).__name__}: {' '.join(text.split())[:300]}"


def safe_torch_load(path: Path, mmap: bool = False, composer: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` to CPU (``mmap``: memory-mapped), rank-local.
    ``composer``: also admit the few data types a checkpoint written by Composer pickles
    (:func:`~cadence.checkpoint.safe_unpickle.composer_globals`).

    Raises:
        CheckpointError: the file is missing, is not a checkpoint (not a ``torch.save``
            file: a raw pickle, a text file...), is truncated or corrupt, or holds an object
            that is not allowed in a checkpoint (the message names the file and what to do;
            it never suggests loading with ``weights_only=False``).
    """
    try:
        with composer_globals() if composer else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path} does not exist.") from None
    except Exception as exc:  # truncated zip, bad pickle, disallowed global
        refused = refused_global(exc)
        if refused is not None:
            raise CheckpointError(
                f"Checkpoint file {path} holds an object that is not allowed in a checkpoint "
                f"(torch.load(weights_only=True) refuses {refused}); it was not loaded and "
                f"nothing in it ran. Checkpoints hold tensors and plain Python values only: "
                f"return those from state_dict(), and do not load a file you do not trust."
            ) from None
        try:
            with open(path, "rb") as f:
                head = f.read(4)
        except OSError:
            head = b""
        if head[:2] != b"PK":  # not a zip: torch.save never wrote it
            what = "a raw pickle" if head[:1] == b"\x80" else "not a torch.save file"
            raise CheckpointError(
                f"{path} is not a checkpoint ({what}: a checkpoint is a zip archive written "
                f"by torch.save); it was not loaded and nothing in it ran. Give the path of a "
                f"checkpoint (.pt) or of a sharded checkpoint folder.") from None
        if "Weights only load failed" in str(exc) or "WeightsUnpickler" in str(exc):
            raise CheckpointError(
                f"Checkpoint file {path} holds objects a checkpoint must not hold "
                f"(torch.load(weights_only=True) refuses it: {_torch_reason(exc)}); it was "
                f"not loaded and nothing in it ran. Do not load a file you do not trust."
            ) from None
        raise CheckpointError(
            f"Checkpoint file {path} cannot be read: it is truncated or corrupt. Load an "
            f"earlier checkpoint. ({_torch_reason(exc)})"
        ) from None


def read_metadata(path: Path) -> dict[str, Any]:
    """The metadata of the checkpoint at ``path`` (rank-local read; no collective).

    Raises:
        CheckpointError: ``path`` is not a complete checkpoint or cannot be read.
    """
    path = Path(path)
    if not is_complete(path):
        raise CheckpointError(not_loadable(path))
    # a full file is memory-mapped: reading its metadata does not read its tensors
    if path.is_dir():
        return dict(safe_torch_load(path / EXTRA_FILE, mmap=False)["metadata"])
    return dict(to_flat(safe_torch_load(path, mmap=True, composer=True), path)["metadata"])


def verify(path: Path, part: tuple[int, int] = (0, 1), require: bool = False) -> None:
    """Check the checkpoint at ``path`` against the CRC32Cs written with it (rank-local;
    ``part`` ``(index, count)`` checks every ``count``-th file from ``index``); a checkpoint
    without checksums is refused (``require``) or logged as unverified.

    Raises:
        CheckpointError: a file is missing or differs from its manifest (names the file);
            with ``require``, the checkpoint has no checksums.
    """
    path = Path(path)
    if verify_checkpoint(path, part):
        return
    where = "no manifest.json in it" if path.is_dir() else "no CRC32C in its zip comment"
    if require:
        raise CheckpointError(
            f"Checkpoint {path} has no checksums ({where}): cadence writes them with every "
            f"checkpoint, so they were removed or lost, or it was written before cadence had "
            f"them; its bytes cannot be verified, so it is refused. If you trust this file, "
            f"set require_checksums: false (Trainer(require_checksums=False)) to load it "
            f"unverified.")
    if part[0] == 0:
        log.warning("Checkpoint %s has no checksums (%s): it was written before cadence had "
                    "them, or they were lost; it loads unverified.", path,
                    "no manifest.json in it" if path.is_dir() else "no CRC32C in its zip comment")


def load_verified(path: Path, checksums: bool, require: bool = False) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` the full file at ``path`` while a thread checks its
    CRC32C (the two overlap: CRC32C runs without the GIL); returns when both are done, so no
    tensor is used unverified. The unpickler's verdict is reported first, so a hostile file
    is named as such rather than as corrupt. Returns the checkpoint in the flat layout
    (:func:`~cadence.checkpoint.layout.to_flat`), whichever layout the file has: cadence's,
    cadence's older one, or Composer's (a file Composer wrote has no checksums: it loads
    with a warning, ``require`` notwithstanding).

    Args:
        path: a ``full`` checkpoint file.
        checksums: check its CRC32C (False: only load it).
        require: refuse it when it has no CRC32C (``require_checksums``).

    Raises:
        CheckpointError: as :func:`safe_torch_load`, or the file differs from its CRC32C.
    """
    if not checksums:
        return to_flat(safe_torch_load(path, composer=True), path)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify") as pool:
        verified = pool.submit(verify_checkpoint, path, (0, 1))
        loaded = safe_torch_load(path, composer=True)  # on error, leaving waits for the thread
    if not verified.result():  # no checksums in it (a mismatch raised above)
        if is_composer_written(loaded):
            log.warning("Checkpoint %s was written by Composer, which records no checksums: "
                        "it loads unverified.", path)
        else:
            verify(path, (0, 1), require)  # refuses, or warns, as for any checkpoint
    return to_flat(loaded, path)


def _all_ranks(check: Any) -> Any:
    """Run the rank-local ``check()``; if it raised CheckpointError on any rank, raise the
    first rank's message on every rank (so none waits in a later collective)."""
    result, error = None, None
    try:
        result = check()
    except CheckpointError as exc:
        error = str(exc)
    errors = [e for e in dist.all_gather_object(error) if e is not None]
    if errors:
        raise CheckpointError(errors[0])
    return result


def _drop_ignored(sd: dict[str, Any], prefix: str, ignore: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in sd.items()
            if not any(fnmatch.fnmatchcase(f"{prefix}/{k}", pat) for pat in ignore)}


def _ignored(key: str, ignore: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pat) for pat in ignore)


def load_checkpoint(state: State, path: Path, weights_only: bool = False, strict: bool = True,
                    ignore_keys: Sequence[str] = (), checksums: bool = True,
                    require_checksums: bool = True) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``state`` (call on every rank).

    Args:
        state: the run's state; its model may be sharded differently from the checkpoint's.
        path: a full ``.pt`` file or a sharded directory.
        weights_only: load the model only (fresh optimizer, schedulers and timestamp).
        strict: the model's keys must match the checkpoint's exactly (checked before any
            tensor loads; shapes must match even when not strict).
        ignore_keys: glob patterns of what to skip: ``model/<parameter name>`` (e.g.
            ``model/model.classifier.*``), ``optimizers``, ``schedulers``, ``timestamp``,
            ``rng``, ``algorithms/<Class>``, ``callbacks/<Class>``.
        checksums: check every file against the CRC32Cs written with it before any tensor
            is used (default). Off only to measure what it costs.
        require_checksums: refuse a checkpoint without checksums (default); False loads one
            (e.g. written before cadence had them) unverified, with a warning.

    Returns:
        The checkpoint's metadata.

    Raises:
        CheckpointError: missing, truncated or corrupt file, missing shard, a file that
            differs from its checksum manifest, an object that is not allowed in a
            checkpoint, or a checkpoint that does not fit the model (the message names the
            file).
    """
    path = Path(path)
    if not is_complete(path):
        raise CheckpointError(not_loadable(path))
    if path.is_dir():
        return _load_sharded(state, path, weights_only, strict, ignore_keys, checksums,
                             require_checksums)
    return _load_full(state, path, weights_only, strict, ignore_keys, checksums,
                      require_checksums)


def _load_full(state: State, path: Path, weights_only: bool, strict: bool,
               ignore_keys: Sequence[str], checksums: bool, require: bool) -> dict[str, Any]:
    rank0 = dist.get_global_rank() == 0
    error: list[Any] = [None]
    loaded: Any = None
    shapes = {frozen: shapes_of(model_state_dict(state.model, _options(False, frozen=frozen)))
              for frozen in (True, False)}
    if rank0:
        try:
            loaded = load_verified(path, checksums, require)
            if not isinstance(loaded.get("model"), dict):
                raise CheckpointError(not_a_checkpoint(path))
            meta = dict(loaded.get("metadata") or {})
            error[0] = base_mismatch(path, meta, state.model) or model_mismatch(
                path, shapes_of(loaded["model"]), shapes[not meta.get(METADATA_KEY)], strict,
                ignore_keys)
        except CheckpointError as exc:
            error[0] = str(exc)
    dist.broadcast_object_list(error)
    if error[0] is not None:
        raise CheckpointError(error[0])
    # Rank 0 holds the tensors; the rest of the checkpoint is small: broadcast it.
    small = [None]
    if rank0:
        small[0] = {k: v for k, v in loaded.items() if k not in ("model", "optimizers")}
    dist.broadcast_object_list(small)
    rest: dict[str, Any] = small[0]  # type: ignore[assignment]
    broadcast = dist.get_world_size() > 1
    model_sd = _drop_ignored(loaded["model"], "model", ignore_keys) if rank0 else {}
    adapters = bool(rest["metadata"].get(METADATA_KEY))  # checked strictly above
    try:
        set_model_state_dict(state.model, model_sd,
                             options=_options(True, strict=strict and not ignore_keys
                                              and not adapters, broadcast=broadcast))
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"The model in {path} does not fit this run's model: {exc}") from exc
    if not weights_only:
        if not _ignored("optimizers", ignore_keys):
            for i, optimizer in enumerate(state.optimizers):
                optim_sd = first_value(loaded.get("optimizers"), i) if rank0 else {}
                if optim_sd is None:
                    raise CheckpointError(_optimizer_mismatch(
                        path, optimizer, f"the checkpoint has no optimizer #{i + 1}"))
                try:
                    set_full_optimizer_state(state.model, optimizer, optim_sd, broadcast)
                except (AssertionError, KeyError, RuntimeError, ValueError) as exc:
                    raise CheckpointError(_optimizer_mismatch(
                        path, optimizer, f"{type(exc).__name__}: {exc}")) from exc
        _restore_rest(state, rest, ignore_keys)
    return dict(rest["metadata"])


def _read_sharded_parts(reader: SafeFileSystemReader, path: Path, checksums: bool,
                        require: bool, model_shapes: dict[bool, dict[str, Any]],
                        strict: bool, ignore_keys: Sequence[str], model: Any = None
                        ) -> dict[str, Any]:
    """Rank-local checks before DCP reads a shard: ``.metadata`` through the restricted
    unpickler, ``extra.pt`` with ``weights_only``, then this rank's share of the checksums
    (ranks split the files), then whether the model fits (``model_shapes``:
    :func:`~cadence.checkpoint.model_fit.model_mismatch`; ``model_shapes[frozen]``, without
    the frozen parameters for an adapter-only checkpoint, whose base is checked against
    ``model``'s). Returns ``extra.pt``'s contents."""
    metadata = reader.read_metadata()
    extra = safe_torch_load(path / EXTRA_FILE)
    if checksums:
        verify(path, part=(dist.get_global_rank(), dist.get_world_size()), require=require)
    saved = {key[len("model."):]: tuple(getattr(meta, "size", None) or ()) or None
             for key, meta in metadata.state_dict_metadata.items() if key.startswith("model.")}
    meta = dict(extra.get("metadata") or {})
    mismatch = base_mismatch(path, meta, model) or model_mismatch(
        path, saved, model_shapes[not meta.get(METADATA_KEY)], strict, ignore_keys)
    if mismatch is not None:
        raise CheckpointError(mismatch)
    return extra


def _load_sharded(state: State, path: Path, weights_only: bool, strict: bool,
                  ignore_keys: Sequence[str], checksums: bool, require: bool) -> dict[str, Any]:
    reader = SafeFileSystemReader(str(path))
    model_sds = {frozen: model_state_dict(state.model, StateDictOptions(
        ignore_frozen_params=not frozen)) for frozen in (True, False)}
    shapes = {k: shapes_of(v) for k, v in model_sds.items()}
    dims = getattr(state, "parallel_dims", None)
    if dims is not None and dims.pp_enabled:  # each rank holds its stages: the model is all
        shapes = {k: {key: shape for part in dist.all_gather_object(v)  # ranks' keys together
                      for key, shape in part.items()} for k, v in shapes.items()}
    extra = _all_ranks(lambda: _read_sharded_parts(
        reader, path, checksums, require, shapes, strict, ignore_keys, state.model))
    adapters = bool(extra["metadata"].get(METADATA_KEY))
    model_sd = model_sds[not adapters]
    template: dict[str, Any] = {"model": _drop_ignored(model_sd, "model", ignore_keys)}
    if not weights_only:
        if not _ignored("optimizers", ignore_keys):
            template["optimizers"] = {str(i): get_optimizer_state_dict(state.model, opt)
                                      for i, opt in enumerate(state.optimizers)}
        for kind in ("algorithms", "callbacks"):
            named = {k: v for k, v in _named_states(getattr(state, kind)).items()
                     if v and not _ignored(f"{kind}/{k}", ignore_keys)}
            if named:
                template[kind] = named
    # under a pipeline each rank's param_groups name its own stages' parameters, but DCP
    # keeps one copy of a non-tensor entry: the groups' hyperparameters are read, the
    # parameters each group holds stay this rank's
    local_groups = ({i: [list(g["params"]) for g in sd["param_groups"]]
                     for i, sd in template.get("optimizers", {}).items()}
                    if dims is not None and dims.pp_enabled else {})
    try:
        with _single_process_dcp():
            dcp.load(template, storage_reader=reader, no_dist=not dist.is_initialized(),
                     planner=SafeLoadPlanner(allow_partial_load=not strict or bool(ignore_keys)))
    except (Exception, CheckpointException) as exc:  # a missing shard file, a missing key...
        failure = describe_dcp_failure(exc)
        if "Missing key in checkpoint state_dict: optimizers." in failure:
            raise CheckpointError(_optimizer_mismatch(path, None, failure)) from exc
        raise CheckpointError(f"Cannot load sharded checkpoint {path}: {failure}") from exc
    set_model_state_dict(state.model, template["model"],
                         options=_options(False, strict=strict and not ignore_keys
                                          and not adapters))
    for i, groups in local_groups.items():
        for group, params in zip(template["optimizers"][i]["param_groups"], groups):
            group["params"] = params
    if not weights_only:
        for i, optimizer in enumerate(state.optimizers):
            if "optimizers" in template:
                set_optimizer_state_dict(state.model, optimizer, template["optimizers"][str(i)])
        rest = {k: v for k, v in extra.items()}
        for kind in ("algorithms", "callbacks"):
            rest[kind] = template.get(kind, {})
        _restore_rest(state, rest, ignore_keys)
    return dict(extra["metadata"])


def _restore_rest(state: State, rest: dict[str, Any], ignore_keys: Sequence[str]) -> None:
    """Schedulers, timestamp, this rank's RNG, algorithm and callback state."""
    if not _ignored("schedulers", ignore_keys):
        saved = rest.get("schedulers") or []  # by class name; a list before
        schedulers = list(saved.values()) if isinstance(saved, dict) else list(saved)
        if len(schedulers) != len(state.schedulers):
            raise CheckpointError(f"The checkpoint has {len(schedulers)} schedulers, this run "
                                  f"{len(state.schedulers)}; load with load_weights_only.")
        for scheduler, sd in zip(state.schedulers, schedulers):
            scheduler.load_state_dict(sd)
    if not _ignored("timestamp", ignore_keys):
        state.timestamp = Timestamp.from_state_dict(rest["timestamp"])
    rng = rest.get("rng") or []
    rank = dist.get_global_rank()
    if not _ignored("rng", ignore_keys) and rank < len(rng):
        set_rng_state(rng[rank])  # elastic runs: new ranks keep their fresh seeds
    if not _ignored("data", ignore_keys):
        load_data_position(state, rest.get("data"))  # used by the next epoch's iterator
    if not _ignored("train_metrics", ignore_keys):
        load_metrics_state(state, rest)  # saved with save_metrics; else nothing to restore
    for kind in ("algorithms", "callbacks"):
        saved = rest.get(kind, {})
        objects = getattr(state, kind)
        for key, obj in zip(state_keys(objects), objects):
            if key in saved and not _ignored(f"{kind}/{key}", ignore_keys):
                obj.load_state_dict(saved[key])
