"""SelectiveBackprop: the schedule of pruned batches; the selection favours the highest
losses and keeps int(keep * N) samples; in a Trainer the pruned batches are smaller, the
timestamp counts what was trained, training learns, and resume is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, State
from cadence.algorithms import SelectiveBackprop, select_using_loss, should_selective_backprop
from tests.algorithms.algorithm_helpers import run_trainer, tiny_gpt


def test_should_selective_backprop_schedule() -> None:
    assert not should_selective_backprop(0.4, 0)  # before start
    assert should_selective_backprop(0.5, 0) and not should_selective_backprop(0.5, 1)
    assert should_selective_backprop(0.6, 2) and not should_selective_backprop(0.9, 0)
    assert should_selective_backprop(0.6, 1, interrupt=0)  # never interrupted
    assert [should_selective_backprop(0.6, i, interrupt=3) for i in range(6)] == [
        True, True, False, True, True, False]


def _identity_scores(n: int, keep: float, draws: int) -> torch.Tensor:
    """How often each sample is kept when sample i's loss is i (the last is the worst)."""
    inputs = torch.arange(n, dtype=torch.float32).unsqueeze(1)  # [n, 1]
    targets = torch.arange(n)
    counts = torch.zeros(n)
    for _ in range(draws):
        kept_x, kept_y = select_using_loss(
            inputs, targets, model=lambda x: x,
            loss_fun=lambda out, y, reduction="none": out.squeeze(1), keep=keep)
        assert kept_x.shape == (int(keep * n), 1) and torch.equal(kept_x.squeeze(1).long(), kept_y)
        assert len(set(kept_y.tolist())) == kept_y.numel()  # without replacement
        counts[kept_y] += 1
    return counts / draws


def test_select_using_loss_keeps_the_highest_losses_most_often() -> None:
    torch.manual_seed(0)
    rates = _identity_scores(10, keep=0.5, draws=400)
    assert rates[:5].sum() < rates[5:].sum()  # the worse half is chosen more
    assert rates[9] > 0.7 and rates[0] < 0.2  # weights (rank + 0.5) / n: 0.05 ... 0.95
    rates = _identity_scores(10, keep=0.1, draws=200)  # exponent 9: the worst, nearly always
    assert rates[9] > 0.6 and rates[:5].sum() < 0.05


def test_select_using_loss_refuses_bad_values() -> None:
    x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="keep"):
        select_using_loss(x, y, lambda v: v, lambda o, t, reduction: o.sum(1), keep=0.0)
    with pytest.raises(ValueError, match="scale_factor"):
        select_using_loss(x, y, lambda v: v, lambda o, t, reduction: o.sum(1), scale_factor=0.5)
    with pytest.raises(ValueError, match="one loss per sample"):
        select_using_loss(x, y, lambda v: v, lambda o, t, reduction: o.sum())


class Batches(Callback):
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.losses: list[float] = []
        self.samples: list[int] = []
        self.tokens: list[int] = []

    def before_forward(self, state: State, logger: Any) -> None:
        self.sizes.append(int(state.batch["input_ids"].shape[0]))

    def batch_end(self, state: State, logger: Any) -> None:
        self.losses.append(float(state.total_loss))
        self.samples.append(int(state.timestamp.sample))
        self.tokens.append(int(state.timestamp.token))


def _algorithm(**kwargs: Any) -> SelectiveBackprop:
    kwargs = {"start": 0.0, "end": 1.0, "keep": 0.5, "input_key": "input_ids",
              "target_key": "labels", **kwargs}
    return SelectiveBackprop(**kwargs)


def test_trainer_trains_on_the_kept_samples() -> None:
    batches = Batches()
    run_trainer(tiny_gpt(), [_algorithm()], steps=12, callbacks=[batches])
    assert batches.sizes == [4, 8] * 6  # every second batch (interrupt=2) whole
    assert batches.samples[:4] == [8, 16, 24, 32]  # the loader's samples (Composer's count)
    assert batches.tokens[-1] == 16 * 6 * 12
    assert batches.losses[-1] < batches.losses[1] - 0.3


def test_default_keys_on_a_dict_batch_say_what_to_pass() -> None:
    with pytest.raises(ValueError, match="input_key='input_ids'"):
        run_trainer(tiny_gpt(), [SelectiveBackprop(start=0.0)], steps=1)
    with pytest.raises(ValueError, match="keep"):
        SelectiveBackprop(keep=1.5)
    with pytest.raises(ValueError, match="start"):
        SelectiveBackprop(start=0.9, end=0.5)


@pytest.mark.parametrize("at", [3, 4], ids=["mid-epoch", "epoch-boundary"])
def test_resume_mid_selection_is_exact(tmp_path: Path, at: int) -> None:
    # mid-epoch too: the timestamp counts the loader's samples, so the elastic-resume check
    # reads the checkpoint's global batch from them although the trained batches were pruned
    def trainer(**kwargs: Any) -> Any:
        return run_trainer(tiny_gpt(dropout=0.1), [_algorithm(start=0.25)], steps=8, fit=False,
                           save_folder=str(tmp_path), run_name="sb", save_interval="1ba",
                           **kwargs)

    straight = trainer()
    straight.fit()
    batches = Batches()
    resumed = trainer(load_path=str(next(tmp_path.glob(f"*-ba{at}-*.pt"))),
                      save_overwrite=True, callbacks=[batches])
    resumed.fit()
    assert batches.sizes == [8, 4, 8, 4, 8][-(8 - at):]  # batches 4-8: selection goes on
    assert int(resumed.state.timestamp.sample) == int(straight.state.timestamp.sample)
    for (name, a), b in zip(straight.state.model.named_parameters(),
                            resumed.state.model.parameters()):
        assert torch.equal(a, b), name


def test_a_composer_classifier_is_scored_with_its_own_loss() -> None:
    """``ComposerClassifier.module`` is its network, not a DDP wrapper: the scoring loss is
    the classifier's ``loss(outputs, batch, reduction='none')`` (Composer's contract)."""
    from tests.algorithms.vision_helpers import run_vision_trainer, tiny_classifier

    class Sizes(Callback):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def before_forward(self, state: State, logger: Any) -> None:
            self.sizes.append(int(state.batch[0].shape[0]))

    sizes = Sizes()
    run_vision_trainer(tiny_classifier(), [SelectiveBackprop(start=0.0, end=1.0, keep=0.5,
                                                             interrupt=0)],
                       steps=3, callbacks=[sizes])
    assert sizes.sizes == [4, 4, 4]  # batches of 8, half kept


def test_select_using_loss_refuses_a_loss_without_reduction() -> None:
    x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)
    with pytest.raises(TypeError, match="must take a keyword argument `reduction`"):
        select_using_loss(x, y, lambda v: v, lambda o, t: o.sum(1))
