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
# SGD with momentum: optimizer state to reshard, and updates linear in the gradients, so the
# weights stay within 1e-5 of one process (AdamW's first steps are lr * sign(grad): a
# near-zero gradient computed in another order moves a weight by up to 2 lr)
LR, MOMENTUM = 0.1, 0.9


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
          build: Any = tiny_gpt2, inspect: Any = None, **kwargs: Any) -> Trainer:
    """STEPS SGD (momentum) steps of GLOBAL_BATCH samples on ``layout``; with ``folder``, a sharded
    checkpoint every 2 batches there and rank 0 writing the logged losses to
    ``folder/losses-<layout>.json``; ``inspect`` called with the Trainer before it trains;
    the Trainer, closed."""
    config, data_parallel = LAYOUTS[layout]
    model = build()
    memory = InMemoryLogger()
    saving = {"save_folder": f"{folder}/run", "save_interval": "2ba",
              "save_state_dict_type": "sharded"} if folder and not load_path else {}
    trainer = Trainer(model=model, train_dataloader=_loader(data_parallel),
                      max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=config, device="cpu", load_path=load_path,
                      **saving, **kwargs)
    if load_path is not None:
        assert int(trainer.state.timestamp.batch) == 2
    if inspect is not None:
        inspect(trainer)
    trainer.fit()
    trainer.close()
    trainer.losses = [float(v) for _, v in memory.data["loss/train/total"]]  # type: ignore
    if folder and dist.get_global_rank() == 0:
        Path(folder, f"losses-{layout}{'-resumed' if load_path else ''}.json").write_text(
            json.dumps(trainer.losses))  # type: ignore[attr-defined]
    return trainer


@pytest.fixture(scope="module")
def reference_run() -> tuple[list[float], dict[str, torch.Tensor]]:
    """The uninterrupted single-process run: its loss curve (STEPS steps) and the final
    weights of its Hugging Face model (``GPT2LMHeadModel`` keys)."""
    trainer = train("one")
    losses = trainer.losses  # type: ignore[attr-defined]
    weights = {k: v.detach().clone() for k, v in trainer.state.model.model.state_dict().items()}
    initial = tiny_gpt2().model.state_dict()
    assert len(losses) == STEPS and all(  # it trained: every weight moved
        not torch.equal(weights[k], initial[k]) for k in weights if "attn.bias" not in k)
    return losses, weights


@pytest.fixture(scope="module")
def reference(reference_run: tuple[list[float], dict[str, torch.Tensor]]) -> list[float]:
    return reference_run[0]


def assert_hf_export_is_the_whole_model(checkpoint: Path, out: Path,
                                        weights: dict[str, torch.Tensor]) -> None:
    """``cadence convert CHECKPOINT --to hf OUT`` writes every weight of the whole model,
    each within 1e-5 of ``weights``, and ``from_pretrained`` loads it."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from cadence.cli import main

    assert main(["convert", str(checkpoint), "--to", "hf", str(out)]) == 0
    exported = load_file(str(out / "model.safetensors"))
    assert sorted(exported) == sorted(weights)  # every stage's keys, nothing else
    for key, value in weights.items():
        torch.testing.assert_close(exported[key], value, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, key=key: f"{key}: {m}")
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    for key, value in weights.items():
        torch.testing.assert_close(loaded[key], value, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, key=key: f"{key}: {m}")


def _step(folder: Path, batch: int = 2) -> Path:
    found = sorted((folder / "run").glob(f"*ba{batch}*"))
    assert len(found) == 1 and found[0].is_dir(), found  # one DCP folder: every stage
    return found[0]


def _losses(folder: Path, name: str) -> list[float]:
    return json.loads((folder / f"losses-{name}.json").read_text())


# ---------------------------------------------------------------- resume across layouts


@pytest.mark.slow
def test_a_pp2_fsdp2_checkpoint_resumes_on_fsdp4_on_pp2_and_on_one_process(
        tmp_path: Path, reference_run: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    reference, weights = reference_run
    run_in_processes(4, __file__, "train", {"layout": "pp2_fsdp2", "folder": str(tmp_path)},
                     timeout=600)
    assert _losses(tmp_path, "pp2_fsdp2") == pytest.approx(reference, rel=RTOL)
    # the last checkpoint, exported: the whole model, as one process trained it
    assert_hf_export_is_the_whole_model(_step(tmp_path, STEPS), tmp_path / "hf", weights)
    step2 = str(_step(tmp_path))
    for layout, ranks in (("fsdp4", 4), ("pp2", 2)):
        run_in_processes(ranks, __file__, "train",
                         {"layout": layout, "folder": str(tmp_path), "load_path": step2},
                         timeout=600)
        assert _losses(tmp_path, f"{layout}-resumed") == pytest.approx(
            reference[2:], rel=RTOL), layout
    resumed = train("one", load_path=step2).losses  # type: ignore[attr-defined]
    assert resumed == pytest.approx(reference[2:], rel=RTOL)


# ---------------------------------------------------------------- export


def test_convert_to_hf_of_a_pp2_checkpoint_is_the_whole_model(
        tmp_path: Path, reference_run: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    reference, weights = reference_run
    run_in_processes(2, __file__, "train", {"layout": "pp2", "folder": str(tmp_path)},
                     timeout=300)
    assert _losses(tmp_path, "pp2") == pytest.approx(reference, rel=RTOL)
    final = _step(tmp_path, STEPS)
    assert_hf_export_is_the_whole_model(final, tmp_path / "hf", weights)
    # and --to full merges both stages into one file that loads on one process
    from cadence.checkpoint.export import load_full_state
    from cadence.cli import main

    assert main(["convert", str(final), "--to", "full", str(tmp_path / "full.pt")]) == 0
    merged = load_full_state(tmp_path / "full.pt")["model"]
    assert sorted(merged) == sorted(f"model.{k}" for k in weights)


# ---------------------------------------------------------------- kill and autoresume


KILL_STEPS = 8


def _run_file(tmp_path: Path, name: str, kill_at: Optional[int]) -> Path:
    """A 4-block GPT-2 (dropout on: the RNG must resume too) on PP=2, a sharded checkpoint
    every 2 batches, the loss of each batch in ``<save_folder>/metrics.jsonl``."""
    import yaml

    config: dict[str, Any] = {
        "run_name": "pp-killed", "seed": 17, "max_duration": f"{KILL_STEPS}ba",
        "global_train_batch_size": 4, "log_interval": "1ba", "progress_bar": False,
        "device": "cpu", "dist_timeout": 30,
        "model": {"name": "gpt2", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 512,
                  "max_seq_len": 32, "dropout": 0.1, "tie_word_embeddings": False},
        "train_loader": {"name": "shakespeare", "split": "train", "seq_len": 32,
                         "vocab_size": 512, "max_samples": 32},
        "optimizer": {"name": "adamw", "lr": 3.0e-3},
        "parallelism_config": {"pp": {"pipeline_parallel_degree": 2, "schedule": "1F1B",
                                      "num_microbatches": 2}},
        "loggers": {"file": {}},
        "save_folder": str(tmp_path / name), "save_interval": "2ba", "autoresume": True,
    }
    if kill_at is not None:  # rank 1 (the last stage) SIGKILLed once, after batch 2's save
        config["callbacks"] = {"tests.launch.test_restarts.KillRankAt": {
            "marker_dir": str(tmp_path / "markers"), "rank": 1, "batches": [kill_at]}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _launch(config: Path, max_restarts: int) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "CADENCE_CACHE_DIR": os.environ["CADENCE_CACHE_DIR"]}
    proc = subprocess.run([sys.executable, "-m", "cadence", "launch", "-n", "2",
                           "--max_restarts", str(max_restarts), str(config)],
                          cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=500)
    return proc.returncode, proc.stdout + proc.stderr


def _curve(folder: Path) -> dict[int, float]:
    """The last logged training loss of each step (a restarted group logs some again)."""
    curve: dict[int, float] = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss/train/total" in record:
            curve[record["step"]] = record["loss/train/total"]
    return curve


@pytest.mark.slow  # two launches of torchrun and 2 ranks (about 2 minutes)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun's agent, /proc")
def test_a_sigkilled_pp2_run_autoresumes_bit_exactly(tmp_path: Path) -> None:
    rc, out = _launch(_run_file(tmp_path, "straight", None), 0)
    assert rc == 0, out[-4000:]
    straight = _curve(tmp_path / "straight")
    assert sorted(straight) == list(range(1, KILL_STEPS + 1))
    rc, out = _launch(_run_file(tmp_path, "killed", kill_at=3), 1)
    assert rc == 0, out[-6000:]
    assert (tmp_path / "markers" / "batch_end-ba3").exists()  # the kill happened
    assert "was killed by SIGKILL" in out and "Resumed from checkpoint" in out, out[-6000:]
    assert "ba2" in out.split("Resumed from checkpoint", 1)[1].splitlines()[0]
    assert _curve(tmp_path / "killed") == straight  # bit for bit, every step


# ---------------------------------------------------------------- meta init under PP


INIT_SEED = 0  # the Trainer's seed=0: its rank_zero_seed, the init seed of a meta model


def _one_process_init() -> dict[str, torch.Tensor]:
    """A meta GPT-2 initialised on one process with the Trainer's seed (the non-PP path)."""
    from cadence.parallel.param_init import materialize_and_init

    model = tiny_gpt2(init_device="meta")
    materialize_and_init(model, "cpu", seed=INIT_SEED)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _meta_run(name: str, config: dict[str, Any], data_parallel: int,
              expected: dict[str, torch.Tensor], blocks: set[str]) -> list[float]:
    """A meta GPT-2 trained on ``config``: checks that the rank allocated its own stages'
    parameters only (``blocks``: the GPT-2 blocks it must hold) and that their (gathered)
    weights are ``expected``'s bit for bit; returns the loss curve."""
    import cadence.parallel.pipeline as pipeline_module
    from torch.distributed.tensor import DTensor

    LAYOUTS[name] = (config, data_parallel)
    materialised: list[tuple[str, int]] = []
    draws: list[int] = []
    real_to_empty, real_init = torch.nn.Module.to_empty, pipeline_module.init_local_stages

    def build() -> Any:
        model = tiny_gpt2(init_device="meta")
        names = {id(p): n for n, p in model.named_parameters()}

        def to_empty(module: torch.nn.Module, *, device: Any, recurse: bool = True) -> Any:
            materialised.extend((names.get(id(p), "sharded"), p.numel())
                                for p in module.parameters())
            return real_to_empty(module, device=device, recurse=recurse)

        torch.nn.Module.to_empty = to_empty  # type: ignore[method-assign]
        return model

    def init_local_stages(*args: Any, **kwargs: Any) -> int:
        draws.append(real_init(*args, **kwargs))
        return draws[-1]

    pipeline_module.init_local_stages = init_local_stages  # type: ignore[assignment]
    weights: dict[str, torch.Tensor] = {}

    def inspect(trainer: Trainer) -> None:
        torch.nn.Module.to_empty = real_to_empty  # type: ignore[method-assign]
        weights.update({k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                        for k, v in trainer.state.model.state_dict().items()})

    try:
        losses = train(name, build=build, inspect=inspect).losses  # type: ignore
    finally:
        torch.nn.Module.to_empty = real_to_empty  # type: ignore[method-assign]
        pipeline_module.init_local_stages = real_init  # type: ignore[assignment]
    # only this rank's stages were ever allocated (FSDP2: their parameters, sharded, are
    # new objects: counted by size), and they are all it holds
    own = sorted(weights)
    if data_parallel == 1:
        assert sorted(n for n, _ in materialised) == own, (materialised, own)
    assert sum(n for _, n in materialised) == sum(weights[k].numel() for k in own)
    assert {k.split(".")[3] for k in own if k.startswith("model.transformer.h.")} == blocks
    assert draws and draws[0] > 0  # the other stages' fills drew past, on scratch
    different = [k for k in own if not torch.equal(weights[k], expected[k])]
    assert not different, (name, different)  # the one-process init's weights
    return losses


def _from(weights: dict[str, torch.Tensor]) -> Any:
    """A CPU GPT-2 holding ``weights``."""
    model = tiny_gpt2()
    model.load_state_dict(weights)
    return model


def _meta_pipeline_run(folder: str) -> None:
    """On each schedule (one stage per rank; two, in a V), a meta GPT-2 under PP=2
    (:func:`_meta_run`'s checks), its loss curve a CPU-built PP=2 run's from the same
    weights; a meta model streaming pretrained weights refused."""
    expected = _one_process_init()
    rank = dist.get_global_rank()
    for schedule in ("1F1B", "ZBVZeroBubble"):
        pp = {"pipeline_parallel_degree": 2, "schedule": schedule, "num_microbatches": 4}
        blocks = {str(rank), str(3 - rank)} if schedule == "ZBVZeroBubble" else \
            {str(2 * rank), str(2 * rank + 1)}
        losses = _meta_run("meta", {"pp": pp}, 1, expected, blocks)
        LAYOUTS["cpu"] = ({"pp": pp}, 1)
        assert losses == pytest.approx(
            train("cpu", build=lambda: _from(expected)).losses,  # type: ignore[attr-defined]
            rel=RTOL), schedule
    # streamed pretrained weights into a meta model: refused, naming what to do instead
    from cadence.models.gpt import hf_pretrained

    if dist.get_global_rank() == 0:
        tiny_gpt2().model.save_pretrained(f"{folder}/pretrained")
    dist.barrier()
    with pytest.raises(ValueError, match=r"streaming pretrained weights into a meta model "
                                         r"\(hf_pretrained\(..., init_device='meta'\)\) is not "
                                         r"supported under pipeline parallelism"):
        train("cpu", build=lambda: hf_pretrained(f"{folder}/pretrained", init_device="meta"))


def test_a_meta_model_under_pp2_allocates_its_own_stages_and_trains_as_on_the_cpu(
        tmp_path: Path) -> None:
    run_in_processes(2, __file__, "_meta_pipeline_run", {"folder": str(tmp_path)},
                     timeout=400)


def _meta_fsdp_run(folder: str) -> None:
    """A meta GPT-2 under PP=2 x FSDP2=2 (:func:`_meta_run`'s checks); rank 0 writes the
    losses to ``folder/losses-meta_fsdp.json``."""
    pp_rank = dist.get_global_rank() // 2
    losses = _meta_run("meta_fsdp", LAYOUTS["pp2_fsdp2"][0] or {}, 2, _one_process_init(),
                       {str(2 * pp_rank), str(2 * pp_rank + 1)})
    if dist.get_global_rank() == 0:
        Path(folder, "losses-meta_fsdp.json").write_text(json.dumps(losses))


@pytest.mark.slow
def test_a_meta_model_under_pp2_fsdp2_allocates_its_own_shards_and_trains_as_one_process(
        tmp_path: Path) -> None:
    run_in_processes(4, __file__, "_meta_fsdp_run", {"folder": str(tmp_path)}, timeout=600)
    expected = _one_process_init()
    one = train("one", build=lambda: _from(expected)).losses  # type: ignore[attr-defined]
    assert _losses(tmp_path, "meta_fsdp") == pytest.approx(one, rel=RTOL)


# ---------------------------------------------------------------- PP x FSDP2 x TP


LAYOUTS["pp2_fsdp2_tp2"] = ({"pp": {"pipeline_parallel_degree": 2, "num_microbatches": 2},
                             "fsdp": {}, "tp": {"tensor_parallel_degree": 2}}, 2)


def _three_d_run(folder: str) -> None:
    """PP=2 x FSDP2=2 x TP=2 on 8 ranks: every parameter a DTensor on the stage's 2-D
    ``(dp_shard, tp)`` mesh, block weights sharded over ``tp``; rank 0 writes the losses,
    sharded checkpoints go to ``folder/run``."""
    from torch.distributed.tensor import DTensor, Shard

    def check(trainer: Trainer) -> None:
        params = dict(trainer.state.model.named_parameters())
        assert params and all(isinstance(p, DTensor) for p in params.values())
        assert {p.device_mesh.mesh_dim_names for p in params.values()} == {("dp_shard", "tp")}
        c_fc = [p for n, p in params.items() if n.endswith("mlp.c_fc.weight")]
        assert len(c_fc) == 2  # this stage's two blocks, their MLP split column-wise on tp
        assert all(isinstance(p.placements[1], Shard) for p in c_fc), c_fc[0].placements

    train("pp2_fsdp2_tp2", folder=folder, inspect=check)


@pytest.mark.slow
def test_pp2_fsdp2_tp2_on_eight_ranks_gives_the_single_process_losses(
        tmp_path: Path, reference_run: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    reference, weights = reference_run
    run_in_processes(8, __file__, "_three_d_run", {"folder": str(tmp_path)}, timeout=900)
    assert _losses(tmp_path, "pp2_fsdp2_tp2") == pytest.approx(reference, rel=RTOL)
    # its checkpoint (each stage sharded over dp_shard and tp) exports the whole model
    assert_hf_export_is_the_whole_model(_step(tmp_path, STEPS), tmp_path / "hf", weights)


# ---------------------------------------------------------------- the benchmark's meter


def test_the_activation_meter_counts_what_autograd_holds_until_backward_frees_it() -> None:
    """``benchmarks/pipeline.py``'s per-stage meter: a forward's saved activations counted
    once per storage (parameters left out), two forwards in flight hold twice one, and
    backward frees them back to zero."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pipeline_benchmark",
                                                  REPO / "benchmarks" / "pipeline.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    meter = bench._ActivationMeter({p.untyped_storage().data_ptr() for p in layer.parameters()})

    def forward() -> torch.Tensor:
        x = torch.randn(8, 16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            return layer(x).square().sum()

    first = forward()
    one = meter.bytes
    # saved: x (8x16), tanh's output (8x32, also the second linear's input), the output
    # (8x4) for square(); the weights are parameters: not counted
    assert one == 4 * (8 * 16 + 8 * 32 + 8 * 4)
    second = forward()
    assert meter.bytes == meter.peak == 2 * one
    first.backward()
    assert meter.bytes == one
    second.backward()
    assert meter.bytes == 0 and meter.peak == 2 * one and not meter.live
