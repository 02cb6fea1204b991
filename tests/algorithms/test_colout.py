"""ColOut: rows and columns dropped from tensors, PIL images and dense targets, per batch
in a Trainer or per sample as a dataset transform."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.algorithms import ColOut, ColOutTransform
from cadence.functional import colout_batch
from tests.algorithms.vision_helpers import (
    BatchSpy,
    LossRecorder,
    PILBrightestChannel,
    ToTensor,
    image_loader,
    loss_fell,
    run_vision_trainer,
    tiny_classifier,
)


def _grid(n: int, h: int, w: int) -> torch.Tensor:
    """``[n, 2, h, w]``: channel 0 holds the row index, channel 1 the column index."""
    rows = torch.arange(h, dtype=torch.float32).view(h, 1).expand(h, w)
    cols = torch.arange(w, dtype=torch.float32).view(1, w).expand(h, w)
    return torch.stack([rows, cols]).expand(n, 2, h, w).clone()


def test_batch_shape_and_rows_columns_kept_in_order() -> None:
    out = colout_batch(_grid(4, 20, 10), p_row=0.25, p_col=0.5)
    assert out.shape == (4, 2, 15, 5)
    kept_rows, kept_cols = out[0, 0, :, 0], out[0, 1, 0, :]
    assert torch.all(kept_rows[1:] > kept_rows[:-1]) and torch.all(kept_cols[1:] > kept_cols[:-1])
    assert torch.equal(out[:, 0], kept_rows.view(1, 15, 1).expand(4, 15, 5))  # same for all


def test_dense_target_loses_the_same_rows_and_columns() -> None:
    x = _grid(2, 12, 12)
    y = x[:, 0].long() * 100 + x[:, 1].long()  # [N, H, W]: each pixel names its place
    new_x, new_y = colout_batch((x, y), p_row=0.5, p_col=0.25)
    assert new_x.shape == (2, 2, 6, 9) and new_y.shape == (2, 6, 9)
    assert torch.equal(new_y, new_x[:, 0].long() * 100 + new_x[:, 1].long())
    # class-index targets [N] are not images: 'auto' leaves them alone
    assert colout_batch((x, torch.arange(2)), 0.5, 0.5).shape == (2, 2, 6, 6)


def test_pil_image_keeps_mode() -> None:
    import PIL.Image

    for mode, shape in (("RGB", (10, 20, 3)), ("L", (10, 20))):
        image = PIL.Image.fromarray(np.random.randint(0, 255, shape, dtype=np.uint8))
        out = ColOutTransform(p_row=0.2, p_col=0.5)(image)
        assert out.mode == mode and out.size == (10, 8)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"p_row": 1.5}, ValueError, "p_row must be between 0 and 1"),
    ({"p_col": -0.1}, ValueError, "p_col must be between 0 and 1"),
    ({"resize_target": "yes"}, ValueError, "resize_target must be"),
    ({"resize_target": True, "batch": False}, NotImplementedError, "batch=True"),
])
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ColOut(**kwargs)


def test_trainer_batch_mode_shrinks_the_input_and_loss_falls() -> None:
    spy, recorder = BatchSpy("before_forward"), LossRecorder()
    run_vision_trainer(tiny_classifier(), [ColOut(p_row=0.15, p_col=0.15)], steps=12,
                       callbacks=[spy, recorder],
                       train_dataloader=image_loader(batch_size=8, num_samples=96))
    assert {tuple(x.shape) for x, _ in spy.seen["before_forward"]} == {(8, 3, 13, 13)}
    assert loss_fell(recorder.losses)


def test_trainer_sample_mode_adds_the_transform_before_to_tensor_once() -> None:
    from torch.utils.data import DataLoader

    dataset = PILBrightestChannel(16)
    spy = BatchSpy("after_dataloader")
    algorithm = ColOut(p_row=0.5, p_col=0.25, batch=False)
    trainer = run_vision_trainer(tiny_classifier(), [algorithm], steps=2, callbacks=[spy],
                                 train_dataloader=DataLoader(dataset, batch_size=8))
    assert isinstance(dataset.transform[0], ColOutTransform)
    assert isinstance(dataset.transform[1], ToTensor) and len(dataset.transform) == 2
    assert {tuple(x.shape) for x, _ in spy.seen["after_dataloader"]} == {(8, 3, 8, 12)}
    trainer.state.max_duration = "3ba"
    trainer.fit()  # a second fit does not add it again
    assert len(dataset.transform) == 2


def test_sample_mode_refuses_a_dataset_without_transform() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from cadence.core.event import Event

    class _State:
        dataloader = DataLoader(TensorDataset(torch.zeros(4, 3, 8, 8)))
        train_dataloader = None

    with pytest.raises(TypeError, match="has no 'transform' attribute"):
        ColOut(batch=False).apply(Event.FIT_START, _State(), None)
    _State.dataloader = [torch.zeros(1)]
    with pytest.raises(TypeError, match="needs a torch.utils.data.DataLoader"):
        ColOut(batch=False).match(Event.FIT_START, _State())
