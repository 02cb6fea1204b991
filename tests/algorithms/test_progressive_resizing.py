"""Progressive resizing: resize_batch shapes and dense labels, the schedule, a Trainer run
and a resumed run that resizes exactly as an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadence.algorithms import ProgressiveResizing
from cadence.functional import resize_batch
from tests.algorithms.vision_helpers import (
    BatchSpy,
    LossRecorder,
    image_loader,
    loss_fell,
    run_vision_trainer,
    tiny_classifier,
)


def test_resize_mode_shapes_and_index_labels_resized_nearest() -> None:
    x = torch.randn(2, 3, 16, 12)
    y = torch.arange(16 * 12).view(1, 16, 12).expand(2, 16, 12).clone()  # [N, H, W] int64
    new_x, new_y = resize_batch(x, y, 0.5, mode="resize", resize_targets=True)
    assert new_x.shape == (2, 3, 8, 6) and new_y.shape == (2, 8, 6)
    assert new_y.dtype == torch.int64
    assert torch.equal(new_y[0], y[0, ::2, ::2])  # nearest: every other pixel
    assert torch.equal(new_x, x[..., ::2, ::2])
    kept_x, kept_y = resize_batch(x, torch.arange(2), 0.5)  # labels [N] untouched
    assert kept_x.shape == (2, 3, 8, 6) and torch.equal(kept_y, torch.arange(2))


def test_crop_mode_takes_one_window_of_input_and_target() -> None:
    x = torch.arange(16 * 16, dtype=torch.float32).view(1, 1, 16, 16).expand(2, 3, 16, 16)
    y = x[:, 0].long()
    new_x, new_y = resize_batch(x, y, 0.5, mode="crop", resize_targets=True)
    assert new_x.shape == (2, 3, 8, 8) and torch.equal(new_y, new_x[:, 0].long())
    top, left = divmod(int(new_x[0, 0, 0, 0]), 16)
    assert torch.equal(new_x, x[..., top:top + 8, left:left + 8])


def test_no_change_at_full_scale_and_bad_arguments() -> None:
    x, y = torch.randn(1, 3, 8, 8), torch.zeros(1)
    assert resize_batch(x, y, 1.0)[0] is x
    with pytest.raises(ValueError, match="mode 'zoom'"):
        resize_batch(x, y, 0.5, mode="zoom")
    with pytest.raises(ValueError, match="dense targets"):
        resize_batch(x, y, 0.5, resize_targets=True)
    with pytest.raises(ValueError, match="delay_fraction \\+ finetune_fraction"):
        ProgressiveResizing(delay_fraction=0.6, finetune_fraction=0.5)
    with pytest.raises(ValueError, match="initial_scale must be in"):
        ProgressiveResizing(initial_scale=1.5)


def test_schedule_holds_ramps_then_finetunes() -> None:
    algorithm = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.25,
                                    finetune_fraction=0.25)
    assert [algorithm.scale_at(t) for t in (0.0, 0.2, 0.25, 0.5, 0.75, 0.9)] == \
        [0.5, 0.5, 0.5, 0.75, 1.0, 1.0]


def _widths(spy: BatchSpy) -> list[int]:
    return [int(x.shape[-1]) for x, _ in spy.seen["before_forward"]]


def test_trainer_grows_the_input_and_loss_falls() -> None:
    spy, recorder = BatchSpy("before_forward"), LossRecorder()
    algorithm = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.25,
                                    finetune_fraction=0.25, size_increment=4)
    run_vision_trainer(tiny_classifier(), [algorithm], steps=12, callbacks=[spy, recorder],
                       train_dataloader=image_loader(batch_size=8, num_samples=96))
    widths = _widths(spy)
    assert widths == sorted(widths) and widths[0] == 8 and widths[-1] == 16
    assert {int(x.shape[-2]) for x, _ in spy.seen["before_forward"][:3]} == {8}
    assert loss_fell(recorder.losses)


def test_resumed_run_resizes_like_an_uninterrupted_one(tmp_path: Path) -> None:
    def run(spy: BatchSpy, **kwargs) -> None:
        algorithm = ProgressiveResizing(initial_scale=0.25, delay_fraction=0.0,
                                        finetune_fraction=0.0, size_increment=2)
        run_vision_trainer(tiny_classifier(), [algorithm], steps=6, callbacks=[spy],
                           train_dataloader=image_loader(batch_size=8, num_samples=48),
                           save_folder=str(tmp_path), run_name="pr", save_interval="3ba",
                           **kwargs)

    straight, resumed = BatchSpy("before_forward"), BatchSpy("before_forward")
    run(straight)
    (checkpoint,) = tmp_path.glob("ep0-ba3*.pt")
    run(resumed, load_path=str(checkpoint), save_overwrite=True)
    assert len(_widths(resumed)) == 3 and _widths(resumed) == _widths(straight)[3:]
    for (a, _), (b, _) in zip(straight.seen["before_forward"][3:], resumed.seen["before_forward"],
                              strict=True):
        assert torch.equal(a, b)
