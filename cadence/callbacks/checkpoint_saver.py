"""``CheckpointSaver``: save checkpoints on an interval and at the end of training.

Source: Composer's ``CheckpointSaver`` (``composer/callbacks/checkpoint_saver.py``), on
cadence's atomic full / sharded formats (:mod:`cadence.checkpoint`).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

from cadence.checkpoint.async_save import AsyncCheckpointer
from cadence.checkpoint.checkpoint import FORMATS, CheckpointError, read_metadata, save_checkpoint
from cadence.checkpoint.files import (
    DEFAULT_FILENAME, DEFAULT_LATEST, NONFINITE_SUFFIX, TMP_MARK, format_name, name_template,
    pointer_name, pointer_template, remove_checkpoint,
)
from cadence.checkpoint.finite import FirstNonFinite, NonFiniteStateError, nonfinite_state
from cadence.checkpoint.remote import RemoteFolder, is_remote
from cadence.checkpoint.run_folder import RunFolder
from cadence.checkpoint.store import write_latest
from cadence.core import Callback, Event, State, Time, Timestamp, TimeUnit
from cadence.utils import dist

__all__ = ["CheckpointSaver"]

log = logging.getLogger(__name__)

SaveInterval = Union[str, int, Time, Callable[[State, Event], bool]]


class CheckpointSaver(Callback):
    """Saves the run at ``BATCH_CHECKPOINT`` / ``EPOCH_CHECKPOINT`` on ``save_interval``, and
    when training ends.

    Args:
        folder: where checkpoints go; ``{run_name}`` is filled in. Default Composer's
            ``{run_name}/checkpoints``. An fsspec URL (``s3://bucket/runs/{run_name}``)
            saves to object storage: each checkpoint is written to a local stage, uploaded,
            then marked complete, then pointed at (:mod:`~cadence.checkpoint.remote`). Or the
            run's :class:`~cadence.checkpoint.run_folder.RunFolder` (the Trainer passes its own).
        filename: checkpoint name, with ``{run_name}``, ``{epoch}``, ``{batch}``, ``{rank}``
            (rank 0's: one file for the run). Default Composer's
            ``ep{epoch}-ba{batch}-rank{rank}.pt``. A ``full`` checkpoint gets ``.pt``
            appended when missing; a ``sharded`` one is a folder named without ``.pt`` and
            ``-rank{rank}`` (by default ``ep{epoch}-ba{batch}``, Composer's folder name).
        remote_file_name: the name under which each checkpoint is handed to
            ``logger.upload_file`` (only when a destination stores files), with the
            ``filename`` fields; default Composer's
            ``{run_name}/checkpoints/ep{epoch}-ba{batch}-rank{rank}.pt`` (a sharded folder is
            uploaded file by file under the name without ``.pt``); None: no upload.
        latest_filename: Composer's symlink to the newest checkpoint, ``{rank}`` filled in
            (rank 0 writes it). Default ``latest-rank{rank}.pt``; None for none. cadence's
            own ``latest`` pointer (a text file, moved only once a save is complete on
            every rank; what autoresume reads) is named ``latest-{run_name}`` beside it. A
            name not ending in ``.pt`` names that pointer instead (cadence's older API). The
            symlink is written for ``full`` checkpoints in a local folder; a ``sharded`` one
            or a remote folder has the pointer only (:mod:`~cadence.checkpoint.store`).
        latest_remote_file_name: after each upload, a ``<name>.symlink`` file holding the
            uploaded checkpoint's name is uploaded under this name (Composer's remote
            "symlink"); default ``{run_name}/checkpoints/latest-rank{rank}.pt``; None: none.
        save_interval: a Time string (``"1ep"``, ``"500ba"``, ``"0.25dur"``), an int (epochs)
            or a callable ``(state, event) -> bool`` (e.g. from
            :func:`~cadence.utils.create_interval_scheduler`). Default ``"1ep"``.
        overwrite: replace an existing checkpoint of the same name; else raise.
        num_checkpoints_to_keep: keep this many newest checkpoints locally (``-1``: all;
            ``0``: none, as in Composer: each checkpoint is handed to the logger
            destinations that store files, then deleted locally; autoresume then has
            nothing local to resume from). In a remote ``folder``: this many in the bucket;
            ``0`` there is Composer's "no local copies": every checkpoint stays in the bucket
            (none is deleted from it) and the staged local copies are dropped, as always.
        weights_only: save the model (and metadata) only.
        ignore_keys: what to leave out of each ``full`` checkpoint: glob patterns over its
            ``/``-joined key paths (``state/model/*.bias``, ``state/optimizers``, ``rng``),
            or a callable that edits the checkpoint dict in place (Composer's); applied to
            Composer's layout (:mod:`~cadence.checkpoint.layout`). Not with ``sharded`` or
            ``save_async``.
        num_concurrent_uploads, upload_timeout_in_seconds: Composer's settings of its own
            uploader, kept as attributes; cadence uploads through the run's remote folder or
            its logger destinations (e.g. ``RemoteUploaderDownloader``), which have theirs.
        state_dict_type: ``full`` (one file, gathered on rank 0) or ``sharded`` (DCP).
        metadata: extra metadata stored with each checkpoint (the Trainer adds the run's config).
        symlink_filename: the symlink's name when ``latest_filename`` names the pointer.
        save_async: write checkpoints in the background
            (:class:`~cadence.checkpoint.async_save.AsyncCheckpointer`): the loop
            waits only while the state is copied to CPU memory; at most one save is in
            flight (the next waits for it); ``FIT_END`` and :meth:`close` wait for it; the
            ``latest`` pointer moves, and old checkpoints are rotated out, once the write is
            complete on every rank (then, in the writer thread, the checkpoint is also handed
            to the file-storing logger destinations). A failed background write raises at
            the next event. Default False.
        allow_nonfinite: save states whose loss or weights hold NaN or inf as ordinary
            checkpoints (no check). Default False: before each save the batch's loss and
            every parameter and buffer are checked (one reduction per tensor); a non-finite
            state is written aside as ``<name>.nonfinite`` (never listed, pointed at or
            resumed from), ``latest`` stays on the last finite checkpoint, and the run stops
            with :class:`~cadence.checkpoint.finite.NonFiniteStateError` naming the first
            batch whose loss was not finite (:mod:`~cadence.checkpoint.finite`).
        autoresume: the run resumes from its checkpoints (the Trainer's ``autoresume``):
            ``num_checkpoints_to_keep=0`` without a logger destination that stores files is
            then refused at ``INIT`` (nothing would be left to resume from).

    Attributes (Composer's names):
        folder, filename, remote_file_name, latest_remote_file_name: the templates above.
        latest_filename: the ``latest`` pointer's template (``latest-{run_name}``);
            ``symlink_filename`` is Composer's ``latest-rank{rank}.pt``.
        save_interval: ``(state, event) -> bool``, whether to save on that event.
        saved_checkpoints: local paths (URLs in a remote folder) of the checkpoints this run
            saved and kept, oldest first.
        all_saved_checkpoints_to_timestamp: name -> :class:`~cadence.core.Timestamp` of
            every checkpoint this run saved, rotated out or not (kept in the checkpoints,
            so a resumed run knows them too).
        num_checkpoints_to_keep, weights_only, overwrite, ignore_keys: as given.

    Raises:
        ValueError: bad ``save_interval``, ``state_dict_type`` or ``num_checkpoints_to_keep``;
            ``ignore_keys`` with ``sharded`` or ``save_async``.
        NonFiniteStateError: at save time, the state is not finite (see ``allow_nonfinite``).
        FileExistsError: at save time, the checkpoint exists and ``overwrite`` is False
            (except this run's own checkpoint from beyond the batch it resumed at: an earlier
            attempt died before pointing ``latest`` at it, and it is replaced).
    """

    def __init__(self, folder: Union[str, Path, RunFolder] = "{run_name}/checkpoints",
                 filename: Union[str, Path] = DEFAULT_FILENAME,
                 remote_file_name: Optional[Union[str, Path]] = (
                     "{run_name}/checkpoints/" + DEFAULT_FILENAME),
                 latest_filename: Optional[Union[str, Path]] = DEFAULT_LATEST,
                 latest_remote_file_name: Optional[Union[str, Path]] = (
                     "{run_name}/checkpoints/" + DEFAULT_LATEST),
                 save_interval: SaveInterval = "1ep", *,
                 overwrite: bool = False, num_checkpoints_to_keep: int = -1,
                 weights_only: bool = False,
                 ignore_keys: Optional[Union[list[str], Callable[[dict], None]]] = None,
                 num_concurrent_uploads: int = 1, upload_timeout_in_seconds: int = 3600,
                 state_dict_type: str = "full", metadata: Optional[dict[str, Any]] = None,
                 symlink_filename: Optional[str] = DEFAULT_LATEST,
                 save_async: bool = False, allow_nonfinite: bool = False,
                 autoresume: bool = False) -> None:
        if state_dict_type not in FORMATS:
            raise ValueError(f"state_dict_type {state_dict_type!r} is not one of: "
                             f"{', '.join(FORMATS)}.")
        if num_checkpoints_to_keep < -1:
            raise ValueError(f"save_num_checkpoints_to_keep must be -1 (all), 0 (none kept "
                             f"locally) or positive, got {num_checkpoints_to_keep}.")
        if ignore_keys and (state_dict_type != "full" or save_async):
            raise ValueError("save_ignore_keys applies to full checkpoints written in the loop; "
                             "it cannot be combined with save_state_dict_type='sharded' or "
                             "save_async=True (drop one of them).")
        folder = str(folder) if isinstance(folder, Path) else folder
        given = folder if isinstance(folder, RunFolder) else None
        latest = None if latest_filename is None else str(latest_filename)
        if (latest is None or latest.endswith(".pt")) and symlink_filename == DEFAULT_LATEST:
            symlink_filename = latest  # Composer's symlink name (None: no symlink)
        self.interval = save_interval if callable(save_interval) else Time.from_input(
            save_interval, TimeUnit.EPOCH)
        self.save_interval: Callable[[State, Event], bool] = (
            save_interval if callable(save_interval) else self._due)
        self.folder = folder.url if isinstance(folder, RunFolder) else folder
        self.filename = str(filename)
        self.latest_filename = pointer_template(latest)
        self.symlink_filename = symlink_filename
        self.remote_file_name = None if remote_file_name is None else str(remote_file_name)
        self.latest_remote_file_name = (None if latest_remote_file_name is None
                                        else str(latest_remote_file_name))
        self.num_checkpoints_to_keep = num_checkpoints_to_keep
        self.overwrite, self.weights_only = overwrite, weights_only
        self.ignore_keys = ignore_keys
        self.num_concurrent_uploads = num_concurrent_uploads
        self.upload_timeout_in_seconds = upload_timeout_in_seconds
        self.state_dict_type = state_dict_type
        self.metadata = dict(metadata or {})
        self.saved: list[str] = []  # names of the checkpoints this run wrote, oldest first
        self.all_saved_checkpoints_to_timestamp: dict[str, Timestamp] = {}
        self._last_saved_batch: Optional[int] = None
        self._start_batch = 0  # where this process's training starts (the loaded batch)
        self._fixed_folder = given is not None  # the Trainer's: no template to fill in
        self._run_folder: Optional[RunFolder] = given
        self.save_async = save_async
        self._async: Optional[AsyncCheckpointer] = AsyncCheckpointer() if save_async else None
        self.allow_nonfinite = allow_nonfinite
        self.autoresume = autoresume
        self._first_nonfinite = FirstNonFinite()  # the first NaN/inf loss, tracked on device
        self._symlink_dir: Optional[Path] = None  # remote .symlink files, removed by close()
        self._symlink_count = 0

    @property
    def latest_template(self) -> str:
        """The ``latest`` pointer's name template (same as :attr:`latest_filename`)."""
        return self.latest_filename

    @property
    def saved_checkpoints(self) -> list[str]:
        """Paths (URLs in a remote folder) of the checkpoints this run saved and still
        keeps, oldest first; a local path is the save folder as given joined with the name
        (``'./path/to/checkpoints/ep1.pt'``, as Composer's)."""
        if self._run_folder is None:
            return []
        folder = self._run_folder
        if folder.is_remote or "://" in folder.url:
            return [folder.location(name) for name in self.saved]
        # the folder as given, joined as Composer does: './ckpts' -> './ckpts/ep1.pt'
        return [os.path.join(folder.url, name) for name in self.saved]

    def run_folder(self, state: State) -> RunFolder:
        """The checkpoint folder of ``state``'s run (``{run_name}`` filled in), local or
        remote: the one given, else built once per run name.

        Raises:
            ValueError: a URL whose filesystem is not installed (names the extra).
        """
        if self._fixed_folder:
            assert self._run_folder is not None
            return self._run_folder
        url = self.folder.format(run_name=state.run_name)
        if self._run_folder is None or self._run_folder.url != url:
            self._run_folder = RunFolder(url)
        return self._run_folder

    def folder_path(self, state: State) -> Path:
        """The local checkpoint folder of ``state``'s run; for a remote folder, its local
        stage."""
        return self.run_folder(state).local

    def remote_folder(self, state: State) -> Optional[RemoteFolder]:
        """The remote checkpoint folder of ``state``'s run, or None when it is local."""
        return self.run_folder(state).remote

    def _due(self, state: State, event: Event) -> bool:
        if callable(self.interval):
            return bool(self.interval(state, event))
        assert state.max_duration is not None
        done = state.stop_training or state.reached(state.max_duration)
        interval = state.to_time(self.interval)
        if event == Event.EPOCH_CHECKPOINT:
            return done or (interval.unit == TimeUnit.EPOCH and interval.value > 0
                            and int(state.timestamp.epoch) % interval.value == 0)
        if interval.unit == TimeUnit.EPOCH:
            return done and state.max_duration.unit != TimeUnit.EPOCH  # ends mid-epoch
        now = state.timestamp.get(interval.unit).value
        step = {TimeUnit.BATCH: 1, TimeUnit.SAMPLE: 0, TimeUnit.TOKEN: 0}[interval.unit]
        if step:
            crossed = interval.value > 0 and now % interval.value == 0
        else:  # samples / tokens: a multiple was crossed within the last batch
            last = getattr(self, "_last_position", 0)
            crossed = interval.value > 0 and now // interval.value > last // interval.value
            self._last_position = now
        return crossed or (done and state.max_duration.unit != TimeUnit.EPOCH)

    def after_load(self, state: State, logger: Any) -> None:
        """Note the batch a loaded checkpoint resumes at: it is not saved again there (a
        finished run relaunched with autoresume ends at once, without writing a duplicate)."""
        self._start_batch = int(state.timestamp.batch)
        if self._start_batch > 0:
            self._last_saved_batch = self._start_batch

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        """With ``save_async``, first raise a background save's failure (at the first event
        after it failed), then dispatch as every callback does."""
        if self._async is not None:
            self._async.poll()
        super().run_event(event, state, logger)

    def init(self, state: State, logger: Any) -> None:
        """Refuse ``num_checkpoints_to_keep=0`` with autoresume and nowhere the checkpoints
        go (no logger destination stores files): every checkpoint would be deleted as it is
        written, and a relaunch would start from scratch.

        Raises:
            ValueError: naming the settings and the fixes.
        """
        if (self.autoresume and self.num_checkpoints_to_keep == 0 and logger is not None
                and not logger.has_file_upload_destination()
                and self.remote_folder(state) is None):
            raise ValueError(
                "save_num_checkpoints_to_keep=0 with autoresume=True and no logger destination "
                "that stores files: each checkpoint would be deleted right after it is "
                "written, leaving autoresume nothing to resume from. Keep some "
                "(save_num_checkpoints_to_keep: -1 or >= 1), or add a destination that stores "
                "files, or a remote save_folder.")

    def after_train_batch(self, state: State, logger: Any) -> None:
        """Note (on the device, no host sync) whether this batch's loss is finite."""
        if not self.allow_nonfinite:
            self._first_nonfinite.observe(state.total_loss, int(state.timestamp.batch) + 1)

    def batch_checkpoint(self, state: State, logger: Any) -> None:
        if self.save_interval(state, Event.BATCH_CHECKPOINT):
            self.save(state, logger)

    def epoch_checkpoint(self, state: State, logger: Any) -> None:
        if self.save_interval(state, Event.EPOCH_CHECKPOINT):
            self.save(state, logger)

    def fit_end(self, state: State, logger: Any) -> None:
        self.save(state, logger)  # the end of training, unless just saved
        if self._async is not None:
            self._async.wait()  # training ends with every checkpoint on disk

    def wait(self) -> None:
        """Block until a background save in flight (``save_async``) is on disk and
        ``latest`` names it; raises its failure. A no-op for synchronous saves."""
        if self._async is not None:
            self._async.wait()

    def close(self) -> None:
        """Wait for a background save still in flight (raising its failure); idempotent.
        Removes the remote symlink files' temporary folder."""
        if self._symlink_dir is not None:
            shutil.rmtree(self._symlink_dir, ignore_errors=True)
            self._symlink_dir = None
        if self._async is not None:
            self._async.close()

    def save(self, state: State, logger: Any = None, *, filename: Optional[str] = None,
             weights_only: Optional[bool] = None) -> Optional[Path]:
        """Save now (every rank calls it); returns the checkpoint's path, or None when this
        batch was just saved.

        Args:
            state: the run's state.
            logger: the run's Logger, to hand the checkpoint to destinations that store
                files (``upload_file``); None: no upload.
            filename: a name template instead of :attr:`filename` (``Trainer.save_checkpoint``).
            weights_only: instead of :attr:`weights_only`.
        """
        if filename is None and self._last_saved_batch == int(state.timestamp.batch):
            return None
        weights_only = self.weights_only if weights_only is None else weights_only
        run_folder = self.run_folder(state)
        folder, remote = run_folder.local, run_folder.remote
        fields = dict(run_name=state.run_name, epoch=int(state.timestamp.epoch),
                      batch=int(state.timestamp.batch), rank=0)
        name = format_name(name_template(filename or self.filename, self.state_dict_type),
                           **fields)
        path = folder / name
        if not self.allow_nonfinite:
            self._refuse_nonfinite(state, path, weights_only)
        if remote is not None:
            self._clear_remote_target(state, remote, name)
        elif path.exists() and not self.overwrite and not self._abandoned(state, path):
            raise FileExistsError(
                f"Checkpoint {path} already exists; set save_overwrite=True to replace it, or "
                f"autoresume=True to continue the run that wrote it."
            )
        upload = None if remote is None else (
            lambda tmp: remote.upload_part(tmp, name, dist.get_global_rank()))
        if self._async is not None:
            self._save_async(state, logger, path, fields, weights_only, upload)
            return path
        previous, stamps = list(self.saved), dict(self.all_saved_checkpoints_to_timestamp)
        self._note_saved(name, state)  # before writing, so the checkpoint knows itself
        try:
            save_checkpoint(state, path, self.state_dict_type, weights_only, self.metadata,
                            upload=upload, ignore_keys=self.ignore_keys)
        except BaseException:
            self.saved, self.all_saved_checkpoints_to_timestamp = previous, stamps
            raise
        self._last_saved_batch = int(state.timestamp.batch)
        self._upload(logger, path, fields)
        self.commit(state, folder, name)
        return path

    def _refuse_nonfinite(self, state: State, path: Path, weights_only: bool) -> None:
        """If the loss of this batch or a parameter / buffer is NaN or inf (every rank
        checks, :func:`~cadence.checkpoint.finite.nonfinite_state`): write the state aside
        as ``<path>.nonfinite`` and raise on every rank, ``latest`` left where it is.

        Raises:
            NonFiniteStateError: naming the batch, the first non-finite loss, what is not
                finite, the file written aside and the opt-out.
        """
        problem = nonfinite_state(state.model, state.total_loss)
        if problem is None:
            return
        if self._async is not None:
            self._async.wait()  # the last finite save lands first; latest names it
        aside = path.with_name(path.name + NONFINITE_SUFFIX)
        try:
            save_checkpoint(state, aside, self.state_dict_type, weights_only, self.metadata)
            written = f"The state was written aside to {aside} for debugging"
        except (OSError, ValueError) as exc:
            written = f"Writing it aside to {aside} failed too ({exc})"
        latest = None
        if dist.get_global_rank() == 0:
            store = self.run_folder(state).store
            try:
                latest = store.read_latest(pointer_name(self.latest_filename, state.run_name))
            except (CheckpointError, OSError):
                latest = None
            latest = None if latest is None else store.location(latest)
        pointer = ("the latest pointer was not moved" if latest is None
                   else f"the latest pointer still names {latest}")
        first = self._first_nonfinite.first()
        batch = int(state.timestamp.batch)
        where = (f"The first non-finite loss was at batch {first}" if first is not None else
                 f"Every loss this process saw was finite: the weights became non-finite in "
                 f"an optimizer step up to batch {batch}")
        raise NonFiniteStateError(
            f"Not saving a checkpoint at batch {batch} (epoch {int(state.timestamp.epoch)}): "
            f"{problem}. {where}. {written}; it is not a checkpoint of the run: {pointer}, "
            f"and autoresume resumes from there. Common causes: a learning rate that is too "
            f"high, fp16 overflow (try amp_bf16), bad data; the nan_monitor callback stops at "
            f"the first non-finite loss. To save non-finite states as ordinary checkpoints and "
            f"keep training, set save_allow_nonfinite: true (Trainer(save_allow_nonfinite="
            f"True)).")

    def _clear_remote_target(self, state: State, remote: RemoteFolder, name: str) -> None:
        """Before saving ``name`` to a remote folder (rank 0 looks, every rank raises): a
        complete checkpoint of that name is refused as a local one is, unless overwriting
        or this run's abandoned one. Objects without a marker are checked first
        (:meth:`~cadence.checkpoint.remote.RemoteFolder.inspect_unmarked`): if they pass,
        they are a complete checkpoint (its marker is lost), treated as above; only objects
        that fail their checks (an upload that never finished) are removed.

        Raises:
            FileExistsError: as for a local checkpoint.
        """
        error: list[Optional[str]] = [None]
        if dist.get_global_rank() == 0:
            marker = remote.marker(name)
            if marker is None and name in remote.unmarked():
                marker, why = remote.inspect_unmarked(name)
                if marker is None:
                    remote.remove_unmarked(name, why or "incomplete")
            if marker is not None and not self.overwrite and not (
                    self._past_resume_point(state) and marker.get("run_name") == state.run_name):
                error[0] = (f"Checkpoint {remote.url_of(name)} already exists; set "
                            f"save_overwrite=True to replace it, or autoresume=True to "
                            f"continue the run that wrote it.")
            elif marker is not None:
                log.warning("Replacing %s.", remote.url_of(name))
                remote.remove(name)
        dist.broadcast_object_list(error)
        if error[0] is not None:
            raise FileExistsError(error[0])

    def _save_async(self, state: State, logger: Any, path: Path, fields: dict[str, Any],
                    weights_only: bool, upload: Optional[Callable[[Path], None]]) -> None:
        """Stage the checkpoint and hand it to the background writer; the upload, the
        ``latest`` pointer and rotation follow once it is on disk on every rank."""
        assert self._async is not None
        self._async.wait()  # the previous save's rotation is done before this one's list
        previous, stamps = list(self.saved), dict(self.all_saved_checkpoints_to_timestamp)
        self._note_saved(path.name, state)
        try:
            self._async.save(state, path, self.state_dict_type, weights_only, self.metadata,
                             on_written=lambda: self._written(state, logger, path, fields),
                             upload=upload)
        except BaseException:
            self.saved, self.all_saved_checkpoints_to_timestamp = previous, stamps
            raise
        self._last_saved_batch = int(state.timestamp.batch)

    def _note_saved(self, name: str, state: State) -> None:
        """Record checkpoint ``name`` (about to be written) as this run's newest."""
        self.saved = [n for n in self.saved if n != name] + [name]
        self.all_saved_checkpoints_to_timestamp[name] = state.timestamp.copy()

    def _written(self, state: State, logger: Any, path: Path, fields: dict[str, Any]) -> None:
        """A background save is on disk on every rank (writer thread): upload, pointer,
        rotation, as a synchronous save does after writing."""
        self._upload(logger, path, fields)
        self.commit(state, path.parent, path.name, barrier=False)

    def _upload(self, logger: Any, path: Path, fields: dict[str, Any]) -> None:
        """Hand the checkpoint to the destinations that store files (rank 0)."""
        if logger is None or not logger.has_file_upload_destination():
            if self.num_checkpoints_to_keep == 0 and not is_remote(str(self.folder)):
                log.warning("save_num_checkpoints_to_keep=0 and no logger destination stores "
                            "files: checkpoint %s is deleted right after it is written.", path)
            return
        if dist.get_global_rank() != 0 or self.remote_file_name is None:
            return
        remote = format_name(self.remote_file_name, **fields).lstrip("/")
        if path.is_dir():
            remote = name_template(remote, "sharded")
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                logger.upload_file(f"{remote}/{file.relative_to(path).as_posix()}", file,
                                   overwrite=self.overwrite)
        else:
            remote = name_template(remote, "full")
            logger.upload_file(remote, path, overwrite=self.overwrite)
        if self.latest_remote_file_name is not None:
            self._upload_symlink(logger, remote, fields)

    def _upload_symlink(self, logger: Any, remote: str, fields: dict[str, Any]) -> None:
        """Upload Composer's remote "symlink": ``<latest_remote_file_name>.symlink``, a text
        file holding the name ``remote`` of the checkpoint just uploaded."""
        assert self.latest_remote_file_name is not None
        name = format_name(self.latest_remote_file_name, **fields).lstrip("/") + ".symlink"
        if self._symlink_dir is None:  # kept until close(): a destination may upload later
            self._symlink_dir = Path(tempfile.mkdtemp(prefix="cadence-symlink-"))
        self._symlink_count += 1
        file = self._symlink_dir / f"latest.{self._symlink_count}.symlink"
        file.write_text(remote)
        logger.upload_file(name, file, overwrite=True)

    def _past_resume_point(self, state: State) -> bool:
        """This run resumed from a checkpoint and is now beyond the batch it resumed at."""
        return 0 < self._start_batch < int(state.timestamp.batch)

    def _abandoned(self, state: State, path: Path) -> bool:
        """Whether the checkpoint at ``path`` is this run's own from beyond the batch it
        resumed at: written by an attempt that was killed after renaming it into place but
        before moving ``latest`` to it, so autoresume went back to the one before. The
        resumed run recomputes that step; replacing the orphan is what it is for."""
        if not self._past_resume_point(state):
            return False
        answer = [False]
        if dist.get_global_rank() == 0:
            try:
                answer[0] = read_metadata(path).get("run_name") == state.run_name
            except CheckpointError:
                pass
        dist.broadcast_object_list(answer)
        if answer[0]:
            log.warning("Replacing %s: written by an earlier attempt of run %s that stopped "
                        "before pointing latest at it (resumed at batch %d).", path,
                        state.run_name, self._start_batch)
        return bool(answer[0])

    def commit(self, state: State, folder: Path, name: str, barrier: bool = True) -> None:
        """Move the ``latest`` pointer to ``name`` and drop checkpoints beyond the limit
        (``barrier``: then wait for every rank; the background writer has its own)."""
        rank0 = dist.get_global_rank() == 0
        latest = pointer_name(self.latest_filename, state.run_name)
        remote = self.remote_folder(state)
        if remote is not None:
            self._commit_remote(state, remote, folder, name, latest)
        elif rank0:
            write_latest(folder, latest, name)
            self._write_symlink(folder, name)
        # 0 in a remote folder: Composer's "no local copies"; the bucket keeps every one
        keep = -1 if remote is not None and self.num_checkpoints_to_keep == 0 \
            else self.num_checkpoints_to_keep
        while 0 <= keep < len(self.saved):
            oldest = self.saved.pop(0)
            if rank0:
                self.run_folder(state).store.remove(oldest)  # a remote one: its marker first
        if barrier:
            dist.barrier()
            log.info("Saved checkpoint %s", folder / name)

    def _commit_remote(self, state: State, remote: RemoteFolder, folder: Path, name: str,
                       latest: str) -> None:
        """Every rank's upload of ``name`` is done: rank 0 writes its completion marker,
        then the ``latest`` pointer, then uploads the run's logs; every rank drops its
        staged copy."""
        staged = folder / name
        if dist.get_global_rank() == 0:
            remote.mark_complete(name, staged if staged.is_dir() else None,
                                 run_name=state.run_name, format=self.state_dict_type,
                                 epoch=int(state.timestamp.epoch),
                                 batch=int(state.timestamp.batch))
            remote.write_latest(latest, name)
            remote.upload_artifacts()
            remove_checkpoint(staged)
        for leftover in folder.glob(f"{name}{TMP_MARK}*"):  # another host's part
            remove_checkpoint(leftover)

    def _write_symlink(self, folder: Path, name: str) -> None:
        """Point Composer's ``latest-rank{rank}.pt`` symlink at a full checkpoint (relative,
        replaced atomically)."""
        if self.symlink_filename is None or self.state_dict_type != "full":
            return
        link = folder / self.symlink_filename.format(rank=dist.get_global_rank())
        tmp = link.with_name(f"{link.name}{TMP_MARK}{secrets.token_hex(4)}")
        os.symlink(name, tmp)
        os.replace(tmp, link)

    def state_dict(self) -> dict[str, Any]:
        """The kept checkpoints' names, and Composer's ``all_saved_checkpoints_to_timestamp``
        as ``[(name, timestamp state dict)]`` (plain data)."""
        stamps = self.all_saved_checkpoints_to_timestamp
        return {"saved": list(self.saved), "all_saved_checkpoints_to_timestamp": [
            (name, ts.state_dict()) for name, ts in stamps.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or Composer's, which has only the timestamps)."""
        self.saved = list(state.get("saved", []))
        self.all_saved_checkpoints_to_timestamp = {
            str(name): Timestamp.from_state_dict(ts)
            for name, ts in state.get("all_saved_checkpoints_to_timestamp", [])}
