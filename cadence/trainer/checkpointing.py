"""The Trainer's checkpoint savers: the run's :class:`CheckpointSaver`, built from the
``save_*`` arguments, and the one-off saver behind ``Trainer.save_checkpoint``.

Both carry the same metadata: the run's config, the mesh layout (for the elastic-resume
check) and, for a ``HuggingFaceModel``, what export needs to rebuild it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from cadence.checkpoint.checkpoint_config import CheckpointConfig
from cadence.checkpoint.files import name_template, pointer_name
from cadence.checkpoint.run_folder import RunFolder, check_autoresume_folder
from cadence.core import Callback, State

__all__ = ["add_run_saver", "checkpoint_metadata", "run_saver", "save_now"]


def checkpoint_metadata(state: State, hyperparameters: dict[str, Any],
                        parallelism_config: Any) -> dict[str, Any]:
    """The run's config, its mesh layout, and for a HuggingFaceModel what export needs."""
    from cadence.checkpoint.export import huggingface_metadata
    from cadence.parallel.elastic import mesh_layout

    return {"config": hyperparameters, "mesh": mesh_layout(parallelism_config),
            **huggingface_metadata(state.model)}


def run_saver(callbacks: Sequence[Callback]) -> Any:
    """The run's ``CheckpointSaver`` among ``callbacks``, or None."""
    from cadence.callbacks.checkpoint_saver import CheckpointSaver

    return next((c for c in callbacks if isinstance(c, CheckpointSaver)), None)


def _default_format(parallelism_config: Any) -> str:
    if parallelism_config.pp_degree > 1:  # each rank holds its own stages: DCP only
        return "sharded"
    fsdp = parallelism_config.fsdp
    return "full" if fsdp is None else fsdp.state_dict_type


def _remote_file_names(config: CheckpointConfig) -> dict[str, Optional[str]]:
    """The names the run's checkpoints (and Composer's remote "symlink") get at the logger
    destinations that store files, by Composer's Trainer rule: ``save_folder``'s path joined
    with ``save_filename`` / ``save_latest_filename`` (``save_folder='checkpoints'``,
    ``save_filename='ep{epoch}.pt'`` -> ``checkpoints/ep1.pt``); a bucket without a path
    (``s3://bucket``) -> the file names alone. Without ``save_folder``: the saver's defaults."""
    if config.save_folder is None:
        return {}
    from cadence.utils.file_helpers import parse_uri

    folder = parse_uri(config.save_folder)[2]
    filename, latest = config.save_filename, config.save_latest_filename
    if folder == "":
        return {"remote_file_name": filename, "latest_remote_file_name": latest}
    return {"remote_file_name": str(Path(folder) / filename),
            "latest_remote_file_name": None if latest is None else str(Path(folder) / latest)}


def add_run_saver(state: State, run_folder: Optional[RunFolder], metadata: dict[str, Any],
                  config: CheckpointConfig) -> None:
    """Append the run's ``CheckpointSaver`` to ``state.callbacks`` when the run has a save
    folder and a ``save_interval`` (as Composer does), from the run's checkpoint settings;
    its format is ``save_state_dict_type``, else ``state.parallelism_config``'s.

    Raises:
        ValueError: without ``autoresume`` or ``overwrite``, the folder already holds a
            checkpoint of this run (named, with the three ways out); with ``autoresume``,
            another run's checkpoints are there (:func:`check_autoresume_folder`);
            ``save_state_dict_type='full'`` under pipeline parallelism.
    """
    if run_folder is None or config.save_interval is None:
        return
    from cadence.callbacks.checkpoint_saver import CheckpointSaver

    fmt = config.save_state_dict_type or _default_format(state.parallelism_config)
    if fmt == "full" and state.parallelism_config.pp_degree > 1:
        raise ValueError("save_state_dict_type='full' under pipeline parallelism "
                         "(parallelism_config.pp): each rank holds its own stages, so one file "
                         "gathered on rank 0 would miss the others. Save 'sharded' (the "
                         "default) and `cadence convert --to full` it afterwards.")
    autoresume = config.autoresume
    kwargs = dict(filename=config.save_filename, latest_filename=config.save_latest_filename,
                  num_checkpoints_to_keep=config.save_num_checkpoints_to_keep,
                  overwrite=config.save_overwrite, weights_only=config.save_weights_only,
                  save_async=config.save_async, allow_nonfinite=config.save_allow_nonfinite,
                  ignore_keys=config.save_ignore_keys)
    kwargs.update(_remote_file_names(config))
    saver = CheckpointSaver(folder=run_folder, save_interval=config.save_interval,
                            state_dict_type=fmt, metadata=metadata, autoresume=autoresume,
                            **kwargs)
    if not (autoresume or kwargs["overwrite"]):
        existing = run_folder.newest_checkpoint(
            pointer_name(saver.latest_filename, state.run_name), state.run_name)
        if existing is not None:
            raise ValueError(
                f"save_folder {run_folder.url} already holds checkpoint {existing}; set "
                f"autoresume=True to continue that run, save_overwrite=True to replace its "
                f"checkpoints, or choose another save_folder / run_name.")
    if autoresume:  # another run's checkpoints there: refused now, not at the first save
        check_autoresume_folder(run_folder, state.run_name, name_template(kwargs["filename"], fmt))
    state.callbacks.append(saver)


def save_now(state: State, logger: Any, run_folder: Optional[RunFolder],
             metadata: dict[str, Any], parallelism_config: Any, name: str,
             weights_only: bool) -> Optional[str]:
    """Save a checkpoint now (``Trainer.save_checkpoint``), in the run saver's format, with a
    saver of its own (the run's keeps its rotation list); call on every rank. A background
    save in flight (``save_async``) finishes first, so ``latest`` moves in order."""
    from cadence.callbacks.checkpoint_saver import CheckpointSaver

    existing = run_saver(state.callbacks)
    if existing is not None:
        existing.wait()
    fmt = existing.state_dict_type if existing else _default_format(parallelism_config)
    saver = CheckpointSaver(folder=run_folder or ".", overwrite=True, symlink_filename=None,
                            state_dict_type=fmt, metadata=metadata)
    path = saver.save(state, logger, filename=name, weights_only=weights_only)
    return None if path is None else str(path)
