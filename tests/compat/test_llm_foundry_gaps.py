"""Composer behaviours llm-foundry 0.22.0 relies on that its end-to-end run
(``tests/compat/llm_foundry.py``) found missing in cadence, one test each."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from cadence.utils import dist


def test_local_rank_zero_download_and_wait_is_a_context_manager_rank_zero_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # llm-foundry's ICL datasets: ``with dist.local_rank_zero_download_and_wait(dest): if
    # local rank 0: get_file(uri, dest)``; local rank 0 enters at once and makes the file
    monkeypatch.setenv("LOCAL_RANK", "0")
    target = tmp_path / "task.jsonl"
    with dist.local_rank_zero_download_and_wait(str(target)):
        assert not target.exists()
        target.write_text("{}\n")
    assert target.read_text() == "{}\n"


def test_local_rank_zero_download_and_wait_holds_other_ranks_until_the_file_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    target = tmp_path / "task.jsonl"
    waiting = threading.Event()
    original_sleep = dist.time.sleep

    def sleep(seconds: float) -> None:  # the first poll found no file: local rank 0 writes it
        waiting.set()
        original_sleep(seconds)

    monkeypatch.setattr(dist.time, "sleep", sleep)
    writer = threading.Thread(target=lambda: (waiting.wait(60), target.write_text("x")))
    writer.start()
    with dist.local_rank_zero_download_and_wait(str(target)):
        seen = target.read_text()
    writer.join()
    assert waiting.is_set() and seen == "x"


class _RecordingICLMetric:
    """The protocol of llm-foundry's ICL metrics: ``needs_batch`` and ``update(batch,
    outputs, labels)`` returning per-example results."""

    def __init__(self) -> None:
        import torchmetrics

        class Metric(torchmetrics.Metric):
            def __init__(self) -> None:
                super().__init__()
                self.needs_batch = True
                self.calls: list[dict] = []
                self.add_state("n", default=torch.tensor(0), dist_reduce_fx="sum")

            def update(self, batch: dict, outputs: torch.Tensor, labels: torch.Tensor) -> dict:
                self.calls.append({"batch": batch, "outputs": outputs, "labels": labels})
                return {"result": [1] * len(labels)}

            def compute(self) -> torch.Tensor:
                return self.n

            def _wrap_update(self, update):  # llm-foundry's: update's result comes back
                return update

        self.metric = Metric()


def test_hf_update_metric_calls_needs_batch_metrics_as_composer_does() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from cadence.models import HuggingFaceModel

    torch.manual_seed(0)
    model = HuggingFaceModel(GPT2LMHeadModel(GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8)), use_logits=True)
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]),
             "attention_mask": torch.ones(2, 4, dtype=torch.long),
             "labels": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), "mode": "icl_task",
             "continuation_indices": [torch.tensor([3]), torch.tensor([2, 3])]}
    logits = model.eval_forward(batch)
    metric = _RecordingICLMetric().metric
    out = model.update_metric(batch, logits, metric)
    (call,) = metric.calls
    assert call["batch"] is batch
    assert call["outputs"].shape == (2, 4, 16)  # the full logits, not logits[:, :-1]
    assert call["labels"].tolist() == [[2, 3, 4, -100], [6, 7, 8, -100]]
    assert batch["labels"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]  # the batch is unchanged
    assert out == {"result": [1, 1], "metric_name": ["Metric", "Metric"]}


def test_wandb_logger_keeps_composers_init_kwargs_view() -> None:
    # llm-foundry's tests/utils/test_builders.py::test_build_logger reads it
    from cadence.loggers import WandBLogger

    logger = WandBLogger(project="foobar", init_kwargs={"config": {"foo": "bar"}})
    assert logger._init_kwargs == {"config": {"foo": "bar"}, "project": "foobar"}
    assert type(logger._init_kwargs["config"]) is dict
    assert WandBLogger(tags=["a"], init_kwargs={"tags": ["b"], "notes": "n"})._init_kwargs \
        == {"tags": ["a"], "notes": "n"}  # the explicit argument wins, as in Composer


def test_generate_takes_composers_signature() -> None:
    # llm-foundry's tests/callbacks/test_callbacks.py::test_build_callback reads the type
    # hints and builds Generate(prompts=[], interval='')
    import typing

    from cadence.callbacks import Generate

    assert typing.get_type_hints(Generate.__init__)["prompts"] == list[str]
    assert Generate(prompts=[], interval="").prompts == []
