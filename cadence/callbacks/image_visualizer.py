"""``ImageVisualizer``: log a few training (and evaluation) images, or images with their
segmentation masks, to the loggers that show images (TensorBoard, W&B).

Source: the API of Composer's ``composer.callbacks.ImageVisualizer`` (names, arguments, the
``Images/Train`` and ``Images/Eval`` keys); implemented anew.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

from cadence.registry import callbacks
from cadence.core import Callback, Time, TimeUnit
from cadence.utils.batch_helpers import BatchKey, batch_get

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["ImageVisualizer"]

_MODES = ("input", "segmentation")


def _is_image_batch(inputs: Any, channels_last: bool) -> bool:
    """An image batch: ``[N, C, H, W]`` (or ``[N, H, W, C]``) with 1, 3 or 4 channels."""
    shape = getattr(inputs, "shape", None)
    if shape is None or len(shape) != 4:
        return False
    return shape[-1 if channels_last else 1] in (1, 3, 4)


@callbacks.register("image_visualizer")
class ImageVisualizer(Callback):
    """Logs ``num_images`` inputs of a training batch every ``interval`` under
    ``Images/Train``, and of the first batch of each evaluation under ``Images/Eval``.

    ``mode="input"`` logs the inputs (at ``BEFORE_FORWARD`` / ``EVAL_BEFORE_FORWARD``);
    ``mode="segmentation"`` logs them with two masks, ``ground_truth`` (the targets) and
    ``prediction`` (the argmax over classes of the model's outputs), at ``BEFORE_LOSS`` /
    ``EVAL_AFTER_FORWARD``, where the outputs exist. A batch whose inputs are not images
    ``[N, C, H, W]`` (1, 3 or 4 channels) is skipped.

    Args:
        interval: ``"100ba"`` (default) or ``"1ep"``: every so many batches or epochs (an
            int is batches), on the first batch of the interval.
        mode: ``"input"`` (default) or ``"segmentation"``.
        num_images: images per log, at most the batch size; default 8.
        channels_last: the images are ``[N, H, W, C]``; default ``False``.
        input_key: where the inputs are in the batch (an index, a key, a getter, a
            ``(getter, setter)`` pair); default 0.
        target_key: where the targets are; default 1.

    Raises:
        ValueError: an unknown ``mode``; an ``interval`` not in batches or epochs;
            ``num_images`` < 1.
    """

    def __init__(self, interval: Union[int, str, Time] = "100ba", mode: str = "input",
                 num_images: int = 8, channels_last: bool = False, input_key: BatchKey = 0,
                 target_key: BatchKey = 1) -> None:
        if str(mode).lower() not in _MODES:
            raise ValueError(f"ImageVisualizer mode {mode!r} is not one of {list(_MODES)}.")
        self.interval = Time.from_input(interval, TimeUnit.BATCH)
        if self.interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or self.interval.value < 1:
            raise ValueError(f"ImageVisualizer interval must be a positive number of batches or "
                             f"epochs ('100ba', '1ep'), got {interval!r}.")
        if isinstance(num_images, bool) or int(num_images) < 1:
            raise ValueError(f"ImageVisualizer num_images must be >= 1, got {num_images!r}.")
        self.mode, self.num_images = str(mode).lower(), int(num_images)
        self.channels_last, self.input_key, self.target_key = channels_last, input_key, target_key
        self.last_train_time_value_logged = -1

    def _due(self, state: State) -> bool:
        value = int(state.timestamp.get(self.interval.unit))
        if value % int(self.interval.value) != 0 or value == self.last_train_time_value_logged:
            return False
        self.last_train_time_value_logged = value
        return True

    def _log(self, state: State, logger: Any, name: str) -> None:
        inputs = batch_get(state.batch, self.input_key)
        if not _is_image_batch(inputs, self.channels_last):
            return
        images = inputs[: self.num_images].detach().float().cpu()
        masks = None
        if self.mode == "segmentation":
            targets = batch_get(state.batch, self.target_key)[: self.num_images]
            outputs = state.outputs[: self.num_images]
            masks = {"ground_truth": targets.detach().cpu(),
                     "prediction": outputs.detach().argmax(dim=1).cpu()}
        if images.max() > 1 or images.min() < 0:  # normalised inputs: min-max to [0, 1]
            low = images.amin(dim=(1, 2, 3), keepdim=True)
            high = images.amax(dim=(1, 2, 3), keepdim=True)
            images = (images - low) / (high - low).clamp(min=1e-12)
        logger.log_images(images, name=name, channels_last=self.channels_last, masks=masks,
                          use_table=True)

    def before_forward(self, state: State, logger: Any) -> None:
        if self.mode == "input" and self._due(state):
            self._log(state, logger, "Images/Train")

    def before_loss(self, state: State, logger: Any) -> None:
        if self.mode == "segmentation" and self._due(state):
            self._log(state, logger, "Images/Train")

    def eval_before_forward(self, state: State, logger: Any) -> None:
        if self.mode == "input" and int(state.eval_timestamp.batch) == 0:
            self._log(state, logger, "Images/Eval")

    def eval_after_forward(self, state: State, logger: Any) -> None:
        if self.mode == "segmentation" and int(state.eval_timestamp.batch) == 0:
            self._log(state, logger, "Images/Eval")
