"""Two nodes on localhost: ``cadence launch -n 1 --nnodes 2`` twice (one launcher per
"node") trains the same run as ``cadence launch -n 2`` on one node, loss for loss, bit for
bit: with torchrun's static rendezvous (``--node_rank``, ``--master_addr``), with its c10d
rendezvous (``--rdzv_backend c10d``), and with everything taken from a faked SLURM
environment. The FSDP (sharded) checkpoint the two nodes wrote resumes in one process.

Each launch is a real ``cadence launch`` (torchrun, gloo, a tiny GPT-2 on Shakespeare) with
``OMP_NUM_THREADS=1`` everywhere, so that every rank computes the same way whatever the
number of ranks per node; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from cadence.launch.slurm import default_master_port
from tests.common.distributed import find_free_port

REPO = Path(__file__).resolve().parents[2]
BATCHES = 4
TIMEOUT_S = 150


def run_file(folder: Path, fsdp: bool = True, **extra: Any) -> Path:
    """A tiny GPT-2 on Shakespeare, 4 batches of 4 sequences, the loss logged every batch to
    ``<folder>/metrics.jsonl``; with ``fsdp``, FSDP2 and a sharded checkpoint every 2."""
    config: dict[str, Any] = {
        "run_name": "multinode", "seed": 17, "max_duration": f"{BATCHES}ba",
        "global_train_batch_size": 4, "log_interval": "1ba", "progress_bar": False,
        "device": "cpu", "save_folder": str(folder), "save_interval": "2ba",
        "model": {"name": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 512,
                  "max_seq_len": 32},
        "train_loader": {"name": "shakespeare", "split": "train", "seq_len": 32,
                         "vocab_size": 512, "max_samples": 32},
        "optimizer": {"name": "adamw", "lr": 3.0e-3},
        "scheduler": {"name": "cosine_decay_with_warmup", "t_warmup": "2ba", "alpha_f": 0.1},
        "loggers": {"file": {}},
        **extra,
    }
    if fsdp:
        config["parallelism_config"] = {"fsdp": {"state_dict_type": "sharded"}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.with_name(folder.name + ".yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def environment(slurm: Optional[dict[str, str]] = None) -> dict[str, str]:
    """This process's environment without any real ``SLURM_*`` (plus ``slurm``, if given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                "CADENCE_CACHE_DIR": os.environ["CADENCE_CACHE_DIR"], **(slurm or {})})
    return env


def run_nodes(*nodes: tuple[list[str], dict[str, str]]) -> list[str]:
    """Start one ``cadence`` process per ``(arguments, environment)`` at once, wait for all
    (at most ``TIMEOUT_S`` in all), fail with every node's output unless each exits 0; their
    outputs. A node that fails ends the wait at once: torchrun's agent on the other node
    would otherwise sit in its exit barrier for 300 s waiting for the failed one."""
    logs = [tempfile.TemporaryFile(mode="w+") for _ in nodes]
    procs = [subprocess.Popen([sys.executable, "-m", "cadence", *args], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT, text=True)
             for (args, env), log in zip(nodes, logs)]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while (any(p.poll() is None for p in procs) and time.monotonic() < deadline
               and not any(p.poll() for p in procs)):
            time.sleep(0.2)
    finally:
        for proc in procs:  # a launcher's ranks die with it (PR_SET_PDEATHSIG)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    late = f" (killed after {TIMEOUT_S} s)" if time.monotonic() >= deadline else ""
    report = late + "\n".join(f"--- node {i} exited {p.returncode}:\n{out[-3000:]}"
                       for i, (p, out) in enumerate(zip(procs, outputs)))
    assert all(p.returncode == 0 for p in procs), report
    return outputs


def losses(folder: Path) -> dict[int, float]:
    """The training loss of each step, from ``metrics.jsonl``."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss/train/total"] for r in records if "loss/train/total" in r}


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The reference: ``cadence launch -n 2`` on one node; its loss by step."""
    folder = tmp_path_factory.mktemp("one_node") / "run"
    run_nodes((["launch", "-n", "2", str(run_file(folder))], environment()))
    curve = losses(folder)
    assert sorted(curve) == list(range(1, BATCHES + 1))
    return curve


def test_static_two_nodes_match_one_node_and_resume_in_one_process(
        one_node: dict[int, float], tmp_path: Path) -> None:
    folder = tmp_path / "two_nodes"
    config, port = str(run_file(folder)), str(find_free_port())
    run_nodes(*[(["launch", "-n", "1", "--nnodes", "2", "--node_rank", str(rank),
                  "--master_addr", "127.0.0.1", "--master_port", port, config], environment())
                for rank in (0, 1)])
    assert losses(folder) == one_node  # bit for bit

    # the nodes' sharded checkpoint after batch 2 (one shard per rank) resumes in one
    # process without FSDP, and continues the same curve
    (checkpoint,) = folder.glob("ep*-ba2")
    assert sorted(p.name for p in checkpoint.glob("*.distcp")) == ["__0_0.distcp",
                                                                   "__1_0.distcp"]
    resumed = tmp_path / "one_process"
    run_nodes((["train", str(run_file(resumed, fsdp=False, load_path=str(checkpoint)))],
               environment()))
    curve = losses(resumed)
    assert sorted(curve) == [3, 4]  # batches 1-2 came from the checkpoint
    for step in (3, 4):  # one process averages the same 4 samples in another order; a
        # run that restarted from scratch would log ~6.2326 at step 3 (0.4 % higher)
        assert curve[step] == pytest.approx(one_node[step], rel=1e-5), step


def test_c10d_rendezvous_two_nodes_match_one_node(one_node: dict[int, float],
                                                  tmp_path: Path) -> None:
    folder = tmp_path / "c10d"
    config, endpoint = str(run_file(folder)), f"127.0.0.1:{find_free_port()}"
    node = ["launch", "-n", "1", "--nnodes", "2", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", endpoint, "--rdzv_id", "multinode-test", config]
    run_nodes((node, environment()), (node, environment()))
    assert losses(folder) == one_node


def test_slurm_environment_two_nodes_match_one_node(one_node: dict[int, float],
                                                    tmp_path: Path) -> None:
    """``srun --nodes=2 --ntasks-per-node=1 cadence launch -n 1 RUN.yaml``, faked: the node
    count, node rank, master address (the first host of ``127.0.0.[1-2]``) and port (from
    ``SLURM_JOB_ID``) all come from the environment."""
    job_id = next(str(j) for j in (random.randrange(10**6) for _ in range(1000))
                  if port_is_free(default_master_port(str(j))))
    folder = tmp_path / "slurm"
    config = str(run_file(folder))
    slurm = {"SLURM_JOB_ID": job_id, "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
             "SLURM_STEP_NUM_TASKS": "2"}
    outputs = run_nodes(*[(["launch", "-n", "1", config],
                           environment({**slurm, "SLURM_NODEID": str(n)})) for n in (0, 1)])
    assert losses(folder) == one_node
    port = default_master_port(job_id)
    for n, out in enumerate(outputs):  # each launcher says what it took from SLURM
        assert (f"torchrun --nproc_per_node=1 --nnodes=2 --node_rank={n} "
                f"--master_addr=127.0.0.1 --master_port={port}") in out, out[-2000:]
