"""LabelSmoothing: smoothed targets are probabilities that sum to one (ignored tokens: zero);
the language model's loss against them is PyTorch's label-smoothed cross entropy; the
Trainer's loss uses them and metrics see the true labels; it runs on 2 FSDP2 ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cadence import Callback, State
from cadence.algorithms import LabelSmoothing, smooth_labels
from cadence.loss import soft_cross_entropy
from tests.algorithms.algorithm_helpers import CountingTokens, run_trainer, tiny_gpt


def test_index_targets_become_rows_that_sum_to_one() -> None:
    logits = torch.randn(5, 4)
    target = torch.tensor([0, 3, 1, 1, 2])
    smoothed = smooth_labels(logits, target, smoothing=0.2)
    assert smoothed.shape == (5, 4)
    torch.testing.assert_close(smoothed.sum(dim=1), torch.ones(5))
    assert smoothed[1].tolist() == pytest.approx([0.05, 0.05, 0.05, 0.85])
    # the same distribution PyTorch's label_smoothing trains against
    torch.testing.assert_close(soft_cross_entropy(logits, smoothed),
                               F.cross_entropy(logits, target, label_smoothing=0.2))


def test_one_hot_and_pixel_targets() -> None:
    one_hot = F.one_hot(torch.tensor([2, 0]), 3).float()
    assert smooth_labels(torch.zeros(2, 3), one_hot, 0.3)[0].tolist() == pytest.approx(
        [0.1, 0.1, 0.8])
    pixels = smooth_labels(torch.zeros(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4)), 0.1)
    torch.testing.assert_close(pixels.sum(dim=1), torch.ones(2, 4, 4))  # classes at dim 1


def test_language_model_labels_ignore_minus_100_and_match_torch() -> None:
    model = tiny_gpt()
    ids = CountingTokens(3).ids
    labels = ids.clone()
    labels[0, 10:] = -100
    batch = {"input_ids": ids, "labels": labels}
    outputs = model(batch)
    smoothed = smooth_labels(outputs.logits, labels, 0.1)  # [3, 16, 64]: classes last
    assert smoothed.shape == outputs.logits.shape
    assert torch.all(smoothed[0, 10:] == 0)
    torch.testing.assert_close(smoothed[1].sum(-1), torch.ones(16))
    loss = model.loss(outputs, {**batch, "labels": smoothed})
    expected = F.cross_entropy(outputs.logits[:, :-1].transpose(1, 2), labels[:, 1:],
                               ignore_index=-100, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(loss, model.loss(outputs, batch))


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        LabelSmoothing(smoothing=1.5)
    with pytest.raises(ValueError, match="fits neither"):
        smooth_labels(torch.zeros(2, 3), torch.zeros(5, dtype=torch.long))


class Losses(Callback):
    """Each step's loss, the labels after AFTER_LOSS, and a reference smoothed loss."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.losses: list[float] = []
        self.expected: list[float] = []
        self.label_dtypes: list[torch.dtype] = []

    def after_loss(self, state: State, logger: Any) -> None:
        labels, logits = state.batch["labels"], state.outputs.logits.detach()
        self.label_dtypes.append(labels.dtype)
        self.expected.append(float(F.cross_entropy(
            logits[:, :-1].transpose(1, 2), labels[:, 1:], label_smoothing=self.smoothing)))
        self.losses.append(float(state.loss.detach()))


def test_trainer_trains_on_smoothed_labels_and_restores_them() -> None:
    losses = Losses(0.1)
    run_trainer(tiny_gpt(), [LabelSmoothing(0.1, target_key="labels")], steps=8,
                callbacks=[losses])
    assert losses.label_dtypes == [torch.int64] * 8  # true labels back for metrics
    assert losses.losses == pytest.approx(losses.expected, rel=1e-5)
    assert losses.losses[-1] < losses.losses[0] - 0.5


def test_composer_default_target_key_on_a_dict_batch_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="target_key='labels'"):
        run_trainer(tiny_gpt(), [LabelSmoothing()], steps=1)


@pytest.fixture(scope="module")
def single_process_losses() -> list[float]:
    losses = Losses(0.1)
    run_trainer(tiny_gpt(), [LabelSmoothing(0.1, "labels")], steps=3, callbacks=[losses])
    return losses.losses


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_fsdp_two_ranks(single_process_losses: list[float]) -> None:
    from cadence.trainer.loss_weighting import mean_over_ranks

    class Totals(Callback):
        def __init__(self) -> None:
            self.totals: list[float] = []

        def batch_end(self, state: State, logger: Any) -> None:
            self.totals.append(float(mean_over_ranks(state.total_loss)))

    totals, losses = Totals(), Losses(0.1)
    run_trainer(tiny_gpt(), [LabelSmoothing(0.1, "labels")], steps=3,
                callbacks=[totals, losses], parallelism_config={"fsdp": {}})
    assert losses.losses == pytest.approx(losses.expected, rel=1e-5)  # this rank's half
    assert totals.totals == pytest.approx(single_process_losses, rel=1e-4)
