"""SWA: the model takes the mean of the weights from swa_start to swa_end; BatchNorm
statistics are recomputed for the averaged weights; the learning rate anneals to swa_lr;
a run killed mid-average resumes bit for bit; bad arguments are refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cadence import Callback, ComposerModel, State, Trainer
from cadence.algorithms import SWA
from tests.common.models import SimpleModel, make_dataloader


class _Weights(Callback):
    """The parameters (and a BatchNorm's running mean, if any) at every BATCH_END, and the
    parameters at every EPOCH_END."""

    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []
        self.epochs: list[list[torch.Tensor]] = []
        self.running_mean: list[torch.Tensor] = []
        self.lrs: list[float] = []

    def epoch_end(self, state: State, logger: Any) -> None:
        self.epochs.append([p.detach().clone() for p in state.model.parameters()])

    def batch_end(self, state: State, logger: Any) -> None:
        self.steps.append([p.detach().clone() for p in state.model.parameters()])
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])
        bn = getattr(state.model, "bn", None)
        if bn is not None:
            self.running_mean.append(bn.running_mean.clone())


def _fit(model: torch.nn.Module, algorithms: list[Any], batches: int = 8,
         **kwargs: Any) -> tuple[Trainer, _Weights]:
    weights = _Weights()
    kwargs.setdefault("max_duration", f"{batches}ba")
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=batches),
                      algorithms=algorithms,
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
                      callbacks=[weights, *kwargs.pop("callbacks", [])], progress_bar=False,
                      seed=0, device="cpu", **kwargs)
    trainer.fit()
    return trainer, weights


def test_model_takes_the_mean_of_the_weights_at_swa_end() -> None:
    torch.manual_seed(0)
    start = SimpleModel()
    _, plain = _fit(copy.deepcopy(start), [])
    swa = SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="1ba")
    _, averaged = _fit(copy.deepcopy(start), [swa])
    # batches 2..6 end at elapsed 0.25..0.75: five updates, then the mean replaces the model
    expected = [torch.stack(ws).mean(0) for ws in zip(*plain.steps[1:6])]
    for got, want in zip(averaged.steps[5], expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for got, want in zip(averaged.steps[4], plain.steps[4]):  # untouched before swa_end
        assert torch.equal(got, want)
    assert int(swa.swa_model.n_averaged) == 5 and swa.swa_completed
    assert not torch.equal(averaged.steps[7][0], averaged.steps[5][0])  # training goes on


def test_update_interval_in_batches_skips_between_updates() -> None:
    torch.manual_seed(0)
    start = SimpleModel()
    _, plain = _fit(copy.deepcopy(start), [])
    swa = SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="2ba")
    _, averaged = _fit(copy.deepcopy(start), [swa])
    expected = [torch.stack(ws).mean(0) for ws in zip(plain.steps[1], plain.steps[3],
                                                      plain.steps[5])]
    for got, want in zip(averaged.steps[5], expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_epoch_units_average_at_epoch_ends() -> None:
    torch.manual_seed(0)
    start = SimpleModel()
    kwargs = {"max_duration": "3ep"}
    _, plain = _fit(copy.deepcopy(start), [], batches=2, **kwargs)
    swa = SWA(swa_start="1ep", swa_end="2ep", update_interval="1ep")
    _, averaged = _fit(copy.deepcopy(start), [swa], batches=2, **kwargs)
    # epochs 1 and 2 end after batches 2 and 4 (BATCH_END of the epoch's last batch first)
    expected = [torch.stack(ws).mean(0) for ws in zip(plain.steps[1], plain.steps[3])]
    assert int(swa.swa_model.n_averaged) == 2 and swa.swa_completed
    for got, want in zip(averaged.epochs[1], expected):  # EPOCH_END 2: the mean
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for got, want in zip(averaged.epochs[0], plain.epochs[0]):  # EPOCH_END 1: untouched
        assert torch.equal(got, want)


class _BNModel(ComposerModel):
    """``x [batch, 8] -> Linear -> BatchNorm1d(16) -> ReLU -> Linear -> logits [batch, 3]``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.fc2 = (torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                       torch.nn.Linear(16, 3))

    def forward(self, batch: Any) -> torch.Tensor:
        return self.fc2(F.relu(self.bn(self.fc1(batch[0]))))

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


def test_batchnorm_statistics_are_recomputed_for_the_averaged_weights() -> None:
    torch.manual_seed(0)
    model = _BNModel()
    rng_before = torch.get_rng_state()
    swa = SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="1ba")
    _, weights = _fit(model, [swa])
    fc1_weight, fc1_bias = weights.steps[5][0], weights.steps[5][1]  # averaged, at swa_end
    x = torch.cat([x for x, _ in make_dataloader(num_batches=8)])
    expected = (x @ fc1_weight.T + fc1_bias).mean(0)  # cumulative mean over equal batches
    torch.testing.assert_close(weights.running_mean[5], expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(weights.running_mean[4], expected, atol=1e-3)
    assert not torch.equal(rng_before, torch.get_rng_state())  # (training itself drew)


def test_schedule_swa_lr_anneals_to_swa_lr() -> None:
    swa = SWA(swa_start="0.25dur", swa_end="0.97dur", update_interval="1ba",
              schedule_swa_lr=True, anneal_steps=2, swa_lr=0.1)
    _, weights = _fit(SimpleModel(), [swa])
    assert weights.lrs[0] == 0.5
    assert weights.lrs[1] == pytest.approx(0.3)  # halfway (linear) after the first update
    assert weights.lrs[2:] == pytest.approx([0.1] * 6)


def test_killed_mid_average_resumes_bit_for_bit(tmp_path: Path) -> None:
    def run(**kwargs: Any) -> tuple[Trainer, _Weights]:
        swa = SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="1ba",
                  schedule_swa_lr=True, anneal_steps=4, swa_lr=0.05)
        torch.manual_seed(0)
        return _fit(_BNModel(), [swa], save_folder=str(tmp_path), run_name="swa",
                    save_interval="2ba", **kwargs)

    straight, _ = run()
    (checkpoint,) = tmp_path.glob("ep0-ba4*.pt")  # the name may carry the rank
    saved = torch.load(checkpoint, weights_only=False)
    saved = saved.get("state", saved)["algorithms"]  # Composer's layout: state/algorithms,
    saved = dict(saved)["SWA"]  # a list of (class name, state) pairs
    assert saved["swa_started"] and not saved["swa_completed"] and saved["step_counter"] == 3
    assert int(saved["swa_model"]["n_averaged"]) == 3
    resumed, _ = run(load_path=str(checkpoint), save_overwrite=True)
    a, b = straight.state.model.state_dict(), resumed.state.model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    sa, sb = straight.state.algorithms[0], resumed.state.algorithms[0]
    assert sa.state_dict()["step_counter"] == sb.state_dict()["step_counter"] == 5
    assert sa.swa_scheduler.state_dict()["_step_count"] == \
        sb.swa_scheduler.state_dict()["_step_count"]


@pytest.mark.parametrize("kwargs, match", [
    ({"swa_start": "0.8dur", "swa_end": "0.5dur"}, "later than"),
    ({"swa_start": "2ep", "swa_end": "0.9dur"}, "same unit"),
    ({"swa_start": "10ba", "swa_end": "20ba"}, "swa_start='10ba'"),
    ({"update_interval": "0.1dur"}, "update_interval"),
    ({"anneal_strategy": "step"}, "anneal_strategy"),
    ({"anneal_steps": 0}, "anneal_steps"),
    ({"swa_end": "1.5dur"}, r"\[0, 1\]"),
])
def test_bad_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SWA(**kwargs)
