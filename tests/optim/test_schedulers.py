"""Composer's schedulers, checked against the formulas in Composer's documentation
(``composer/optim/scheduler.py``) at several times, with and without ``ssr``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import State, Timestamp
from cadence.optim import (
    ConstantScheduler, ConstantWithWarmupScheduler, CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler, CosineAnnealingWithWarmupScheduler, ExponentialScheduler,
    LinearScheduler, LinearWithWarmupScheduler, MultiStepScheduler, MultiStepWithWarmupScheduler,
    PolynomialScheduler, PolynomialWithWarmupScheduler, StepScheduler, compile_composer_scheduler,
)
from cadence.registry import registry


def state_at(batch: int, max_duration: str = "100ba", dataloader_len: int = 10) -> State:
    """A State whose timestamp is at ``batch`` (epochs follow from ``dataloader_len``)."""
    state = State(model=torch.nn.Linear(1, 1), max_duration=max_duration,
                  dataloader_len=dataloader_len)
    state.timestamp = Timestamp(batch=batch, epoch=batch // dataloader_len,
                                batch_in_epoch=batch % dataloader_len, sample=4 * batch,
                                token=64 * batch)
    return state


def cos_anneal(x: float, alpha_f: float = 0.0) -> float:
    x = min(max(x, 0.0), 1.0)
    return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * x))


CASES: list[tuple[str, Any, Any]] = [
    ("step", StepScheduler("10ba", gamma=0.5), lambda t: 0.5 ** (t // 10)),
    ("multistep", MultiStepScheduler(["10ba", "30ba"], gamma=0.1),
     lambda t: 0.1 ** sum(t >= m for m in (10, 30))),
    ("constant", ConstantScheduler(alpha=0.3, t_max="40ba"), lambda t: 0.3 if t < 40 else 1.0),
    ("linear", LinearScheduler(alpha_i=1.0, alpha_f=0.2, t_max="50ba"),
     lambda t: 1.0 + (0.2 - 1.0) * min(t / 50, 1.0)),
    ("exponential", ExponentialScheduler(gamma=0.9, decay_period="1ep"),  # 1ep = 10ba
     lambda t: 0.9 ** (t / 10)),
    ("cosine", CosineAnnealingScheduler(t_max="1dur", alpha_f=0.1),
     lambda t: cos_anneal(t / 100, 0.1)),
    ("cosine_restarts", CosineAnnealingWarmRestartsScheduler(t_0="20ba", t_mult=2.0),
     # intervals [0, 20), [20, 60), [60, 140)
     lambda t: cos_anneal(t / 20 if t < 20 else (t - 20) / 40 if t < 60 else (t - 60) / 80)),
    ("polynomial", PolynomialScheduler(power=2.0, t_max="1dur", alpha_f=0.1),
     lambda t: 0.1 + 0.9 * (1 - t / 100) ** 2),
    ("multistep_warmup", MultiStepWithWarmupScheduler("10ba", ["30ba", "60ba"], gamma=0.5),
     lambda t: t / 10 if t < 10 else 0.5 ** sum(t >= m for m in (30, 60))),
    # t_max may not end before max_duration (100ba) in a warmup schedule (Composer's check)
    ("constant_warmup", ConstantWithWarmupScheduler("10ba", alpha=0.5, t_max="100ba"),
     lambda t: 0.5 * t / 10 if t < 10 else (0.5 if t < 100 else 1.0)),
    ("linear_warmup", LinearWithWarmupScheduler("10ba", alpha_i=1.0, alpha_f=0.0),
     lambda t: t / 10 if t < 10 else 1.0 - min((t - 10) / 90, 1.0)),
    ("cosine_warmup", CosineAnnealingWithWarmupScheduler("0.1dur", alpha_f=0.05),
     lambda t: t / 10 if t < 10 else cos_anneal((t - 10) / 90, 0.05)),
    ("polynomial_warmup", PolynomialWithWarmupScheduler("10ba", power=3.0),
     lambda t: t / 10 if t < 10 else (1 - min((t - 10) / 90, 1.0)) ** 3),
]


@pytest.mark.parametrize(("name", "scheduler", "formula"), CASES, ids=[c[0] for c in CASES])
def test_matches_composers_formula(name: str, scheduler: Any, formula: Any) -> None:
    for t in (0, 3, 9, 10, 11, 25, 30, 45, 59, 60, 77, 99, 100):
        got = scheduler(state_at(t))
        assert got == pytest.approx(formula(t), abs=1e-12), f"{name} at batch {t}"


def test_scale_schedule_ratio_stretches_the_schedule_but_not_the_warmup() -> None:
    step = StepScheduler("10ba", gamma=0.5)
    assert step(state_at(15), ssr=2.0) == 1.0 and step(state_at(20), ssr=2.0) == 0.5
    cosine = CosineAnnealingScheduler(t_max="50ba")
    assert cosine(state_at(50), ssr=2.0) == pytest.approx(cos_anneal(0.5))
    warm = LinearWithWarmupScheduler("10ba", t_max="50ba")
    assert warm(state_at(5), ssr=2.0) == pytest.approx(0.5)  # warmup not stretched
    assert warm(state_at(55), ssr=2.0) == pytest.approx(1 - 45 / 90)
    scaled = LinearWithWarmupScheduler("10ba", t_max="50ba", scale_warmup=True)
    assert scaled(state_at(5), ssr=2.0) == pytest.approx(0.25)  # 5 / (10 * 2)
    epochs = StepScheduler("1ep", gamma=0.5)  # epochs become batches before scaling
    assert epochs(state_at(9), ssr=0.5) == 0.5 ** 1


def test_durations_follow_max_duration_units() -> None:
    sched = CosineAnnealingScheduler(t_max="0.5dur")
    # max_duration in epochs: 'dur' is counted in batches through the dataloader length
    state = state_at(25, max_duration="10ep", dataloader_len=10)
    assert sched(state) == pytest.approx(cos_anneal(25 / 50))
    tokens = LinearScheduler(t_max="1000tok")
    assert tokens(state_at(5)) == pytest.approx(1 - 320 / 1000)
    with pytest.raises(ValueError, match="max_duration"):
        CosineAnnealingScheduler()(State(model=torch.nn.Linear(1, 1)))
    with pytest.raises(ValueError, match="no length"):
        StepScheduler("1ep")(State(model=torch.nn.Linear(1, 1), max_duration="10ba"))
    with pytest.raises(ValueError, match="Cannot use warmup scheduler with t_max 1000tok"):
        LinearWithWarmupScheduler("10ba")(state_at(5, max_duration="1000tok"))


def test_warmup_units_follow_composers_rule_between_t_warmup_and_t_max() -> None:
    """Composer checks ``t_warmup`` against ``t_max`` (after conversion) only: a schedule
    without ``t_max`` takes a warmup in any unit, whatever ``max_duration``'s unit is."""
    samples = State(model=torch.nn.Linear(1, 1), max_duration="48sp", dataloader_len=12)
    samples.timestamp = Timestamp(batch=1, sample=4)
    multistep = MultiStepWithWarmupScheduler(milestones=["4ba"], t_warmup="2ba")
    assert multistep(samples) == pytest.approx(0.5)  # batch 1 of a 2-batch warmup
    samples.timestamp = Timestamp(batch=5, sample=20)
    assert multistep(samples) == pytest.approx(0.1)  # past the milestone
    # t_max in samples ('1dur' of 48sp), warmup in batches: Composer refuses this pair
    with pytest.raises(ValueError, match="Cannot use warmup scheduler with t_max 48sp"):
        LinearWithWarmupScheduler(t_warmup="2ba")(samples)
    # both in samples: fine, whatever the unit of max_duration
    assert LinearWithWarmupScheduler(t_warmup="8sp")(samples) == pytest.approx(
        1.0 - (20 - 8) / 40)


def test_zero_warmup_warns_as_composer() -> None:
    with pytest.warns(UserWarning, match="warmup duration is 0"):
        assert CosineAnnealingWithWarmupScheduler("0ba")(state_at(0)) == pytest.approx(1.0)


def test_compiled_to_a_lambda_lr_that_reads_the_state() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    state = state_at(0, max_duration="8ba")  # t_max may not end before max_duration
    state.optimizers = [optimizer]
    lr = compile_composer_scheduler(LinearWithWarmupScheduler("4ba", t_max="8ba"), state)
    assert isinstance(lr, torch.optim.lr_scheduler.LambdaLR)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(8):
        optimizer.step()  # (no gradients: a no-op, in the order torch expects)
        state.timestamp = state.timestamp.to_next_batch(samples=4)
        lr.step()
        seen.append(optimizer.param_groups[0]["lr"])
    expected = [0.0, 0.05, 0.1, 0.15, 0.2, 0.15, 0.1, 0.05, 0.0]
    assert seen == pytest.approx(expected)
    plain = compile_composer_scheduler(lambda s: 0.5, state)  # a one-argument function
    assert plain.get_last_lr() == [0.1]
    with pytest.raises(ValueError, match="scale_schedule_ratio"):
        compile_composer_scheduler(lambda s: 0.5, state, ssr=2.0)


def test_composer_import_path_and_yaml_names() -> None:
    import cadence

    assert cadence.optim.CosineAnnealingWithWarmupScheduler is CosineAnnealingWithWarmupScheduler
    assert CosineAnnealingWithWarmupScheduler.__module__ == "cadence.optim.scheduler"
    expected = {
        "step": StepScheduler, "multistep": MultiStepScheduler, "constant": ConstantScheduler,
        "linear_decay": LinearScheduler, "exponential": ExponentialScheduler,
        "cosine_decay": CosineAnnealingScheduler,
        "cosine_warmrestart": CosineAnnealingWarmRestartsScheduler,
        "polynomial": PolynomialScheduler, "multistep_with_warmup": MultiStepWithWarmupScheduler,
        "constant_with_warmup": ConstantWithWarmupScheduler,
        "linear_decay_with_warmup": LinearWithWarmupScheduler,
        "cosine_decay_with_warmup": CosineAnnealingWithWarmupScheduler,
        "polynomial_decay_with_warmup": PolynomialWithWarmupScheduler,
    }
    for name, cls in expected.items():
        assert registry.schedulers.get(name) is cls
        assert registry.schedulers.get(cls.__name__) is cls


def test_a_run_file_names_a_scheduler(tmp_path: Path) -> None:
    from cadence.config.load import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "yamls" / "quickstart.yaml", [
        "scheduler={name: polynomial_decay_with_warmup, t_warmup: 5ba, power: 3.0, alpha_f: 0.1}",
    ])
    assert cfg.scheduler == {"name": "polynomial_decay_with_warmup", "t_warmup": "5ba",
                             "power": 3.0, "alpha_f": 0.1}
    with pytest.raises(Exception, match="t_warmpu"):
        load_config(root / "yamls" / "quickstart.yaml",
                    ["scheduler={name: polynomial_decay_with_warmup, t_warmpu: 5ba}"])


def test_a_trainer_run_follows_the_schedule() -> None:
    from cadence import Callback, Trainer
    from tests.common.models import SimpleModel, make_dataloader

    model = SimpleModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    lrs: dict[int, float] = {}

    class RecordLR(Callback):
        def batch_end(self, state: State, logger: Any) -> None:
            lrs[int(state.timestamp.batch)] = state.optimizers[0].param_groups[0]["lr"]

    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=3),
                      max_duration="2ep", optimizers=optimizer, callbacks=RecordLR(),
                      schedulers=CosineAnnealingWithWarmupScheduler("2ba", alpha_f=0.0),
                      progress_bar=False, device="cpu", seed=0)
    assert optimizer.param_groups[0]["lr"] == 0.0  # warmup starts at 0
    trainer.fit()
    trainer.close()
    # 2ep x 3 batches = 6 steps; the lr after step k is the schedule at batch k
    expected = {1: 0.5, 2: 1.0, 3: cos_anneal(1 / 4), 4: cos_anneal(2 / 4),
                5: cos_anneal(3 / 4), 6: 0.0}
    assert lrs == pytest.approx(expected)


def test_the_trainers_compile_scheduler_is_composers_on_a_given_optimizer() -> None:
    from cadence.optim.optimizers import compile_scheduler

    first = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.2)
    second = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.2)
    state = state_at(0, max_duration="8ba")
    state.optimizers = [first, second]  # compile_composer_scheduler alone would refuse two
    with pytest.raises(NotImplementedError, match="exactly one optimizer"):
        compile_composer_scheduler(lambda s: 0.5, state)
    schedule = LinearWithWarmupScheduler("4ba", t_max="8ba")
    lr = compile_scheduler(schedule, second, state)
    direct = compile_composer_scheduler(schedule, state, optimizer=first)
    assert type(lr) is type(direct) is torch.optim.lr_scheduler.LambdaLR
    for _ in range(3):
        for optimizer, scheduler in ((first, direct), (second, lr)):
            optimizer.step()
            scheduler.step()
        state.timestamp = state.timestamp.to_next_batch(samples=4)
    assert lr.get_last_lr() == direct.get_last_lr() == [pytest.approx(0.1)]
    with pytest.raises(ValueError, match="scale_schedule_ratio"):
        compile_scheduler(lambda s: 0.5, first, state, ssr=2.0)
    torch_scheduler = torch.optim.lr_scheduler.StepLR(first, step_size=1)
    assert compile_scheduler(torch_scheduler, first, state) is torch_scheduler
    with pytest.raises(TypeError, match="ComposerSchedulers"):
        compile_scheduler(3, first, state)
