"""SeqLengthWarmup: batches are truncated (or reshaped) to the scheduled length, the
timestamp counts the tokens trained on, training still learns, resume is exact, and it runs
on 2 FSDP2 ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, State
from cadence.algorithms import SeqLengthWarmup, set_batch_sequence_length
from tests.algorithms.algorithm_helpers import full, run_trainer, tiny_gpt


class Shapes(Callback):
    """Each step's input_ids shape (as trained), the loss, and the timestamp's tokens."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self.losses: list[float] = []
        self.tokens: list[int] = []

    def before_forward(self, state: State, logger: Any) -> None:
        self.shapes.append(tuple(state.batch["input_ids"].shape))

    def batch_end(self, state: State, logger: Any) -> None:
        self.losses.append(float(state.total_loss))
        self.tokens.append(int(state.timestamp.token))


def _batch(rows: int = 2, seq: int = 6) -> dict[str, torch.Tensor]:
    ids = torch.arange(rows * seq).view(rows, seq) + 10
    return {"input_ids": ids.clone(), "labels": ids.clone(),
            "attention_mask": torch.ones(rows, seq, dtype=torch.long)}


def test_truncate_keeps_the_first_positions_of_every_tensor() -> None:
    batch = set_batch_sequence_length(_batch(), 3)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (2, 3), "labels": (2, 3), "attention_mask": (2, 3)}
    assert batch["input_ids"].tolist() == [[10, 11, 12], [16, 17, 18]]
    same = _batch()
    assert set_batch_sequence_length(same, 6)["input_ids"].shape == (2, 6)  # not shorter: as is


def test_preserve_end_of_sequence_keeps_each_rows_last_real_token() -> None:
    batch = _batch()
    batch["attention_mask"][1, 4:] = 0  # row 1 ends at position 3 (token 19)
    out = set_batch_sequence_length(batch, 3, preserve_end_of_sequence=True)
    assert out["input_ids"].tolist() == [[10, 11, 15], [16, 17, 19]]
    with pytest.raises(ValueError, match="attention_mask"):
        set_batch_sequence_length({"input_ids": torch.zeros(2, 6)}, 3,
                                  preserve_end_of_sequence=True)


def test_reshape_makes_more_shorter_rows_and_drops_only_the_tail() -> None:
    batch = set_batch_sequence_length(_batch(), 5, truncate=False)
    assert batch["input_ids"].shape == (2, 5)  # 12 tokens -> 2 rows of 5, 2 dropped
    assert batch["input_ids"].flatten().tolist() == list(range(10, 20))
    assert set_batch_sequence_length(_batch(), 4, truncate=False)["labels"].shape == (3, 4)
    padded = _batch()
    padded["attention_mask"][0, -1] = 0
    with pytest.raises(ValueError, match="padded"):
        set_batch_sequence_length(padded, 4, truncate=False)
    with pytest.raises(ValueError, match="'extra'"):
        set_batch_sequence_length({**_batch(), "extra": torch.zeros(2)}, 4, truncate=False)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="dict batch"):
        set_batch_sequence_length((torch.zeros(2, 6),), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duration"):
        SeqLengthWarmup(duration=1.5)
    with pytest.raises(ValueError, match="max_seq_length=4"):
        SeqLengthWarmup(min_seq_length=8, max_seq_length=4)


def _warmup() -> SeqLengthWarmup:
    # 8 steps: warm-up over 4 batches, 3 increments -> 4, 8, 12, then 16
    return SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=16, step_size=4)


def test_trainer_truncates_on_schedule_and_counts_real_tokens() -> None:
    shapes = Shapes()
    run_trainer(tiny_gpt(), [_warmup()], steps=8, callbacks=[shapes])
    lengths = [s[1] for s in shapes.shapes]
    assert lengths == [4, 8, 12, 16, 16, 16, 16, 16]
    assert all(s[0] == 8 for s in shapes.shapes)
    assert shapes.tokens == list(torch.tensor(lengths).mul(8).cumsum(0).tolist())
    assert shapes.losses[-1] < shapes.losses[3] - 0.25  # full-length steps still learn


def test_trainer_reshape_mode_grows_the_batch() -> None:
    shapes = Shapes()
    warmup = SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=16, step_size=4,
                             truncate=False)
    run_trainer(tiny_gpt(), [warmup], steps=5, callbacks=[shapes])  # warm-up: 2 batches
    assert shapes.shapes == [(32, 4), (16, 8), (8, 16), (8, 16), (8, 16)]
    warmup.step_size = 3  # 4, 7, 10, 13, 16: 128 tokens cut in rows of 7 drop 2
    shapes = Shapes()
    run_trainer(tiny_gpt(), [warmup], steps=8, callbacks=[shapes])  # a length per batch
    assert shapes.shapes[:2] == [(32, 4), (18, 7)] and shapes.tokens[:2] == [128, 254]


def test_tiny_warmup_steps_several_lengths_per_batch() -> None:
    shapes = Shapes()  # 1 warm-up batch, 3 increments: Composer would divide by zero
    run_trainer(tiny_gpt(), [SeqLengthWarmup(0.25, 4, 16, 4)], steps=4, callbacks=[shapes])
    assert [s[1] for s in shapes.shapes] == [4, 16, 16, 16]


def test_resume_mid_warmup_is_exact(tmp_path: Path) -> None:
    def trainer(**kwargs: Any) -> Any:
        return run_trainer(tiny_gpt(dropout=0.1), [_warmup()], steps=6, fit=False,
                           save_folder=str(tmp_path), run_name="slw", save_interval="2ba",
                           **kwargs)

    straight, shapes = trainer(), Shapes()
    straight.fit()
    resumed = trainer(load_path=str(next(tmp_path.glob("ep0-ba2*.pt"))), save_overwrite=True,
                      callbacks=[shapes])
    resumed.fit()
    assert [s[1] for s in shapes.shapes] == [12, 16, 16, 16]
    assert int(resumed.state.timestamp.token) == int(straight.state.timestamp.token)
    for (name, a), b in zip(straight.state.model.named_parameters(),
                            resumed.state.model.parameters()):
        assert torch.equal(a, b), name


@pytest.fixture(scope="module")
def single_process_weights() -> dict[str, torch.Tensor]:
    trainer = run_trainer(tiny_gpt(), [_warmup()], steps=8)
    return {n: p.detach().clone() for n, p in trainer.state.model.named_parameters()}


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_fsdp_two_ranks(single_process_weights: dict[str, torch.Tensor]) -> None:
    shapes = Shapes()
    trainer = run_trainer(tiny_gpt(), [_warmup()], steps=8, callbacks=[shapes],
                          parallelism_config={"fsdp": {}})
    assert shapes.shapes == [(4, 4), (4, 8), (4, 12)] + [(4, 16)] * 5, shapes.shapes
    assert shapes.tokens[-1] == 8 * (4 + 8 + 12 + 16 * 5)  # both ranks' tokens
    for name, param in trainer.state.model.named_parameters():
        # 8 AdamW steps amplify reduction-order differences of near-zero gradients
        torch.testing.assert_close(full(param), single_process_weights[name], rtol=1e-3,
                                   atol=5e-4)
