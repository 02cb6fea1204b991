"""CutOut (DeVries & Taylor 2017): holes of the documented size, on tensors and PIL images,
and the algorithm in a Trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.algorithms import CutOut
from cadence.functional import cutout_batch
from tests.algorithms.vision_helpers import (
    BatchSpy,
    LossRecorder,
    image_loader,
    loss_fell,
    record_applies,
    run_vision_trainer,
    tiny_classifier,
)


def _expected_hole(center: tuple[int, int], side: int, h: int, w: int) -> torch.Tensor:
    cy, cx = center
    mask = torch.zeros(h, w, dtype=torch.bool)
    mask[max(cy - side // 2, 0):min(cy + side // 2, h),
         max(cx - side // 2, 0):min(cx + side // 2, w)] = True
    return mask


@pytest.mark.parametrize("uniform_sampling", [False, True])
def test_one_hole_zeroes_the_clipped_square_in_every_image(uniform_sampling: bool) -> None:
    x = torch.rand(3, 2, 16, 20) + 0.5  # no zeros before
    for seed in range(10):
        np.random.seed(seed)
        out = cutout_batch(x, num_holes=1, length=0.5, uniform_sampling=uniform_sampling)
        np.random.seed(seed)  # the same centre draw as inside cutout_batch
        if uniform_sampling:
            cy, cx = np.random.randint(-4, 20), np.random.randint(-4, 24)
        else:
            cy, cx = np.random.randint(16), np.random.randint(20)
        hole = _expected_hole((cy, cx), 8, 16, 20)  # side = 0.5 * min(16, 20)
        assert torch.equal(out == 0, hole.expand_as(out))
        assert torch.equal(out[..., ~hole], x[..., ~hole])


def test_an_interior_hole_has_side_length_squared_pixels() -> None:
    np.random.seed(0)
    areas = {int((cutout_batch(torch.ones(1, 32, 32), length=0.25) == 0).sum())
             for _ in range(50)}
    assert 64 in areas and max(areas) == 64  # 8x8 when not clipped by the border


def test_pil_image_in_pil_image_out() -> None:
    import PIL.Image

    image = PIL.Image.fromarray(np.full((10, 12, 3), 200, dtype=np.uint8))
    out = cutout_batch(image, num_holes=2, length=0.4)
    assert isinstance(out, PIL.Image.Image) and out.size == (12, 10) and out.mode == "RGB"
    array = np.asarray(out)
    assert (array == 0).any() and set(np.unique(array)) <= {0, 200}


@pytest.mark.parametrize("kwargs, match", [({"num_holes": -1}, "num_holes"),
                                           ({"length": 1.5}, "length must be in")])
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CutOut(**kwargs)
    with pytest.raises(ValueError, match=match):
        cutout_batch(torch.ones(1, 4, 4), **kwargs)


def test_trainer_cuts_holes_after_the_dataloader_and_loss_falls() -> None:
    algorithm = CutOut(num_holes=1, length=0.5)
    events = record_applies(algorithm)
    spy, recorder = BatchSpy("after_dataloader"), LossRecorder()
    run_vision_trainer(tiny_classifier(), [algorithm], steps=12, callbacks=[spy, recorder],
                       train_dataloader=image_loader(batch_size=8, num_samples=96))
    assert {e.value for e in events} == {"after_dataloader"} and len(events) == 12
    for x, _ in spy.seen["after_dataloader"]:
        zero = (x == 0).all(dim=(0, 1))  # the same hole in every image and channel
        assert 0 < int(zero.sum()) <= 64 and x.shape == (8, 3, 16, 16)
    assert loss_fell(recorder.losses)
