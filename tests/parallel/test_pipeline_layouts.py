"""Pipeline checkpoints across layouts (issue 31, item 4): a run saved with PP=2 x FSDP2=2
resumes on FSDP2=4, on PP=2 alone and on one process, continuing the single-process loss
curve; a SIGKILLed PP=2 run autoresumes bit-exactly; ``cadence convert --to hf`` of a
pipeline's sharded checkpoint gives the whole model. Plus PP x FSDP2 x TP on 8 ranks and a
meta-device model under a pipeline (each rank allocates its own stages only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from tests.algorithms.algorithm_helpers import CountingTokens
from tests.common.distributed import run_in_processes
from tests.parallel.test_pipeline import GLOBAL_BATCH, RTOL, SEQ, VOCAB, tiny_gpt2

REPO = Path(__file__).resolve().parents[2]
STEPS = 4  # a checkpoint after step 2, two steps resumed
LR = 1e-2


def _loader(data_parallel: int) -> DataLoader:
    dataset = CountingTokens(STEPS * GLOBAL_BATCH, seq_len=SEQ, vocab_size=VOCAB)
    return DataLoader(dataset, batch_size=GLOBAL_BATCH // data_parallel,
                      sampler=dist.get_sampler(dataset, shuffle=False))


LAYOUTS: dict[str, tuple[Optional[dict[str, Any]], int]] = {
    # name: (parallelism_config, data-parallel ranks)
    "one": (None, 1),
    "pp2": ({"pp": {"pipeline_parallel_degree": 2}}, 1),
    "fsdp4": ({"fsdp": {}}, 4),
    "pp2_fsdp2": ({"pp": {"pipeline_parallel_degree": 2, "num_microbatches": 2},
                   "fsdp": {}}, 2),
}


def train(layout: str, folder: Optional[str] = None, load_path: Optional[str] = None,
          build: Any = tiny_gpt2, **kwargs: Any) -> Trainer:
    """STEPS AdamW steps of GLOBAL_BATCH samples on ``layout``; with ``folder``, a sharded
    checkpoint every 2 batches there and rank 0 writing the logged losses to
    ``folder/losses-<layout>.json``; the Trainer, closed."""
    config, data_parallel = LAYOUTS[layout]
    model = build()
    memory = InMemoryLogger()
    saving = {"save_folder": f"{folder}/run", "save_interval": "2ba",
              "save_state_dict_type": "sharded"} if folder and not load_path else {}
    trainer = Trainer(model=model, train_dataloader=_loader(data_parallel),
                      max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=LR),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=config, device="cpu", load_path=load_path,
                      **saving, **kwargs)
    if load_path is not None:
        assert int(trainer.state.timestamp.batch) == 2
    trainer.fit()
    trainer.close()
    trainer.losses = [float(v) for _, v in memory.data["loss/train/total"]]  # type: ignore
    if folder and dist.get_global_rank() == 0:
        Path(folder, f"losses-{layout}{'-resumed' if load_path else ''}.json").write_text(
            json.dumps(trainer.losses))  # type: ignore[attr-defined]
    return trainer


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """The uninterrupted single-process loss curve (STEPS steps)."""
    losses = train("one").losses  # type: ignore[attr-defined]
    assert len(losses) == STEPS and losses[-1] < losses[0]
    return losses


def _step2(folder: Path) -> Path:
    found = sorted((folder / "run").glob("*ba2*"))
    assert len(found) == 1 and found[0].is_dir(), found  # one DCP folder: every stage
    return found[0]


def _losses(folder: Path, name: str) -> list[float]:
    return json.loads((folder / f"losses-{name}.json").read_text())


# ---------------------------------------------------------------- resume across layouts


@pytest.mark.slow
def test_a_pp2_fsdp2_checkpoint_resumes_on_fsdp4_on_pp2_and_on_one_process(
        tmp_path: Path, reference: list[float]) -> None:
    run_in_processes(4, __file__, "train", {"layout": "pp2_fsdp2", "folder": str(tmp_path)},
                     timeout=600)
    assert _losses(tmp_path, "pp2_fsdp2") == pytest.approx(reference, rel=RTOL)
    step2 = str(_step2(tmp_path))
    for layout, ranks in (("fsdp4", 4), ("pp2", 2)):
        run_in_processes(ranks, __file__, "train",
                         {"layout": layout, "folder": str(tmp_path), "load_path": step2},
                         timeout=600)
        assert _losses(tmp_path, f"{layout}-resumed") == pytest.approx(
            reference[2:], rel=RTOL), layout
    resumed = train("one", load_path=step2).losses  # type: ignore[attr-defined]
    assert resumed == pytest.approx(reference[2:], rel=RTOL)
