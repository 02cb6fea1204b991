"""Composer's checkpoint functions, ``save_checkpoint`` and ``load_checkpoint``, over cadence's.

A Composer user's direct calls keep working after renaming ``composer`` to ``cadence``::

    from cadence.utils.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(trainer.state, "ep{epoch}-ba{batch}-rank{rank}")
    load_checkpoint(path, other_trainer.state, other_trainer.logger)

Both are thin adapters: the checkpoint is written and read by
:func:`cadence.checkpoint.checkpoint.save_checkpoint` and
:func:`cadence.checkpoint.checkpoint.load_checkpoint`, so it is a cadence checkpoint with
everything that implies (atomic write, CRC32C checksums checked before any tensor is used,
``torch.load(weights_only=True)`` only, loadable on another number of ranks, readable by the
Trainer's ``load_path`` and by ``cadence convert``). A ``full`` file has Composer's layout
(``torch.load(path, weights_only=True)["state"]["model"]``,
:mod:`cadence.checkpoint.layout`), and a ``full`` file written by Composer 0.32 itself loads
here too (its pickled objects read by a restricted unpickler).

Differences from Composer (also in each function's docstring):

- A ``sharded`` checkpoint is one directory named by ``filename`` (DCP files, cadence's
  ``extra.pt`` and ``manifest.json``), not Composer's
  ``<sharded_ckpt_prefix_dir>/__<rank>_0.distcp``.
- ``load_checkpoint``'s ``ignore_keys`` are glob patterns only (Composer's callable is
  refused), over cadence's key space; Composer's ``state/...`` spellings are translated (see
  :func:`load_checkpoint`). ``save_checkpoint`` takes Composer's (patterns over the file's
  key paths, or a callable editing the file's dict) for ``full`` checkpoints only.
- ``load_checkpoint`` restores the RNG itself (cadence's loader does); what it returns is
  the list of RNG states that the ranks hold after the load, in cadence's format.

Source: the API of Composer's ``composer.utils.checkpoint`` (signatures, filename fields,
return values); the checkpoint itself is cadence's (:mod:`cadence.checkpoint`).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import cadence.checkpoint.checkpoint as _impl
from cadence.checkpoint.object_store import _download, check_object_store, fetched_from_store
from cadence.checkpoint.remote import RemoteFolder, fetched, is_remote, split_url
from cadence.utils.misc import partial_format
from cadence.utils.rng import get_rng_state
from cadence.core.state import State
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core.passes import AlgorithmPass

__all__ = ["FILENAME_FIELDS", "checkpoint_format", "download_checkpoint", "get_save_filename",
           "load_checkpoint", "safe_torch_load", "save_checkpoint", "translate_ignore_keys"]

log = logging.getLogger(__name__)

#: The ``{fields}`` a checkpoint ``filename`` may hold (Composer's
#: ``format_name_with_dist_and_time`` table); the rank fields are rank 0's, since one
#: checkpoint is written for all ranks.
FILENAME_FIELDS = ("run_name", "rank", "local_rank", "world_size", "local_world_size",
                   "node_rank", "epoch", "batch", "batch_in_epoch", "sample",
                   "sample_in_epoch", "token", "token_in_epoch", "total_wct", "epoch_wct",
                   "batch_wct")

# Parts of cadence's checkpoint that are skipped whole (a pattern below them is refused).
_WHOLE = ("optimizers", "schedulers", "timestamp", "rng", "data")
# Parts keyed below their name: ``model/<parameter>``, ``algorithms/<Class>``,
# ``callbacks/<Class>``.
_KEYED = ("model", "algorithms", "callbacks")
# Composer's names for the same parts.
_RENAMED = {"dataset_state": "data"}
# Parts of a Composer checkpoint that a cadence checkpoint does not hold: nothing to ignore.
_NOT_SAVED = ("scaler", "rank_zero_seed", "train_metrics", "eval_metrics", "run_name",
              "integrations", "metadata", "current_metrics", "total_loss", "precision")


def _fields(state: State) -> dict[str, Any]:
    """Values of :data:`FILENAME_FIELDS` for ``state`` (rank fields: rank 0's)."""
    ts = state.timestamp
    return {
        "run_name": state.run_name, "rank": 0, "local_rank": 0, "node_rank": 0,
        "world_size": dist.get_world_size(), "local_world_size": dist.get_local_world_size(),
        "epoch": int(ts.epoch), "batch": int(ts.batch), "batch_in_epoch": int(ts.batch_in_epoch),
        "sample": int(ts.sample), "sample_in_epoch": int(ts.sample_in_epoch),
        "token": int(ts.token), "token_in_epoch": int(ts.token_in_epoch),
        "total_wct": ts.total_wct.total_seconds(), "epoch_wct": ts.epoch_wct.total_seconds(),
        "batch_wct": ts.batch_wct.total_seconds(),
    }


def _format_filename(template: str, state: State) -> str:
    """``template`` with its fields filled; an unknown field is a ValueError."""
    try:
        return template.format(**_fields(state))
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"Checkpoint filename {template!r} has an unknown field {exc}; allowed: "
            f"{', '.join('{' + f + '}' for f in FILENAME_FIELDS)}.") from None


def _run_saver(state: State) -> Optional[Any]:
    """The run's checkpoint saver among ``state.callbacks`` (cadence's ``CheckpointSaver``,
    recognised by its ``state_dict_type`` and ``save``), or None."""
    for callback in state.callbacks:
        if getattr(callback, "state_dict_type", None) in _impl.FORMATS \
                and callable(getattr(callback, "save", None)):
            return callback
    return None


def checkpoint_format(state: State) -> str:
    """The checkpoint format a save of ``state`` uses, as cadence's ``Trainer.save_checkpoint``
    chooses it: the run's checkpoint saver's ``state_dict_type`` when the run has one (a
    ``save_folder``), else the FSDP config's ``state_dict_type`` when ``state.parallelism_config``
    has one, else ``full``.

    Returns:
        ``"full"`` (one file, written by rank 0) or ``"sharded"`` (a DCP directory).
    """
    saver = _run_saver(state)
    if saver is not None:
        return str(saver.state_dict_type)
    config = state.parallelism_config
    fsdp = config.get("fsdp") if isinstance(config, dict) else getattr(config, "fsdp", None)
    if fsdp is not None:
        fmt = fsdp.get("state_dict_type") if isinstance(fsdp, dict) else getattr(
            fsdp, "state_dict_type", None)
        return "sharded" if fmt is None else str(fmt)  # cadence's FSDP default is sharded
    return "full"


def save_checkpoint(
    state: State,
    filename: str = "ep{epoch}-ba{batch}-rank{rank}",
    *,
    weights_only: bool = False,
    ignore_keys: Optional[Union[list[str], Callable[[dict], None]]] = None,
) -> Union[str, None]:
    """Write a checkpoint of ``state`` now (Composer's
    ``composer.utils.checkpoint.save_checkpoint``). Call it on every rank.

    The format is :func:`checkpoint_format`'s: ``full`` writes one file at ``filename``
    (rank 0 writes it, the model and optimizer gathered); ``sharded`` writes a directory at
    ``filename`` (every rank its shards). An existing checkpoint of that name is replaced.
    The file name is used as formatted: no extension is added (as Composer).

    Args:
        state: the run's state (``trainer.state``).
        filename: a local path, relative to the working directory, with any of
            :data:`FILENAME_FIELDS` (``{run_name}``, ``{epoch}``, ``{batch}``, ``{sample}``,
            ``{token}``, ``{batch_in_epoch}``, ``{total_wct}``, ``{rank}``, ...). The rank
            fields are rank 0's on every rank: every rank writes to the same checkpoint.
        weights_only: save the model only (no optimizer, schedulers, RNG, algorithm and
            callback state); such a checkpoint loads with ``load_weights_only=True``.
        ignore_keys: what to leave out of a ``full`` file: glob patterns over its key paths
            (``state/model/fc.*``, ``state/optimizers``, ``rng``) or a callable editing the
            file's dict in place (Composer's; :func:`cadence.checkpoint.layout.drop_paths`).

    Returns:
        The checkpoint's path on the ranks that wrote it: rank 0 for ``full`` (None on the
        other ranks, as Composer's monolithic checkpoint), every rank for ``sharded`` (the
        directory; Composer returns each rank's ``.distcp`` file there).

    Raises:
        NotImplementedError: ``ignore_keys`` with a ``sharded`` checkpoint.
        ValueError: ``filename`` has an unknown field, or is a URL (save to object storage
            with ``Trainer(save_folder="s3://...")`` instead).
        CheckpointWriteError: writing failed on some rank; nothing is left at ``filename``
            (a checkpoint there before is intact).
    """
    name = _format_filename(filename, state)
    if is_remote(name):
        raise ValueError(
            f"save_checkpoint writes a local file; {name!r} is a URL. To save to object "
            f"storage, give the Trainer save_folder={os.path.dirname(name)!r}, or upload the "
            f"returned path yourself.")
    fmt = checkpoint_format(state)
    if ignore_keys and fmt != "full":
        raise NotImplementedError(
            "save_checkpoint(ignore_keys=...) applies to full checkpoints; for a sharded one, "
            "save everything and pass the patterns to load_checkpoint(ignore_keys=...).")
    saver = _run_saver(state)
    if saver is not None and callable(getattr(saver, "wait", None)):
        saver.wait()  # a background save of the run still in flight finishes first
    if saver is not None and getattr(saver, "metadata", None):
        metadata = dict(saver.metadata)  # the run's config (and model export info)
    else:
        from cadence.checkpoint.export import huggingface_metadata

        metadata = huggingface_metadata(state.model)
    path = Path(name)
    if dist.get_global_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    _impl.save_checkpoint(state, path, fmt, weights_only=weights_only, metadata=metadata,
                          ignore_keys=ignore_keys)
    log.info("Saved %s checkpoint %s at %s", fmt, path, state.timestamp)
    if fmt == "full" and dist.get_global_rank() != 0:
        return None
    return str(path)


def translate_ignore_keys(ignore_keys: Optional[Sequence[str]]) -> list[str]:
    """Composer-style ``ignore_keys`` as cadence's glob patterns.

    Cadence's checkpoint keys: ``model/<parameter name>``, ``optimizers``, ``schedulers``,
    ``timestamp``, ``rng``, ``data`` (the data position), ``algorithms/<Class>``,
    ``callbacks/<Class>``. A leading ``state/`` (Composer's) is dropped, so
    ``state/model/fc.*`` is ``model/fc.*``; Composer's ``state/dataset_state`` is ``data``;
    ``optimizers``, ``schedulers``, ``timestamp``, ``rng`` and ``data`` are skipped whole
    (``state/optimizers/*`` is ``optimizers``); ``state/model`` alone is the whole model.
    Parts a cadence checkpoint does not hold (``state/train_metrics/*``,
    ``state/rank_zero_seed``, ``state/scaler``...) have nothing to skip and are dropped.
    A pattern naming nothing cadence knows is passed on with a warning (Composer warns when
    a pattern matches nothing).

    Raises:
        TypeError: ``ignore_keys`` is a callable (Composer's state-dict editing function).
        ValueError: a pattern reaches inside a part skipped whole (``state/optimizers/0/...``).
    """
    if ignore_keys is None:
        return []
    if callable(ignore_keys):
        raise TypeError(
            "ignore_keys as a function that edits the state dict is not supported by cadence "
            "(its checkpoint is not loaded as one dict); pass glob patterns such as "
            "['model/classifier.*', 'optimizers'].")
    if isinstance(ignore_keys, str):
        ignore_keys = [ignore_keys]
    patterns: list[str] = []
    for pattern in ignore_keys:
        key = pattern[len("state/"):] if pattern.startswith("state/") else pattern
        head, _, rest = key.partition("/")
        head = _RENAMED.get(head, head)
        if any(c in head for c in "*?["):
            patterns.append(key)  # a glob over the top level: cadence matches the same way
        elif head in _WHOLE:
            if rest not in ("", "*", "**"):
                raise ValueError(
                    f"ignore_keys {pattern!r}: cadence skips '{head}' only as a whole; use "
                    f"{head!r}.")
            patterns.append(head)
        elif head in _KEYED:
            patterns.append(f"{head}/{rest}" if rest else f"{head}/*")
        elif head in _NOT_SAVED:
            log.debug("ignore_keys %r: a cadence checkpoint does not hold %r.", pattern, head)
        else:
            warnings.warn(
                f"ignore_keys {pattern!r} names no part of a cadence checkpoint (model/<name>, "
                f"optimizers, schedulers, timestamp, rng, data, algorithms/<Class>, "
                f"callbacks/<Class>); it skips nothing.", UserWarning, stacklevel=3)
            patterns.append(key)
    return patterns


def load_checkpoint(
    path: str,
    state: State,
    logger: Any,
    object_store: Optional[Any] = None,
    load_weights_only: bool = False,
    strict_model_weights: bool = True,
    progress_bar: bool = True,
    ignore_keys: Optional[Union[list[str], Callable[[dict], None]]] = None,
    exclude_algorithms: Optional[list[str]] = None,
    algorithm_passes: Optional[list[AlgorithmPass]] = None,
) -> Optional[list[dict[str, Any]]]:
    """Load a cadence checkpoint into ``state`` (Composer's
    ``composer.utils.checkpoint.load_checkpoint``). Call it on every rank.

    Every file is checked against the checksums written with it before any tensor is used;
    a missing, truncated, corrupt (one flipped byte) or unfitting checkpoint raises
    :class:`~cadence.checkpoint.errors.CheckpointError` naming the file.

    Args:
        path: the checkpoint: a ``full`` file or a ``sharded`` directory; a local path, or an
            fsspec URL (``s3://...``, ``gs://...``) of a checkpoint cadence saved to a remote
            ``save_folder`` (downloaded, checked, loaded, removed); or, with
            ``object_store``, the object's name. ``{run_name}`` is filled from ``state``, and
            ``{rank}``, ``{local_rank}``, ``{node_rank}`` with rank 0's values (one
            checkpoint serves every rank); other fields are left as written.
        state: the state to load into (``trainer.state``); its model may be sharded
            differently from the checkpoint's.
        logger: accepted for Composer's signature; unused.
        object_store: an object holding the checkpoint file, with Composer's ``ObjectStore``
            interface (``download_object(object_name, filename)``) or ``LoggerDestination``'s
            (``download_file(remote_file_name, destination)``). Every rank downloads the
            object to a temporary folder, loads it, and removes it. A ``full`` (one file)
            checkpoint only: for a sharded one, pass its URL as ``path``.
        load_weights_only: load the model's weights only; the optimizer, schedulers,
            timestamp and RNG stay as they are.
        strict_model_weights: the model's keys must match the checkpoint's exactly (cadence
            relaxes this when ``ignore_keys`` are given).
        progress_bar: accepted for Composer's signature; cadence shows no download progress.
        ignore_keys: glob patterns of what not to load, cadence's or Composer's spelling
            (:func:`translate_ignore_keys`), e.g. ``["model/classifier.*", "optimizers"]``
            or ``["state/model/classifier.*", "state/optimizers"]``. A callable is refused.
        exclude_algorithms: accepted: cadence never re-applies the algorithms a checkpoint
            was trained with (Composer's ``required_on_load``), so there is nothing to
            exclude; the run's own algorithms get their saved state unless
            ``ignore_keys`` names ``algorithms/<Class>``.
        algorithm_passes: accepted for Composer's signature; unused (no algorithms are
            added on load).

    Returns:
        None with ``load_weights_only`` or when ``rng`` is ignored (as Composer). Otherwise
        the RNG states, indexed by global rank: each rank's state right after the load,
        which cadence has already restored from the checkpoint (so there is nothing left to
        apply; a rank the checkpoint had no state for keeps its own). Each is a dict
        ``{"python", "numpy", "torch"[, "cuda"]}`` in cadence's encoding
        (:func:`cadence.utils.rng.get_rng_state`), not Composer's.

    Raises:
        CheckpointError: as above, or the download from ``object_store`` failed.
        TypeError: ``ignore_keys`` is a callable, or ``object_store`` has no download method.
        ValueError: an ``ignore_keys`` pattern cadence cannot honour.
    """
    del logger, progress_bar, exclude_algorithms, algorithm_passes  # see the docstring
    patterns = translate_ignore_keys(ignore_keys)  # type: ignore[arg-type]
    source = partial_format(str(path), run_name=state.run_name, rank=0, local_rank=0,
                             node_rank=0)
    check_object_store(object_store)
    with (fetched(source) if object_store is None  # a URL: downloaded, then removed
          else fetched_from_store(object_store, source)) as local:
        _impl.load_checkpoint(state, local, weights_only=load_weights_only,
                              strict=strict_model_weights, ignore_keys=patterns)
    log.info("%s loaded from %s", "Model weights" if load_weights_only else "Checkpoint", source)
    if load_weights_only or any(fnmatch.fnmatchcase("rng", p) for p in patterns):
        return None
    return dist.all_gather_object(get_rng_state())


def get_save_filename(state: State, filename: str = "ep{epoch}-ba{batch}-rank{rank}") -> str:
    """The name a checkpoint of ``state`` saved under the template ``filename`` gets (Composer's
    ``get_save_filename``): the template's fields filled from ``state`` (see
    :data:`FILENAME_FIELDS`). A sharded checkpoint (:func:`checkpoint_format`) is one
    directory, so its name has no ``-rank{rank}`` part and no ``.pt``.

    Raises:
        ValueError: ``filename`` has a field not in :data:`FILENAME_FIELDS`.
    """
    name = _format_filename(filename, state)
    if checkpoint_format(state) == "sharded":
        name = name.replace(f"-rank{0}", "").removesuffix(".pt")
    return name


def download_checkpoint(path: str, node_checkpoint_folder: str,
                        object_store: Optional[Any], progress_bar: bool
                        ) -> tuple[str, Optional[str], bool]:
    """Fetch the checkpoint at ``path`` (a file, or a sharded checkpoint's directory) into
    ``node_checkpoint_folder`` on each node (Composer's ``download_checkpoint``; call on every
    rank: the node's local rank 0 downloads, the others wait).

    ``path`` is looked up in ``object_store`` when one is given (an fsspec URL of a folder,
    or an object with ``download_object`` / ``download_file``); else it is a URL
    (``s3://...``, downloaded with its completion marker checked) or a local path (copied).

    Args:
        path: the checkpoint's name in the store, its URL, or its local path.
        node_checkpoint_folder: a local folder, created if missing.
        object_store: where ``path`` is, or ``None``.
        progress_bar: Composer's flag; cadence shows no download progress.

    Returns:
        ``(the local checkpoint, the local directory when it is a sharded checkpoint else
        None, False)``: Composer's triple (cadence checkpoints are never tar archives, so
        nothing is extracted on other ranks).

    Raises:
        CheckpointError: the download failed (on every rank).
        FileNotFoundError: a local ``path`` that does not exist.
    """
    import shutil


    del progress_bar
    check_object_store(object_store)
    name = str(path).rstrip("/")
    folder = Path(node_checkpoint_folder)
    dest = folder / Path(name).name
    if dist.get_local_rank() == 0 and not dest.exists():
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(object_store, str):
            RemoteFolder(object_store).download(name.lstrip("/"), dest)
        elif object_store is not None:
            _download(object_store, name.lstrip("/"), dest)
        elif is_remote(name):
            url, key = split_url(name)
            RemoteFolder(url).download(key, dest)
        elif Path(name).is_dir():
            shutil.copytree(name, dest)
        else:
            shutil.copy2(name, dest)
    dist.barrier()
    return str(dest), (str(dest) if dest.is_dir() else None), False


def safe_torch_load(composer_states_filepath: Union[Path, str], map_location: str = "cpu",
                    load_monolith_rank0_only: bool = False) -> dict[str, Any]:
    """A ``full`` checkpoint file's dict (Composer's layout: ``["state"]["model"]``, ...),
    read with restricted unpickling (``weights_only=True`` plus the few Composer types a
    Composer 0.32 file pickles), so a checkpoint either cadence or Composer wrote loads.

    Args:
        composer_states_filepath: the local ``.pt`` file.
        map_location: ``"cpu"`` (the only place a checkpoint is read to).
        load_monolith_rank0_only: rank 0 alone reads the file and broadcasts everything but
            the model and optimizer state to the other ranks, whose ``["state"]["model"]``
            and ``["state"]["optimizers"]`` are then None (as Composer).

    Raises:
        ValueError: ``map_location`` is not ``"cpu"``.
        CheckpointError: the file is missing, corrupt, or holds objects a checkpoint may not.
    """
    if map_location != "cpu":
        raise ValueError(f"safe_torch_load reads checkpoints to the CPU; got map_location="
                         f"{map_location!r}. Move the tensors afterwards (tensor.to(device)).")
    path = Path(composer_states_filepath)
    if not load_monolith_rank0_only or dist.get_world_size() == 1:
        return _impl.safe_torch_load(path, composer=True)
    held: dict[str, Any] = {}
    shared: list[Any] = [None]
    if dist.get_global_rank() == 0:
        loaded = _impl.safe_torch_load(path, composer=True)
        for key in ("model", "optimizers"):
            if key in loaded.get("state", {}):
                held[key] = loaded["state"][key]
                loaded["state"][key] = None
        shared[0] = loaded
    dist.broadcast_object_list(shared, src=0)
    state_dict: dict[str, Any] = shared[0]
    state_dict.setdefault("state", {}).update(held)
    return state_dict
