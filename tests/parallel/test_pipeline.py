"""Pipeline parallelism (``parallelism_config.pp``) through the Trainer: every
``torch.distributed.pipelining`` schedule on 2 gloo ranks gives the single-process loss
curve of a 4-block GPT-2, PP x FSDP2 on 4 ranks too, and every refusal names its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from cadence.models.gpt import gpt2
from tests.algorithms.algorithm_helpers import CountingTokens
from tests.common.distributed import run_in_processes

STEPS = 3
GLOBAL_BATCH = 8
SEQ = 8
VOCAB = 64
RTOL = 1e-5  # fp32: the same kernels, only the order of the microbatch sums differs


def counting_tokens() -> Dataset:
    """``STEPS * GLOBAL_BATCH`` counting sequences from random starts,
    ``{"input_ids", "labels"}: [SEQ]``."""
    return CountingTokens(STEPS * GLOBAL_BATCH, seq_len=SEQ, vocab_size=VOCAB)


def tiny_gpt2(**kwargs: Any) -> Any:
    torch.manual_seed(0)
    return gpt2(n_layer=4, n_head=2, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ,
                tie_word_embeddings=False, **kwargs)


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from cadence.models.huggingface import HuggingFaceModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=SEQ, tie_word_embeddings=False)
    return HuggingFaceModel(LlamaForCausalLM(config))


def train_losses(parallelism_config: Optional[dict[str, Any]], data_parallel: int = 1,
                 check_blocks: Optional[set[str]] = None, build: Any = tiny_gpt2,
                 inspect: Any = None, sgd: bool = False, **trainer_kwargs: Any) -> list[float]:
    """STEPS AdamW (or SGD) steps of GLOBAL_BATCH samples; the logged loss of each step
    (``check_blocks``: the GPT-2 block indices this rank must hold; ``inspect``: called with
    the Trainer before it trains)."""
    model = build()
    dataset = counting_tokens()
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // data_parallel,
                        sampler=dist.get_sampler(dataset, shuffle=False))
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{STEPS}ba",
                      optimizers=(torch.optim.SGD(model.parameters(), lr=0.5) if sgd else
                                  torch.optim.AdamW(model.parameters(), lr=1e-2)),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=parallelism_config, device="cpu", **trainer_kwargs)
    if check_blocks is not None:  # the other stages' blocks are gone, names kept
        names = {n.split(".")[3] for n, _ in trainer.state.model.named_parameters()
                 if n.startswith("model.transformer.h.")}
        assert names == check_blocks
    if inspect is not None:
        inspect(trainer)
    trainer.fit()
    trainer.close()
    losses = [float(value) for _, value in memory.data["loss/train/total"]]
    assert len(losses) == STEPS
    return losses


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """The single-process loss curve (computed once, in this process)."""
    losses = train_losses(None)
    assert losses[-1] < losses[0]  # it learns
    return losses


@pytest.fixture(scope="module")
def clipped_reference() -> list[float]:
    """Single-process SGD loss curves without and with gradient clipping at a norm it
    reaches (SGD: AdamW would hide a per-stage scale)."""
    from cadence.algorithms import GradientClipping

    plain = train_losses(None, sgd=True)
    clipped = train_losses(None, sgd=True, algorithms=[GradientClipping("norm", 0.05)])
    assert clipped[1:] != pytest.approx(plain[1:], rel=1e-3)  # the clipping bites
    return clipped


@pytest.fixture(scope="module")
def llama_reference() -> list[float]:
    """A tiny Hugging Face Llama's single-process loss curve."""
    return train_losses(None, build=tiny_llama)


SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]
MULTI = SCHEDULES[2:]  # stages_per_rank defaults to 2


@pytest.mark.world_size(2)
def test_every_schedule_and_split_gives_the_single_process_losses(
        reference: list[float], llama_reference: list[float],
        clipped_reference: list[float]) -> None:
    from cadence.algorithms import GradientClipping

    # one pair of processes for all seven (each spawn costs more than its training);
    # the interleaved and V schedules run 2 stages per rank (4 stages of 1 block)
    for schedule in SCHEDULES:
        pp = {"pipeline_parallel_degree": 2, "schedule": schedule, "num_microbatches": 4}
        rank = dist.get_global_rank()
        blocks = ({rank, 3 - rank} if schedule in ("ZBVZeroBubble", "DualPipeV")  # a V
                  else {rank, rank + 2} if schedule in MULTI else {2 * rank, 2 * rank + 1})
        losses = train_losses({"pp": pp}, check_blocks={str(b) for b in blocks})
        assert losses == pytest.approx(reference, rel=RTOL), schedule
    # an uneven split (1 + 3 blocks) and token-weighted microbatches: the same step
    pp = {"pipeline_parallel_degree": 2, "microbatch_size": 2,
          "split_points": ["model.transformer.h.1"]}
    losses = train_losses({"pp": pp}, accumulate_train_batch_on_tokens=True,
                          check_blocks={"0"} if dist.get_global_rank() == 0 else {"1", "2", "3"})
    assert losses == pytest.approx(reference, rel=RTOL)
    # a Hugging Face Llama (model.layers, rotary embeddings) split evenly without help
    losses = train_losses({"pp": {"pipeline_parallel_degree": 2}}, build=tiny_llama)
    assert losses == pytest.approx(llama_reference, rel=RTOL)
    # gradient clipping by the whole model's norm (both stages' gradients combined)
    losses = train_losses({"pp": {"pipeline_parallel_degree": 2}}, sgd=True,
                          algorithms=[GradientClipping("norm", 0.05)])
    assert losses == pytest.approx(clipped_reference, rel=RTOL)


@pytest.mark.slow
@pytest.mark.world_size(4)
def test_pipeline_with_fsdp2_on_four_ranks(reference: list[float]) -> None:
    from torch.distributed.tensor import DTensor

    def sharded(trainer: Trainer) -> None:  # each stage's parameters sharded over 2 ranks
        params = list(trainer.state.model.parameters())
        assert params and all(isinstance(p, DTensor) and p.device_mesh.size() == 2
                              for p in params)

    config = {"pp": {"pipeline_parallel_degree": 2, "schedule": "Interleaved1F1B",
                     "num_microbatches": 2}, "fsdp": {}}
    assert train_losses(config, data_parallel=2, inspect=sharded) == pytest.approx(
        reference, rel=RTOL)


@pytest.mark.world_size(2)
def test_what_cannot_run_under_a_pipeline_is_refused_by_name(tmp_path: Path) -> None:
    from cadence.algorithms import SWA, CutMix

    pp = {"pp": {"pipeline_parallel_degree": 2}}
    loader = DataLoader(counting_tokens(), batch_size=GLOBAL_BATCH)
    folder = tmp_path / f"rank{dist.get_global_rank()}"

    def build(**kwargs: Any) -> Trainer:
        kwargs.setdefault("parallelism_config", pp)
        return Trainer(model=tiny_gpt2(), train_dataloader=loader, max_duration="1ba",
                       progress_bar=False, device="cpu", **kwargs)

    with pytest.raises(ValueError) as info:
        build(algorithms=[SWA(), CutMix()], device_train_microbatch_size="auto")
    message = str(info.value)  # (eval, predict, EMA: tests/parallel/test_pipeline_loop.py)
    assert "algorithm SWA: not supported under pipeline parallelism: it keeps an " \
           "AveragedModel copy of the whole model" in message
    assert "algorithm CutMix: not supported under pipeline parallelism" in message
    assert "device_train_microbatch_size='auto'" in message
    trainer = build(parallelism_config={"pp": {"pipeline_parallel_degree": 2,
                                               "num_microbatches": 3}})
    with pytest.raises(ValueError, match="batch of 8 samples does not split evenly into "
                                         r"microbatches \(parallelism_config.pp.num_microbatches"):
        trainer.fit()
    trainer.close()
    with pytest.raises(ValueError, match="save_state_dict_type='full' under pipeline "
                                         "parallelism"):
        build(save_folder=str(folder), save_state_dict_type="full")


def _pipeline_run(**kwargs: Any) -> list[float]:
    model = tiny_gpt2()
    dataset = counting_tokens()
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH,
                        sampler=dist.get_sampler(dataset, shuffle=False))
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config={"pp": {"pipeline_parallel_degree": 2}},
                      device="cpu", **kwargs)
    trainer.fit()
    trainer.close()
    return [float(v) for _, v in memory.data["loss/train/total"]]


def _save_pipeline_run(folder: str) -> None:
    """PP=2 (1F1B) for STEPS steps with a sharded checkpoint after step 2, then resumed on
    PP=2 from it; rank 0 writes the uninterrupted losses to ``folder/losses.json``."""
    losses = _pipeline_run(save_folder=f"{folder}/run", save_interval="2ba")
    if dist.get_global_rank() == 0:
        Path(folder, "losses.json").write_text(json.dumps(losses))
    dist.barrier()
    step2 = sorted(Path(folder, "run").glob("*ba2*"))
    assert len(step2) == 1
    assert _pipeline_run(load_path=str(step2[0])) == pytest.approx(losses[2:], rel=RTOL)


def test_a_pipeline_checkpoint_resumes_on_pp2_and_on_one_process(tmp_path: Path) -> None:
    run_in_processes(2, __file__, "_save_pipeline_run", {"folder": str(tmp_path)}, timeout=300)
    expected = json.loads((tmp_path / "losses.json").read_text())
    step2 = sorted((tmp_path / "run").glob("*ba2*"))
    assert len(step2) == 1 and step2[0].is_dir()  # a DCP folder holding both stages
    model = tiny_gpt2()
    loader = DataLoader(counting_tokens(), batch_size=GLOBAL_BATCH)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      device="cpu", load_path=str(step2[0]))
    assert int(trainer.state.timestamp.batch) == 2
    trainer.fit()
    trainer.close()
    resumed = [float(v) for _, v in memory.data["loss/train/total"]]
    assert resumed == pytest.approx(expected[2:], rel=RTOL)
