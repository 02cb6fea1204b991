"""Resuming: which checkpoint to load (:func:`resolve_load_path`): with autoresume, the
newest checkpoint of the run in its save folder that passes its checksums, local or remote.

Where in its epoch the train dataloader resumes is :mod:`~cadence.checkpoint.data_position`'s
part.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.files import remove_stale_temporaries
from cadence.checkpoint.object_store import fetched_from_store
from cadence.checkpoint.remote import fetched, is_remote, join, local_path
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.checkpoint.run_folder import RunFolder
    from cadence.core.state import State

__all__ = ["load_at_start", "resolve_load_path"]

log = logging.getLogger(__name__)


def resolve_load_path(autoresume: bool, save_folder: Optional[RunFolder], latest_filename: str,
                      load_path: Optional[str], run_name: Optional[str] = None,
                      require_checksums: bool = True
                      ) -> tuple[Optional[Union[Path, str]], bool]:
    """The checkpoint to load (a local path, or the URL of a remote one: load it through
    :func:`~cadence.checkpoint.remote.fetched`) and whether it is an autoresume (a
    full restore).

    With ``autoresume``, the newest intact checkpoint of ``run_name`` in ``save_folder``
    (:meth:`~cadence.checkpoint.store.CheckpointStore.newest_intact`, local or remote) wins; without
    one (a fresh run) ``load_path`` is used. Before that, the run's own stale temporaries in
    the folder's local part (left by a killed save) are removed
    (:func:`~cadence.checkpoint.files.remove_stale_temporaries`). Rank 0 decides; every rank
    gets its answer.

    Args:
        autoresume: resume the run's newest checkpoint in ``save_folder`` if it has one.
        save_folder: the run's folder (None: the run has none).
        latest_filename: the ``latest`` pointer's name (``{run_name}`` filled in).
        load_path: the checkpoint to load when not resuming (a path or URL), or None.
        run_name: the run whose checkpoints autoresume takes.
        require_checksums: a checkpoint without checksums is rejected (default).

    Raises:
        CheckpointError: on every rank, as
            :meth:`~cadence.checkpoint.store.CheckpointStore.newest_intact` raises it.
    """
    choice: list[Any] = [None, False, None]  # path, resuming, error
    if dist.get_global_rank() == 0:
        try:
            if save_folder is not None and run_name is not None:
                removed = remove_stale_temporaries(save_folder.local, run_name, latest_filename)
                if removed:
                    log.info("Removed %d stale temporaries of run %s (unfinished saves): %s",
                             len(removed), run_name, ", ".join(p.name for p in removed))
            if autoresume and save_folder is not None:
                found = save_folder.store.newest_intact(latest_filename, run_name,
                                                        require_checksums)
                if found is not None:
                    choice = [str(found), True, None]
        except (CheckpointError, ValueError, OSError) as exc:  # also: the store unreachable
            choice[2] = str(exc)
        if choice[0] is None and choice[2] is None and load_path is not None:
            choice = [load_path, False, None]
    dist.broadcast_object_list(choice)
    if choice[2] is not None:
        raise CheckpointError(choice[2])
    path = choice[0]
    if path is not None and not is_remote(path):
        path = local_path(path)
    return path, bool(choice[1])


def load_at_start(state: State, run_folder: Optional[RunFolder], latest_filename: str,
                  load_path: Optional[str], autoresume: bool, *, weights_only: bool = False,
                  strict: bool = True, ignore_keys: Sequence[str] = (),
                  require_checksums: bool = True,
                  check_layout: Optional[Callable[[Path], None]] = None,
                  object_store: Any = None) -> Optional[str]:
    """The Trainer's load step (call on every rank): resolve what to load
    (:func:`resolve_load_path`), fetch it (a remote one is downloaded, then removed), check
    its layout (``check_layout(local path)``, skipped for a weights-only load), load it into
    ``state`` (:func:`~cadence.checkpoint.checkpoint.load_checkpoint`) and log which
    checkpoint the run resumed from or loaded (INFO; ``cadence train`` prints it).

    Args:
        state: the run's state.
        run_folder: the run's save folder (None: none).
        latest_filename: the ``latest`` pointer's name, ``{run_name}`` filled in.
        load_path: ``load_path`` (used when not resuming).
        autoresume: resume the run's newest intact checkpoint in ``run_folder``.
        weights_only, strict, ignore_keys, require_checksums: the Trainer's ``load_*``
            arguments (``weights_only`` applies to ``load_path`` only: a resume is full).
        check_layout: refuses a checkpoint the run's mesh cannot resume.
        object_store: ``load_object_store``: ``load_path`` names a checkpoint in it
            (:mod:`~cadence.checkpoint.object_store`); an autoresume ignores it.

    Returns:
        The path or URL loaded, or None when nothing was.

    Raises:
        CheckpointError: on every rank, as :func:`resolve_load_path` and ``load_checkpoint``.
    """
    from cadence.checkpoint.checkpoint import load_checkpoint

    path, resuming = resolve_load_path(autoresume, run_folder, latest_filename, load_path,
                                       run_name=state.run_name,
                                       require_checksums=require_checksums)
    if path is None:
        return None
    weights_only = weights_only and not resuming
    from_store = object_store is not None and not resuming
    if from_store:  # named in the log and the hyperparameters as where it came from
        path = (join(object_store, str(load_path).lstrip("/")) if isinstance(object_store, str)
                else f"{type(object_store).__name__}:{load_path}")
    with (fetched_from_store(object_store, str(load_path)) if from_store
          else fetched(path)) as local:
        if check_layout is not None and not weights_only:  # refused before anything loads
            check_layout(local)
        load_checkpoint(state, local, weights_only=weights_only, strict=strict,
                        ignore_keys=ignore_keys, require_checksums=require_checksums)
    log.info("%s checkpoint %s at %s", "Resumed from" if resuming else "Loaded", path,
             state.timestamp)
    return str(path)
