"""ImageVisualizer: images reach a real TensorBoard event file (read back with TensorBoard's
reader), and segmentation masks reach the destinations."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from cadence import ComposerModel, Trainer
from cadence.callbacks import ImageVisualizer
from cadence.loggers import LoggerDestination, TensorBoardLogger
from tests.algorithms.vision_helpers import image_loader, tiny_classifier

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def test_train_and_eval_images_land_in_tensorboard(tmp_path: Path) -> None:
    tensorboard = TensorBoardLogger(log_dir=str(tmp_path / "tb"))
    trainer = Trainer(model=tiny_classifier(), train_dataloader=image_loader(batch_size=4),
                      eval_dataloader=image_loader(batch_size=4, num_samples=8, seed=7),
                      max_duration="5ba", eval_interval="5ba", progress_bar=False, seed=0,
                      callbacks=[ImageVisualizer(interval="2ba", num_images=3)],
                      loggers=[tensorboard])
    trainer.fit()
    trainer.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert {"Images/Train", "Images/Eval"} <= set(events.Tags()["images"])
    train = events.Images("Images/Train")
    # batches 0, 2, 4 have been completed at the forward of the 1st, 3rd and 5th batch
    assert sorted({e.step for e in train}) == [0, 2, 4]
    # one grid per log: num_images 16x16 images side by side
    assert all((e.width, e.height) == (3 * 16, 16) for e in train)
    assert len(events.Images("Images/Eval")) == 1  # the first eval batch only


class Recorder(LoggerDestination):
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False,
                   step: Optional[int] = None, masks: Any = None, mask_class_labels: Any = None,
                   use_table: bool = True) -> None:
        self.calls.append({"images": images, "name": name, "step": step, "masks": masks})


class PixelClassifier(ComposerModel):
    """A 1x1 convolution over 2 classes: outputs ``[N, 2, H, W]``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.conv(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


def test_segmentation_logs_targets_and_predictions() -> None:
    images = torch.rand(8, 3, 4, 4)
    targets = (images[:, 0] > 0.5).long()
    loader = DataLoader(list(zip(images, targets)), batch_size=4)
    recorder = Recorder()
    model = PixelClassifier()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ba", seed=0,
                      progress_bar=False, loggers=[recorder],
                      callbacks=[ImageVisualizer(interval=1, mode="segmentation", num_images=2)])
    trainer.fit()
    assert [c["step"] for c in recorder.calls] == [0, 1]
    first = recorder.calls[0]
    assert first["name"] == "Images/Train" and tuple(first["images"].shape) == (2, 3, 4, 4)
    assert torch.equal(first["masks"]["ground_truth"], targets[:2])
    assert first["masks"]["prediction"].shape == (2, 4, 4)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        ImageVisualizer(mode="masks")
    with pytest.raises(ValueError, match="interval"):
        ImageVisualizer(interval="10tok")
    with pytest.raises(ValueError, match="num_images"):
        ImageVisualizer(num_images=0)


def test_images_and_masks_reach_an_offline_wandb_run(tmp_path: Path) -> None:
    from cadence.loggers import WandBLogger
    from tests.loggers.test_wandb_logger import offline_runs

    wandb_logger = WandBLogger(project="images", init_kwargs={"dir": str(tmp_path / "wb")})
    images = torch.rand(4, 3, 4, 4)
    loader = DataLoader(list(zip(images, (images[:, 0] > 0.5).long())), batch_size=4)
    trainer = Trainer(model=PixelClassifier(), train_dataloader=loader, max_duration="1ba",
                      seed=0, progress_bar=False, loggers=[wandb_logger],
                      callbacks=[ImageVisualizer(interval=1, mode="segmentation", num_images=2)])
    trainer.fit()
    trainer.close()
    (run_dir,) = offline_runs(tmp_path / "wb")
    media = sorted(p.name for p in (run_dir / "files" / "media").rglob("*") if p.is_file())
    # wandb writes a list of images as one sprite, and each image's masks apart (files of
    # equal content once: two all-background prediction masks are one file)
    assert sum(name.endswith(".mask.png") for name in media) >= 2
    assert any(name.endswith(".png") and not name.endswith(".mask.png") for name in media)
