"""``CheckpointSaver``: save checkpoints on an interval and at the end of training.

Source: Composer's ``CheckpointSaver`` (``composer/callbacks/checkpoint_saver.py``), on
cadence's atomic full / sharded formats (:mod:`cadence.trainer.checkpoint`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional, Union

from cadence.trainer import dist
from cadence.trainer.checkpoint.checkpoint import (
    FORMATS, CheckpointError, read_metadata, save_checkpoint,
)
from cadence.trainer.checkpoint.files import format_name, remove_checkpoint, write_latest
from cadence.trainer.core import Callback, Event, State, Time, TimeUnit
from cadence.trainer.registry import callbacks

__all__ = ["CheckpointSaver"]

log = logging.getLogger(__name__)

SaveInterval = Union[str, Time, Callable[[State, Event], bool]]


@callbacks.register("checkpoint_saver")
class CheckpointSaver(Callback):
    """Saves the run at ``BATCH_CHECKPOINT`` / ``EPOCH_CHECKPOINT`` on ``save_interval``, and
    when training ends.

    Args:
        folder: where checkpoints go; ``{run_name}`` is filled in. Default ``runs/{run_name}``.
        filename: checkpoint name, with ``{run_name}``, ``{epoch}``, ``{batch}``, ``{rank}``;
            a ``full`` checkpoint gets ``.pt`` appended when missing, a ``sharded`` one is a
            directory. Default ``ep{epoch}-ba{batch}``.
        latest_filename: the pointer file naming the newest complete checkpoint, moved only
            once a save is complete on every rank. Default ``latest-{run_name}``.
        save_interval: a Time string (``"1ep"``, ``"500ba"``, ``"0.25dur"``) or a callable
            ``(state, event) -> bool``. Default ``"1ep"``.
        num_checkpoints_to_keep: keep this many newest checkpoints (``-1``: all).
        overwrite: replace an existing checkpoint of the same name; else raise.
        weights_only: save the model (and metadata) only.
        state_dict_type: ``full`` (one file, gathered on rank 0) or ``sharded`` (DCP).
        metadata: extra metadata stored with each checkpoint (the Trainer adds the run's config).

    Raises:
        ValueError: bad ``save_interval``, ``state_dict_type`` or ``num_checkpoints_to_keep``.
        FileExistsError: at save time, the checkpoint exists and ``overwrite`` is False
            (except this run's own checkpoint from beyond the batch it resumed at: an earlier
            attempt died before pointing ``latest`` at it, and it is replaced).
    """

    def __init__(self, folder: str = "runs/{run_name}", filename: str = "ep{epoch}-ba{batch}",
                 latest_filename: str = "latest-{run_name}", save_interval: SaveInterval = "1ep",
                 num_checkpoints_to_keep: int = -1, overwrite: bool = False,
                 weights_only: bool = False, state_dict_type: str = "full",
                 metadata: Optional[dict[str, Any]] = None) -> None:
        if state_dict_type not in FORMATS:
            raise ValueError(f"state_dict_type {state_dict_type!r} is not one of: "
                             f"{', '.join(FORMATS)}.")
        if num_checkpoints_to_keep == 0 or num_checkpoints_to_keep < -1:
            raise ValueError(f"save_num_checkpoints_to_keep must be -1 (all) or positive, got "
                             f"{num_checkpoints_to_keep}.")
        self.interval = save_interval if callable(save_interval) else Time.from_input(
            save_interval, TimeUnit.EPOCH)
        self.folder_template, self.filename = folder, filename
        self.latest_template = latest_filename
        self.num_checkpoints_to_keep = num_checkpoints_to_keep
        self.overwrite, self.weights_only = overwrite, weights_only
        self.state_dict_type = state_dict_type
        self.metadata = dict(metadata or {})
        self.saved: list[str] = []  # names of the checkpoints this run wrote, oldest first
        self._last_saved_batch: Optional[int] = None
        self._start_batch = 0  # where this process's training starts (the loaded batch)

    def folder(self, state: State) -> Path:
        return Path(self.folder_template.format(run_name=state.run_name))

    def _due(self, state: State, event: Event) -> bool:
        if callable(self.interval):
            return bool(self.interval(state, event))
        assert state.max_duration is not None
        done = state.stop_training or state.reached(state.max_duration)
        interval = state.to_time(self.interval)
        if event == Event.EPOCH_CHECKPOINT:
            return done or (interval.unit == TimeUnit.EPOCH and interval.value > 0
                            and state.timestamp.epoch % interval.value == 0)
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
        self._start_batch = state.timestamp.batch
        if self._start_batch > 0:
            self._last_saved_batch = self._start_batch

    def batch_checkpoint(self, state: State, logger: Any) -> None:
        if self._due(state, Event.BATCH_CHECKPOINT):
            self.save(state)

    def epoch_checkpoint(self, state: State, logger: Any) -> None:
        if self._due(state, Event.EPOCH_CHECKPOINT):
            self.save(state)

    def fit_end(self, state: State, logger: Any) -> None:
        self.save(state)  # the end of training, unless just saved

    def save(self, state: State) -> Optional[Path]:
        """Save now (every rank calls it); returns the checkpoint's path."""
        if self._last_saved_batch == state.timestamp.batch:
            return None
        folder = self.folder(state)
        name = format_name(self.filename, run_name=state.run_name, epoch=state.timestamp.epoch,
                           batch=state.timestamp.batch, rank=0)
        if self.state_dict_type == "full" and not name.endswith(".pt"):
            name += ".pt"
        path = folder / name
        if path.exists() and not self.overwrite and not self._abandoned(state, path):
            raise FileExistsError(
                f"Checkpoint {path} already exists; set save_overwrite=True to replace it, or "
                f"autoresume=True to continue the run that wrote it."
            )
        previous = list(self.saved)
        self.saved = [n for n in self.saved if n != name] + [name]  # so the checkpoint knows it
        try:
            save_checkpoint(state, path, self.state_dict_type, self.weights_only, self.metadata)
        except BaseException:
            self.saved = previous
            raise
        self._last_saved_batch = state.timestamp.batch
        self.commit(state, folder, name)
        return path

    def _abandoned(self, state: State, path: Path) -> bool:
        """Whether the checkpoint at ``path`` is this run's own from beyond the batch it
        resumed at: written by an attempt that was killed after renaming it into place but
        before moving ``latest`` to it, so autoresume went back to the one before. The
        resumed run recomputes that step; replacing the orphan is what it is for."""
        if self._start_batch <= 0 or state.timestamp.batch <= self._start_batch:
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

    def commit(self, state: State, folder: Path, name: str) -> None:
        """Move the ``latest`` pointer to ``name`` and drop checkpoints beyond the limit."""
        rank0 = dist.get_global_rank() == 0
        if rank0:
            write_latest(folder, self.latest_template.format(run_name=state.run_name), name)
        while 0 < self.num_checkpoints_to_keep < len(self.saved):
            oldest = self.saved.pop(0)
            if rank0:
                remove_checkpoint(folder / oldest)
        dist.barrier()
        log.info("Saved checkpoint %s", folder / name)

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = list(state.get("saved", []))
