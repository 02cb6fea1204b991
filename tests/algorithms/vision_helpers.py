"""A tiny image classifier and a learnable synthetic image dataset for the vision algorithm
tests (BlurPool, SqueezeExcite, StochasticDepth, ..., CutMix, MixUp, ...).

- :class:`BrightestChannel`: images ``[3, 16, 16]`` float32 whose label (int64 in ``[0, 3)``)
  is the colour channel with the largest mean, so a small conv net learns it in a few steps.
- :class:`Bottleneck`: a ResNet bottleneck block with torchvision's attribute names
  (``conv1..conv3``, ``bn1..bn3``, ``relu``, ``downsample``, ``stride``, ``expansion = 4``).
- :class:`TinyConvNet`: stem conv + BatchNorm + max-pool, bottleneck blocks, a stride-2 conv
  with BatchNorm or GroupNorm, average pool, optional Dropout, Linear head.
- :func:`tiny_classifier`: the net in a ``ComposerClassifier``; :func:`image_loader`;
  :func:`run_vision_trainer`: ``run_trainer`` on :func:`image_loader`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from cadence import Trainer, dist
from cadence.core.callback import Callback
from cadence.models.tasks.classification import ComposerClassifier
from tests.algorithms.algorithm_helpers import run_trainer

__all__ = ["IMAGE_SIZE", "NUM_CLASSES", "BrightestChannel", "Bottleneck", "TinyConvNet",
           "tiny_classifier", "image_loader", "run_vision_trainer", "train_losses",
           "LossRecorder", "strided_bottleneck", "record_applies", "loss_fell"]

IMAGE_SIZE = 16
NUM_CLASSES = 3


class BrightestChannel(Dataset):
    """``num_samples`` images ``[3, size, size]`` (Gaussian noise, std 0.5) where the label's
    channel is raised by 1.0; ``(image float32, label int64)``. Deterministic in ``seed``."""

    def __init__(self, num_samples: int = 64, seed: int = 1234, size: int = IMAGE_SIZE) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=gen)
        images = 0.5 * torch.randn(num_samples, 3, size, size, generator=gen)
        images[torch.arange(num_samples), self.labels] += 1.0
        self.images = images

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def image_loader(batch_size: int = 8, num_samples: int = 64, seed: int = 1234,
                 size: int = IMAGE_SIZE, shuffle: bool = False) -> DataLoader:
    """:class:`BrightestChannel` batches ``([B, 3, size, size], [B])``, ``batch_size /
    world_size`` per rank."""
    dataset = BrightestChannel(num_samples, seed, size)
    return DataLoader(dataset, batch_size=batch_size // dist.get_world_size(),
                      sampler=dist.get_sampler(dataset, shuffle=shuffle, seed=seed))


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv) with torchvision's attribute names:
    ``[N, inplanes, H, W] -> [N, planes * 4, H / stride, W / stride]``."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: Optional[nn.Module] = None) -> None:
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def strided_bottleneck(inplanes: int = 16, planes: int = 8) -> Bottleneck:
    """A stride-2 :class:`Bottleneck` with a conv1x1 + BatchNorm ``downsample``."""
    downsample = nn.Sequential(
        nn.Conv2d(inplanes, planes * Bottleneck.expansion, 1, stride=2, bias=False),
        nn.BatchNorm2d(planes * Bottleneck.expansion))
    return Bottleneck(inplanes, planes, stride=2, downsample=downsample)


class TinyConvNet(nn.Module):
    """``[N, 3, H, W] -> [N, num_classes]`` logits (about 5 k parameters at the defaults).

    stem: ``conv1`` (3->16, 3x3) + ``bn1`` + ReLU + ``maxpool`` (2x2, stride 2);
    ``layer1``: ``num_blocks`` identity :class:`Bottleneck` blocks (16 channels);
    ``down``: 3x3 conv stride 2 (16->32) + ``norm`` (BatchNorm2d, or GroupNorm(4, 32) with
    ``groupnorm=True``) + ReLU; ``pool`` (global average), ``dropout`` (Identity at 0),
    ``fc`` (Linear 32->num_classes).
    """

    def __init__(self, num_classes: int = NUM_CLASSES, num_blocks: int = 1,
                 groupnorm: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.layer1 = nn.Sequential(*[Bottleneck(16, 4) for _ in range(num_blocks)])
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.norm = nn.GroupNorm(4, 32) if groupnorm else nn.BatchNorm2d(32)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.relu(self.norm(self.down(x)))
        x = torch.flatten(self.pool(x), 1)
        return self.fc(self.dropout(x))


def tiny_classifier(num_classes: int = NUM_CLASSES, num_blocks: int = 1, groupnorm: bool = False,
                    dropout: float = 0.0, seed: int = 0) -> ComposerClassifier:
    """A seeded :class:`TinyConvNet` in a ``ComposerClassifier``."""
    torch.manual_seed(seed)
    net = TinyConvNet(num_classes, num_blocks=num_blocks, groupnorm=groupnorm, dropout=dropout)
    return ComposerClassifier(net, num_classes=num_classes)


def run_vision_trainer(model: Any, algorithms: Sequence[Any] = (), steps: int = 8,
                       fit: bool = True, **kwargs: Any) -> Trainer:
    """:func:`run_trainer` (AdamW lr 1e-2, CPU, seed 0) on :func:`image_loader`."""
    kwargs.setdefault("train_dataloader", image_loader())
    return run_trainer(model, algorithms, steps=steps, fit=fit, **kwargs)


def train_losses(trainer: Trainer) -> list[float]:
    """The per-batch training losses a fitted trainer logged, in order (needs a
    ``LossRecorder`` callback passed in ``callbacks=``; see :class:`LossRecorder`)."""
    for callback in trainer.state.callbacks:
        if isinstance(callback, LossRecorder):
            return callback.losses
    raise ValueError("train_losses: pass callbacks=[LossRecorder()] to the Trainer")


class LossRecorder(Callback):
    """Records ``state.loss`` (a float) after every training batch."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_train_batch(self, state: Any, logger: Any) -> None:
        loss = state.loss
        if isinstance(loss, dict):
            loss = sum(loss.values())
        if isinstance(loss, (list, tuple)):
            loss = sum(loss)
        self.losses.append(float(torch.as_tensor(loss).detach()))


def record_applies(algorithm: Any) -> list[Any]:
    """The events at which ``algorithm.apply`` runs, recorded from now on (in order)."""
    events: list[Any] = []
    original = algorithm.apply

    def apply(event: Any, state: Any, logger: Any) -> Any:
        events.append(event)
        return original(event, state, logger)

    algorithm.apply = apply
    return events


def loss_fell(losses: Sequence[float], window: int = 4) -> bool:
    """Whether the mean of the last ``window`` losses is below that of the first."""
    return sum(losses[-window:]) / window < sum(losses[:window]) / window


class ToTensor:
    """A ``PIL`` image -> ``[C, H, W]`` float32 in ``[0, 1]``; named like torchvision's
    ``ToTensor`` so that ``add_vision_dataset_transform`` inserts ``PIL`` transforms before it."""

    def __call__(self, image: Any) -> torch.Tensor:
        from cadence.algorithms.utils.augmentation_common import image_as_type

        return image_as_type(image, torch.Tensor)


class PILBrightestChannel(Dataset):
    """:class:`BrightestChannel` as RGB ``PIL`` images (values clipped to ``[0, 1]``, 8-bit)
    with a torchvision-style ``transform`` attribute (default ``[ToTensor()]``, a list the
    dataset applies in order; set it to None, a callable or a list)."""

    def __init__(self, num_samples: int = 64, seed: int = 1234, size: int = IMAGE_SIZE) -> None:
        import PIL.Image

        base = BrightestChannel(num_samples, seed, size)
        pixels = (base.images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
        self.images = [PIL.Image.fromarray(array) for array in pixels.numpy()]
        self.labels = base.labels
        self.transform: Any = [ToTensor()]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, torch.Tensor]:
        image = self.images[index]
        steps = self.transform if isinstance(self.transform, list) else [self.transform]
        for step in steps:
            if step is not None:
                image = step(image)
        return image, self.labels[index]


class BatchSpy(Callback):
    """Records ``(input, target)`` clones of ``state.batch`` (a pair) at the named events,
    after the algorithms ran: ``spy.seen[event_name]`` is a list, one entry per call."""

    def __init__(self, *event_names: str) -> None:
        self.seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {
            name: [] for name in event_names}

    def run_event(self, event: Any, state: Any, logger: Any) -> None:
        if event.value in self.seen:
            inputs, targets = state.batch[0], state.batch[1]
            self.seen[event.value].append((inputs.detach().clone(), targets.detach().clone()))


def random_pil_image(mode: str = "RGB", size: tuple[int, int] = (20, 14), seed: int = 0) -> Any:
    """A ``PIL`` image of uniform random 8-bit pixels, ``size`` = (width, height)."""
    import numpy as np
    import PIL.Image

    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    return PIL.Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape,
                                                                      dtype=np.uint8))


def assert_dataset_transform_added_and_loss_falls(algorithm: Any, transform_type: type) -> None:
    """Train :func:`tiny_classifier` on :class:`PILBrightestChannel` with ``algorithm`` (a
    dataset-transform augmentation): its ``transform_type`` goes in before ``ToTensor``, the
    first batch differs from the plain images (same shape), and the loss falls."""
    from torch.utils.data import DataLoader

    dataset = PILBrightestChannel(96)
    plain = torch.stack([dataset[i][0] for i in range(8)])
    spy, recorder = BatchSpy("after_dataloader"), LossRecorder()
    run_vision_trainer(tiny_classifier(), [algorithm], steps=12, callbacks=[spy, recorder],
                       train_dataloader=DataLoader(dataset, batch_size=8))
    assert isinstance(dataset.transform[0], transform_type)
    assert isinstance(dataset.transform[1], ToTensor)
    first, _ = spy.seen["after_dataloader"][0]
    assert first.shape == plain.shape and not torch.equal(first, plain)
    assert loss_fell(recorder.losses)
