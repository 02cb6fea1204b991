"""EMA: the weights follow ema <- s * ema + (1 - s) * w; half_life / update_interval /
ema_start; evaluation runs with the EMA weights and training resumes with its own; the EMA
is in checkpoints (full and sharded, 1 and 2 FSDP ranks); resume is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, State, Trainer
from cadence.algorithms import EMA, smoothing_from_half_life
from cadence.checkpoint import save_checkpoint
from cadence.core import Time
from cadence.parallel import unwrap_model
from tests.algorithms.algorithm_helpers import full, run_trainer, tiny_gpt, token_loader


class Weights(Callback):
    """The (full) weights at FIT_START and after every batch, and what eval ran with."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.in_eval: list[dict[str, torch.Tensor]] = []

    @staticmethod
    def _grab(state: State) -> dict[str, torch.Tensor]:
        return {n: full(p).clone() for n, p in unwrap_model(state.model).named_parameters()}

    def fit_start(self, state: State, logger: Any) -> None:
        self.steps.append(self._grab(state))

    def batch_end(self, state: State, logger: Any) -> None:
        self.steps.append(self._grab(state))

    def eval_start(self, state: State, logger: Any) -> None:
        self.in_eval.append(self._grab(state))


def _expected_ema(steps: list[dict[str, torch.Tensor]], smoothing: float, start: int = 0,
                  every: int = 1) -> dict[str, torch.Tensor]:
    ema = {n: w.clone() for n, w in steps[start].items()}
    for index in range(start + 1, len(steps)):
        if index % every == 0:
            for n in ema:
                ema[n] = smoothing * ema[n] + (1 - smoothing) * steps[index][n]
    return ema


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **kw: Any) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(full(a[name]), full(b[name]),
                                   msg=lambda m, name=name: f"{name}: {m}", **kw)


def test_smoothing_from_half_life_and_arguments() -> None:
    assert EMA().smoothing == pytest.approx(2 ** (-1 / 1000))
    assert EMA(half_life="10ba", update_interval="2ba").smoothing == pytest.approx(2 ** -0.2)
    assert EMA(smoothing=0.9).smoothing == 0.9
    assert smoothing_from_half_life(Time.from_input("4ep"), Time.from_input("1ep")) == \
        pytest.approx(2 ** -0.25)
    with pytest.raises(ValueError, match="not both"):
        EMA(half_life="10ba", smoothing=0.9)
    with pytest.raises(ValueError, match="same unit"):
        EMA(half_life="10ba", update_interval="1ep")
    with pytest.raises(ValueError, match="smoothing"):
        EMA(smoothing=1.0)
    with pytest.raises(ValueError, match="ba, ep"):
        EMA(half_life="0.5dur")


def test_compute_ema_takes_a_module_as_composer() -> None:
    import inspect

    from cadence.algorithms import compute_ema

    params = inspect.signature(compute_ema).parameters
    assert list(params) == ["model", "ema_model", "smoothing"]
    assert params["smoothing"].default == 0.99
    model, ema_model = torch.nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    with torch.no_grad():
        model.weight.fill_(3.0)
        model.running_mean.fill_(1.0)
        ema_model.weight.fill_(1.0)
        ema_model.running_mean.fill_(0.0)
    compute_ema(model, ema_model, smoothing=0.75)
    assert ema_model.weight.tolist() == [1.5, 1.5]  # 0.75 * 1 + 0.25 * 3
    assert ema_model.running_mean.tolist() == [0.25, 0.25]  # buffers too
    assert int(ema_model.num_batches_tracked) == 0  # integer buffers are not averaged
    assert model.weight.tolist() == [3.0, 3.0]  # the model is untouched
    shadow = {"weight": torch.zeros(2)}
    compute_ema(model, shadow)  # the dict form, default smoothing 0.99
    assert shadow["weight"].tolist() == pytest.approx([0.03, 0.03])
    with pytest.raises(ValueError, match="smoothing"):
        compute_ema(model, ema_model, smoothing=1.5)


@pytest.mark.parametrize("kwargs, start, every", [
    ({"smoothing": 0.5}, 0, 1),
    ({"smoothing": 0.7, "update_interval": "2ba"}, 0, 2),
    ({"half_life": "2ba", "ema_start": "2ba"}, 2, 1),
])
def test_ema_follows_the_formula(kwargs: dict[str, Any], start: int, every: int) -> None:
    algorithm, weights = EMA(**kwargs), Weights()
    trainer = run_trainer(tiny_gpt(), [algorithm], steps=5, callbacks=[weights])
    expected = _expected_ema(weights.steps, algorithm.smoothing, start, every)
    params = dict(trainer.state.model.named_parameters())
    _assert_close({n: algorithm.ema_weights[n] for n in params}, expected, rtol=1e-6, atol=1e-7)
    # FIT_END: the model now holds the EMA weights (as in Composer)
    assert algorithm.ema_weights_active
    _assert_close({n: p.detach() for n, p in params.items()}, expected, rtol=1e-6, atol=1e-7)


def test_eval_uses_ema_weights_and_training_continues_with_its_own() -> None:
    algorithm, weights = EMA(smoothing=0.5), Weights()
    run_trainer(tiny_gpt(), [algorithm], steps=4, callbacks=[weights],
                eval_dataloader=token_loader(), eval_interval="2ba")
    assert len(weights.in_eval) == 2  # after batches 2 and 4
    _assert_close(weights.in_eval[0], _expected_ema(weights.steps[:3], 0.5))
    # training went on from the training weights: the same run without eval
    plain = Weights()
    run_trainer(tiny_gpt(), [EMA(smoothing=0.5)], steps=4, callbacks=[plain])
    _assert_close(weights.steps[-1], plain.steps[-1], rtol=0, atol=0)


def test_trainer_eval_after_fit_keeps_ema_weights() -> None:
    algorithm = EMA(smoothing=0.5)
    trainer = run_trainer(tiny_gpt(), [algorithm], steps=2)
    before = {n: p.detach().clone() for n, p in trainer.state.model.named_parameters()}
    trainer.eval(token_loader())
    assert algorithm.ema_weights_active
    after = {n: p.detach() for n, p in trainer.state.model.named_parameters()}
    _assert_close(before, after, rtol=0, atol=0)


def test_state_dict_round_trip_and_exact_resume(tmp_path: Path) -> None:
    def trainer(**kwargs: Any) -> Trainer:
        return run_trainer(tiny_gpt(dropout=0.1), [EMA(smoothing=0.8)], steps=4, fit=False,
                           save_folder=str(tmp_path), run_name="ema", save_interval="2ba",
                           **kwargs)

    straight = trainer()
    straight.fit()
    resumed = trainer(load_path=str(tmp_path / "ep0-ba2-rank0.pt"), save_overwrite=True)
    saved = dict(torch.load(tmp_path / "ep0-ba2-rank0.pt",
                            weights_only=True)["state"]["algorithms"])["EMA"]
    assert saved["ema_started"] and not saved["ema_weights_active"]
    _assert_close(resumed.state.algorithms[0].shadow, saved["shadow"], rtol=0, atol=0)
    resumed.fit()
    a, b = straight.state.algorithms[0], resumed.state.algorithms[0]
    _assert_close(a.shadow, b.shadow, rtol=0, atol=0)  # training weights (EMA swapped in)
    _assert_close(a.ema_weights, b.ema_weights, rtol=0, atol=0)
    # a second fit() swaps the training weights back in first
    before = {n: t.clone() for n, t in a.shadow.items()}
    straight.state.max_duration = Time.from_input("5ba")
    straight.fit()
    assert straight.state.timestamp.batch == 5 and a.ema_weights_active
    wte = "model.transformer.wte.weight"
    assert not torch.equal(before[wte], a.shadow[wte])


@pytest.fixture(scope="module")
def single_process_ema() -> dict[str, torch.Tensor]:
    algorithm = EMA(smoothing=0.6)
    run_trainer(tiny_gpt(), [algorithm], steps=3)
    return {n: t.clone() for n, t in algorithm.ema_weights.items()}


@pytest.mark.world_size(2)
def test_fsdp_ema_is_sharded_like_the_params(single_process_ema: dict[str, torch.Tensor],
                                              tmp_path: Path) -> None:
    from torch.distributed.tensor import DTensor

    algorithm, weights = EMA(smoothing=0.6), Weights()
    trainer = run_trainer(tiny_gpt(), [algorithm], steps=3, callbacks=[weights],
                          parallelism_config={"fsdp": {}}, eval_dataloader=token_loader(),
                          eval_interval="1ba")  # swaps around every step: training unaffected
    params = dict(trainer.state.model.named_parameters())
    for name, tensor in algorithm.shadow.items():
        if name in params:
            assert isinstance(tensor, DTensor) and tensor.placements == params[name].placements
    # AdamW amplifies the reduction-order differences of near-zero gradients (biases): ~1e-5
    _assert_close({n: algorithm.ema_weights[n] for n in single_process_ema}, single_process_ema,
                  rtol=1e-3, atol=1e-4)
    assert len(weights.in_eval) == 3
    _assert_close(weights.in_eval[-1], single_process_ema, rtol=1e-3, atol=1e-4)
    sharded = save_checkpoint(trainer.state, tmp_path / "sharded", "sharded")
    full_path = save_checkpoint(trainer.state, tmp_path / "full.pt", "full")
    for path in (sharded, full_path):
        again = EMA(smoothing=0.6)
        run_trainer(tiny_gpt(), [again], fit=False, parallelism_config={"fsdp": {}},
                    load_path=str(path))
        assert again.ema_weights_active
        for name, tensor in again.shadow.items():
            assert isinstance(tensor, DTensor) == isinstance(algorithm.shadow[name], DTensor)
            assert torch.equal(full(tensor), full(algorithm.shadow[name])), (path, name)
