"""The :class:`LoggerDestination` base class: where logged metrics go (a file, the console,
wandb, ...).

Source: MosaicML Composer's ``LoggerDestination`` (``composer/loggers/logger_destination.py``).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from cadence.core.callback import Callback

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["image_batch", "mask_batch", "LoggerDestination", "to_python"]


def to_python(value: Any) -> Any:
    """A logged value as a plain Python number (tensors read here, at write time, not at log
    time, so logging a device tensor costs no host sync until a destination writes it)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def image_batch(images: Any, channels_last: bool = False) -> torch.Tensor:
    """``images`` (a tensor, numpy array or sequence of them; one image ``[C, H, W]`` /
    ``[H, W]`` or a batch ``[N, C, H, W]``; channels last with ``channels_last``) as a float
    CPU tensor ``[N, C, H, W]`` in ``[0, 1]`` (integers are read as 0-255).

    Raises:
        ValueError: an array of fewer than 2 or more than 4 dimensions.
    """
    if isinstance(images, (list, tuple)):
        batch = torch.stack([torch.as_tensor(image) for image in images])
    else:
        batch = torch.as_tensor(images)
    batch = batch.detach().cpu()
    if not 2 <= batch.ndim <= 4:
        raise ValueError(f"log_images takes an image [C, H, W] / [H, W] or a batch "
                         f"[N, C, H, W]; got shape {tuple(batch.shape)}.")
    if batch.ndim == 2:  # [H, W]
        batch = batch.unsqueeze(-1 if channels_last else 0)
    if batch.ndim == 3:
        batch = batch.unsqueeze(0)
    if channels_last:
        batch = batch.permute(0, 3, 1, 2)
    if not batch.is_floating_point():
        return batch.float() / 255.0
    return batch.float().clamp(0.0, 1.0)


def mask_batch(masks: Any) -> torch.Tensor:
    """Segmentation masks (one ``[H, W]`` or a batch ``[N, H, W]`` of class indices; a
    tensor, an array or a sequence of them) as an int64 CPU tensor ``[N, H, W]``."""
    if isinstance(masks, (list, tuple)):
        batch = torch.stack([torch.as_tensor(mask) for mask in masks])
    else:
        batch = torch.as_tensor(masks)
    batch = batch.detach().cpu().long()
    return batch.unsqueeze(0) if batch.ndim == 2 else batch


class LoggerDestination(Callback):
    """Where logged metrics go (a file, the console, wandb). It is a :class:`Callback` too,
    so it sees every event (e.g. to draw a progress bar).

    Values may be 0-d tensors; call :func:`to_python` when writing them.
    """

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Receive ``metrics`` (name -> number or 0-d tensor) at optimizer step ``step``."""
        del metrics, step

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Receive the run's configuration and other hyperparameters once."""
        del hyperparameters

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Receive a table (``rows`` of values under ``columns``); default: ignore it."""
        del columns, rows, name, step

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False,
                   step: Optional[int] = None, masks: Optional[Mapping[str, Any]] = None,
                   mask_class_labels: Optional[Mapping[int, str]] = None,
                   use_table: bool = True) -> None:
        """Receive images (Composer's signature; see :meth:`cadence.loggers.Logger.log_images`);
        default: ignore them."""
        del images, name, channels_last, step, masks, mask_class_labels, use_table

    def can_upload_files(self) -> bool:
        """Whether :meth:`upload_file` stores files somewhere (default False)."""
        return False

    def upload_file(self, state: State, remote_file_name: str,
                    file_path: pathlib.Path, *, overwrite: bool) -> None:
        """Store the local file ``file_path`` under ``remote_file_name`` (an object store, a
        run's artifacts); default: ignore it. Composer's signature.

        The file may change or disappear once this returns: copy it first if the upload
        happens in the background.
        """
        del state, remote_file_name, file_path, overwrite
