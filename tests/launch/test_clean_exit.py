"""A finished multi-rank run ends cleanly from a user's script (issue 25, item 7).

A script that calls ``Trainer(...).fit()`` under ``torchrun --nproc_per_node 2`` (no
``cadence`` entry point, so no :func:`cadence.cli.exit_now`) used to abort with SIGABRT at
interpreter finalization in about 1 launch of 6 (``terminate called without an active
exception``: a gloo thread still releasing the last collective's tensors could not take the
GIL, pytorch#190489), after training correctly; torchrun then reported the job failed.
``Trainer.close()`` and the exit hook now destroy the process groups (a ``DeviceMesh``'s
too) and let gloo's threads finish before finalization
(:func:`cadence.utils.dist.release_process_groups`).

Each launch runs with a busy CPU beside it (the race is likelier under load). The issue's
figure is 30 launches each of a DDP and an FSDP2 script (FSDP2 x TP added here); on a shared
2-core machine the regular test runs :data:`LAUNCHES` each, 2 per ending (18 launches were 10
of the suite's minutes; ``CADENCE_EXIT_LAUNCHES=30`` for the full count).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHES = int(os.environ.get("CADENCE_EXIT_LAUNCHES", "4"))

SCRIPT = """\
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from cadence import Trainer, dist
from tests.common.models import SimpleModel

mode, ending = sys.argv[1], sys.argv[2]
gen = torch.Generator().manual_seed(0)
if mode == "fsdp_tp":  # FSDP2 x TP on a (1, 2) mesh: every rank sees the same samples
    from cadence.models.gpt import gpt2
    ids = torch.randint(0, 32, (64, 8), generator=gen)
    data = [{"input_ids": row, "labels": row} for row in ids]
    loader = DataLoader(data, batch_size=4)
    model = gpt2(n_layer=1, n_head=2, n_embd=16, vocab_size=32, max_seq_len=8)
    parallelism = {"fsdp": {}, "tp": {"tensor_parallel_degree": 2}}
else:
    data = TensorDataset(torch.randn(64, 8, generator=gen),
                         torch.randint(0, 3, (64,), generator=gen))
    loader = DataLoader(data, batch_size=4, sampler=dist.get_sampler(data))
    model = SimpleModel()
    parallelism = {"fsdp": {}} if mode == "fsdp" else None
trainer = Trainer(model=model, train_dataloader=loader, max_duration="6ba",
                  device="cpu", progress_bar=False, eval_dataloader=loader, eval_interval="3ba",
                  parallelism_config=parallelism)
trainer.fit()
if ending == "close":
    trainer.eval()  # eval() after fit(): the groups are still there
    trainer.close()
print(f"rank {dist.get_global_rank()} finished", flush=True)
"""


def launch(tmp_path: Path, mode: str, ending: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "--max_restarts", "0", str(script), mode, ending]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "fsdp_tp"])
def test_a_finished_run_started_from_a_script_never_aborts_at_exit(
    tmp_path: Path, mode: str
) -> None:
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # CPU load beside it
    aborts = []
    try:
        for i in range(LAUNCHES):
            ending = "close" if i % 2 else "exit"  # with and without Trainer.close()
            proc = launch(tmp_path, mode, ending)
            output = proc.stdout + proc.stderr
            if proc.returncode != 0 or "terminate called" in output:
                aborts.append(f"launch {i} ({ending}): exit {proc.returncode}\n{output[-3000:]}")
            else:
                assert output.count("finished") == 2, output[-3000:]
    finally:
        load.kill()
        load.wait()
    assert not aborts, f"{len(aborts)} of {LAUNCHES} launches failed at exit:\n" + aborts[0]
