"""``CheckpointConfig``: a run's checkpoint settings, the ``save_*`` / ``load_*`` keys of a
run file and of Composer's ``Trainer``, typed and checked in one place.

A run file writes these keys at the top level (Composer's flat names); the Trainer takes them
as keyword arguments; both become this one object (a section of
:class:`~cadence.trainer.trainer_config.TrainerConfig`), whose checks run when it is made,
before anything is built. Standard library only: the run-file check reads it before
``import torch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from cadence.registry.errors import ConfigProblem, choice_message
from cadence.core.time import TimeUnit
from cadence.registry.section import Section, time_problem

__all__ = ["CheckpointConfig", "STATE_DICT_TYPES"]

#: ``save_state_dict_type`` values (``None``: ``full``, or the fsdp config's in an FSDP run).
STATE_DICT_TYPES = ("full", "sharded")


@dataclass
class CheckpointConfig(Section):
    """Where and when checkpoints are written, and what a run loads at start.

    Checkpoints are written only when ``save_folder`` is set and ``save_interval`` is not
    ``None`` (a :class:`~cadence.callbacks.CheckpointSaver` is added); see that class for
    the file layout.

    Attributes:
        save_folder: where run artifacts go (metrics, checkpoints); ``{run_name}`` in it is
            filled in; an fsspec URL (``s3://bucket/runs/{run_name}``) saves to object
            storage through a local stage (:mod:`cadence.checkpoint.remote`). Default none.
        save_filename: a checkpoint's name, Composer's fields (``{epoch}``, ``{batch}``,
            ``{rank}``, ...); a sharded checkpoint is the folder without ``-rank{rank}.pt``.
            Default ``ep{epoch}-ba{batch}-rank{rank}.pt``.
        save_latest_filename: the pointer to the newest checkpoint (a symlink locally,
            Composer's ``latest-rank{rank}.pt``); ``None``: none.
        save_overwrite: replace an existing checkpoint of the same name. Default False.
        save_interval: how often to save: a Time (``"1ep"``, ``"500ba"``; an int means
            epochs; ``0``: only when training ends), or a callable ``(state, event) -> bool``;
            ``None``: no checkpoints. Default ``"1ep"``.
        save_weights_only: save the model's weights only. Default False.
        save_num_checkpoints_to_keep: how many checkpoints to keep locally, oldest removed
            first; ``-1`` (default): all. With a remote ``save_folder``: how many to keep in
            the bucket, except ``0`` (Composer's "none locally"): all are kept there.
        save_metrics: also save the train and eval metrics' state. Default False.
        save_state_dict_type: ``full`` (one file), ``sharded`` (a DCP folder) or ``None``:
            ``full``, or the fsdp config's ``state_dict_type`` in an FSDP run.
        save_async: write checkpoints in a background thread; the loop waits only while the
            state is copied to CPU memory. Default False.
        save_allow_nonfinite: save states with a NaN/inf loss or weights as ordinary
            checkpoints (default False: written aside as ``*.nonfinite``, the run stops).
        save_ignore_keys: what not to save (Composer's): glob patterns, or a function that
            edits the state dict in place. Python only.
        load_path: a checkpoint to start from (a ``.pt`` file, a sharded folder, or a URL);
            a Composer 0.32 checkpoint resumes too.
        load_object_store: ``load_path`` is a name in this store (an fsspec URL, an
            ``ObjectStore`` or a ``RemoteUploaderDownloader``). Python only.
        load_weights_only: take only the model's weights from ``load_path``. Default False.
        load_strict_model_weights: the model's keys must match the checkpoint's (shapes must
            match either way). Default True.
        load_progress_bar: accepted (Composer's); no effect (there is no download bar).
        load_ignore_keys: glob patterns of what not to load (``model/model.score.*``,
            ``optimizers``, ``rng``); ``None`` (Composer's default) is none.
        load_exclude_algorithms: class names of algorithms whose saved state is not loaded
            (Composer's).
        autoresume: continue from the newest complete checkpoint of this ``run_name`` in
            ``save_folder`` (bit-exact on the same world size), else start fresh (or from
            ``load_path``). Needs ``save_folder`` and an explicit ``run_name``.
        require_checksums: refuse a checkpoint without checksums. Default True.

    Raises:
        ConfigError: a negative or malformed ``save_interval``, an unknown
            ``save_state_dict_type``, ``save_num_checkpoints_to_keep`` below -1; every
            problem named with its key.
    """

    save_folder: Optional[str] = None
    save_filename: str = "ep{epoch}-ba{batch}-rank{rank}.pt"
    save_latest_filename: Optional[str] = "latest-rank{rank}.pt"
    save_overwrite: bool = False
    save_interval: Optional[str] = field(default="1ep", metadata={"python_type": Any})
    save_weights_only: bool = False
    save_num_checkpoints_to_keep: int = -1
    save_metrics: bool = False
    save_state_dict_type: Optional[str] = None
    save_async: bool = False
    save_allow_nonfinite: bool = False
    save_ignore_keys: Any = field(default=None, metadata={"run_file": False})
    load_path: Optional[str] = None
    load_object_store: Any = field(default=None, metadata={"run_file": False})
    load_weights_only: bool = False
    load_strict_model_weights: bool = True
    load_progress_bar: bool = field(default=True, metadata={"run_file": False})
    load_ignore_keys: Optional[List[str]] = field(default_factory=list)
    load_exclude_algorithms: Optional[List[str]] = None
    autoresume: bool = False
    require_checksums: bool = True

    def normalize(self) -> None:
        if self.load_ignore_keys is None:  # Composer's default
            self.load_ignore_keys = []
        if isinstance(self.load_ignore_keys, str):
            self.load_ignore_keys = [self.load_ignore_keys]
        self.load_ignore_keys = list(self.load_ignore_keys)

    def problems(self) -> list[ConfigProblem]:
        found = []
        problem = time_problem("save_interval", self.save_interval, TimeUnit.EPOCH,
                               allow_callable=True)
        if problem is not None:
            found.append(problem)
        if self.save_state_dict_type not in (None, *STATE_DICT_TYPES):
            found.append(ConfigProblem("save_state_dict_type", choice_message(
                self.save_state_dict_type, [*STATE_DICT_TYPES, "null"])))
        keep = self.save_num_checkpoints_to_keep
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < -1:
            found.append(ConfigProblem("save_num_checkpoints_to_keep", (
                f"{keep!r} must be -1 (keep all), 0 (keep none locally) or a positive int.")))
        return found
