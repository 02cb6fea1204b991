"""FSDP2 with tied weights: BERT's masked-LM decoder shares ``word_embeddings.weight``, and
``BertEmbeddings`` is one of the model's ``_no_split_modules``. A unit holding a parameter tied
to a module outside it would put one parameter in two FSDP groups (FSDP2 refuses it at the
first forward); the plan keeps such a module with its parent instead. Two ranks then train as
one process does, and the weights stay tied."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from cadence.models import HuggingFaceModel
from cadence.parallel.fsdp import plan_fsdp_units
from cadence.parallel.config import parse_parallelism_config


def bert() -> HuggingFaceModel:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return HuggingFaceModel(BertForMaskedLM(config))


def train(fsdp: bool) -> tuple[dict[int, float], HuggingFaceModel]:
    model = bert()
    ids = torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=False))
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="4ba", seed=3,
                      loggers=[memory], log_interval="1ba", progress_bar=False,
                      parallelism_config={"fsdp": {}} if fsdp else None)
    trainer.fit()
    trainer.close()
    return dict(zip(*memory.steps_and_values("loss/train/total"))), model


def test_a_module_tied_outside_itself_is_not_a_unit() -> None:
    model = bert()
    names = [u.name for u in plan_fsdp_units(model, parse_parallelism_config({"fsdp": {}}).fsdp)]
    assert "model.bert.encoder.layer.0" in names  # BertLayer: a unit
    assert "model.bert.embeddings" not in names  # tied to cls.predictions.decoder


def _two_ranks(folder: str) -> None:
    losses, model = train(fsdp=True)
    inner = model.model
    assert inner.cls.predictions.decoder.weight is inner.bert.embeddings.word_embeddings.weight
    if dist.get_global_rank() == 0:
        (Path(folder) / "losses.json").write_text(json.dumps(losses))


def test_bert_with_tied_embeddings_trains_on_two_fsdp_ranks_as_one_process(
        tmp_path: Path) -> None:
    from tests.common.distributed import run_in_processes

    run_in_processes(2, __file__, "_two_ranks", {"folder": str(tmp_path)})
    two = json.loads((tmp_path / "losses.json").read_text())
    one, _ = train(fsdp=False)
    assert len(one) == 4
    for step, loss in one.items():
        assert abs(two[str(step)] - loss) < 1e-5, (step, two[str(step)], loss)
