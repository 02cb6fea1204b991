"""The :class:`Logger` that algorithms and callbacks log through; it fans out to the
:class:`~cadence.loggers.logger_destination.LoggerDestination` s.

Source: MosaicML Composer's ``Logger`` (``composer/loggers/logger.py``).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union


from cadence.loggers.logger_destination import LoggerDestination

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["Logger"]


class Logger:
    """Fans logged metrics out to every :class:`LoggerDestination`.

    Args:
        state: the run's State; ``step`` defaults to ``state.timestamp.batch``.
        destinations: where metrics go: a sequence of destinations, or one destination
            (Composer's ``Logger(state, destinations=InMemoryLogger())``). Default none.
    """

    def __init__(self, state: State,
                 destinations: Union[LoggerDestination, Sequence[LoggerDestination], None] = ()
                 ) -> None:
        self._state = state
        self.destinations = ([destinations] if isinstance(destinations, LoggerDestination)
                             else list(destinations or ()))

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Log ``metrics`` (keys like ``loss/train/total``, ``metrics/eval/LanguagePerplexity``)."""
        if not self.destinations:
            return
        step = int(self._state.timestamp.batch if step is None else step)  # a Time too
        for destination in self.destinations:
            destination.log_metrics(metrics, step)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters (e.g. the whole YAML config) once."""
        for destination in self.destinations:
            destination.log_hyperparameters(hyperparameters)

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Log a table to every destination; ``step`` defaults to ``state.timestamp.batch``."""
        step = int(self._state.timestamp.batch if step is None else step)  # a Time too
        for destination in self.destinations:
            destination.log_table(columns, rows, name, step)

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False,
                   step: Optional[int] = None, masks: Optional[Mapping[str, Any]] = None,
                   mask_class_labels: Optional[Mapping[int, str]] = None,
                   use_table: bool = True) -> None:
        """Log images to every destination that takes them (TensorBoard, W&B).

        Args:
            images: one image ``[C, H, W]`` / ``[H, W]`` or a batch ``[N, C, H, W]`` (a tensor,
                a numpy array, or a sequence of images); ``[..., H, W, C]`` with
                ``channels_last``. Float values in ``[0, 1]`` or integers in ``[0, 255]``.
            name: the key; default ``"Images"``.
            channels_last: the channel dimension is last; default ``False``.
            step: default ``state.timestamp.batch``.
            masks: ``{mask name: masks [N, H, W]}`` of class indices (segmentation), shown over
                the images where the destination can (W&B).
            mask_class_labels: ``{class index: label}`` for the masks.
            use_table: W&B: put the images in a table; default ``True``.
        """
        step = int(self._state.timestamp.batch if step is None else step)
        for destination in self.destinations:
            destination.log_images(images, name, channels_last, step, masks, mask_class_labels,
                                   use_table)

    def upload_file(self, remote_file_name: str, file_path: Union[pathlib.Path, str], *,
                    overwrite: bool = False) -> None:
        """Hand the local file ``file_path`` to every destination that stores files, under
        ``remote_file_name``. Both may hold ``{run_name}``, ``{rank}``, ``{local_rank}``,
        ``{world_size}``, ``{node_rank}`` (filled in here, as Composer does).

        Raises:
            ValueError: a placeholder other than those.
        """
        from cadence.utils.dist import (
            get_global_rank, get_local_rank, get_node_rank, get_world_size,
        )

        values = {"run_name": self._state.run_name, "rank": get_global_rank(),
                  "local_rank": get_local_rank(), "world_size": get_world_size(),
                  "node_rank": get_node_rank()}
        try:
            remote = remote_file_name.format(**values)
            local = pathlib.Path(str(file_path).format(**values))
        except (KeyError, IndexError) as exc:
            raise ValueError(f"upload_file: unknown placeholder {exc} in {remote_file_name!r} "
                             f"or {str(file_path)!r}; known: {sorted(values)}.") from None
        for destination in self.destinations:
            destination.upload_file(self._state, remote, local, overwrite=overwrite)

    def has_file_upload_destination(self) -> bool:
        """Whether any destination stores files (:meth:`LoggerDestination.can_upload_files`)."""
        return any(destination.can_upload_files() for destination in self.destinations)
