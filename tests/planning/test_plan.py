"""``cadence plan`` against reality: the planned bytes per rank equal a real gloo run's, the
planned peak is within 10 % of the real peak (the same tracker, real tensors), layouts that
cannot work fail with training's message, a model too large is told what fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cadence.config.load import ConfigError
from cadence.planning.devices import get_device
from cadence.planning.planner import plan_run

ROOT = Path(__file__).resolve().parents[2]


def run_file(tmp_path: Path, parallelism: dict[str, Any], **extra: Any) -> str:
    """A tiny GPT-2 run (fp32, AdamW, 1 microbatch per step) on random tokens."""
    run = {"max_duration": "4ba", "global_train_batch_size": 4, "precision": "fp32",
           "seed": 3, "progress_bar": False,
           "model": {"name": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64,
                     "vocab_size": 128, "max_seq_len": 32},
           "train_loader": {"name": "tests.common.lm_data.random_tokens", "seq_len": 32,
                            "vocab_size": 128},
           "optimizer": {"name": "adamw", "lr": 1e-3},
           "parallelism_config": parallelism, **extra}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return str(path)


def real_rank(run_path: str, out_dir: str) -> None:
    """One rank of the real run: a step to create the optimizer state, then a step under
    the tracker the plan uses; this rank's bytes and peak to ``out_dir/rank<r>.json``."""
    import torch.distributed as torch_dist

    from cadence.config.build import build_trainer
    from cadence.config.load import load_config
    from cadence.parallel.memory import local_state_bytes
    from cadence.planning.simulate import memory_breakdown, tracker_for

    world = torch_dist.get_world_size() if torch_dist.is_initialized() else 1
    trainer = build_trainer(load_config(run_path, world_size=world))
    trainer.fit(duration="1ba")
    model, optimizer = trainer.state.model, trainer.state.optimizers[0]
    tracker = tracker_for(model, optimizer)
    with tracker:
        trainer.fit(duration="1ba")
    state = local_state_bytes(model, optimizer)
    activations, temporaries, peak = memory_breakdown(tracker)
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {**state, "peak": peak, "activations": activations, "temporaries": temporaries}))
    trainer.close()


def _compare(tmp_path: Path, world: int, parallelism: dict[str, Any], **extra: Any) -> None:
    from tests.common.distributed import run_in_processes

    path = run_file(tmp_path, parallelism, **extra)
    plan = plan_run(path, world_size=world, device=get_device("h100-sxm"),
                    ranks=range(world), remedies=False)
    run_in_processes(world, __file__, "real_rank", {"run_path": path,
                                                    "out_dir": str(tmp_path)})
    for planned in plan.ranks:
        real = json.loads((tmp_path / f"rank{planned.rank}.json").read_text())
        print(f"plan-vs-real rank {planned.rank}: params {planned.params_bytes}/"
              f"{real['params']} grads {planned.grads_bytes}/{real['grads']} optimizer "
              f"{planned.optimizer_bytes}/{real['optimizer']} peak {planned.peak_bytes}/"
              f"{real['peak']}")  # the figures of docs/benchmarks.md (pytest -s)
        assert (planned.params_bytes, planned.grads_bytes, planned.optimizer_bytes) == (
            real["params"], real["grads"], real["optimizer"]), planned.rank
        assert real["params"] > 0 and real["grads"] > 0 and real["optimizer"] > 0
        assert abs(planned.peak_bytes - real["peak"]) <= 0.10 * real["peak"], (
            planned.rank, planned.peak_bytes, real["peak"], planned.activations_bytes,
            real["activations"], planned.temporary_bytes, real["temporaries"])


@pytest.mark.parametrize("world, parallelism", [
    (1, {}),
    (2, {"fsdp": {"sharding_strategy": "FULL_SHARD"}}),
    (2, {"fsdp": {}, "tp": {"tensor_parallel_degree": 2}}),
], ids=["single", "fsdp2", "fsdp2xtp2"])
def test_planned_bytes_equal_the_real_run(tmp_path: Path, world: int,
                                          parallelism: dict[str, Any]) -> None:
    _compare(tmp_path, world, parallelism)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [
    {"fsdp": {}}, {"fsdp": {}, "tp": {"tensor_parallel_degree": 2}},
], ids=["fsdp2", "fsdp2xtp2"])
def test_planned_bytes_equal_the_real_run_on_4_ranks(tmp_path: Path,
                                                     parallelism: dict[str, Any]) -> None:
    _compare(tmp_path, 4, parallelism)


def test_a_tp_degree_that_does_not_divide_the_world_fails_with_trainings_message(
        tmp_path: Path) -> None:
    from cadence.parallel.config import ParallelismConfig, TPConfig, FSDPConfig
    from cadence.parallel.parallel_dims import ParallelDims

    config = ParallelismConfig(fsdp=FSDPConfig(), tp=TPConfig(tensor_parallel_degree=3))
    with pytest.raises(ValueError) as trained:
        ParallelDims.from_config(config, world_size=8, local_world_size=8, global_rank=0)
    path = run_file(tmp_path, {"fsdp": {}, "tp": {"tensor_parallel_degree": 3}},
                    global_train_batch_size=8)
    with pytest.raises(ConfigError) as planned:
        plan_run(path, world_size=8, device=get_device("h100-sxm"))
    assert str(trained.value) in str(planned.value)
    assert "tensor_parallel_degree=3 does not divide the world size 8" in str(planned.value)


def test_a_tp_degree_that_does_not_divide_the_heads_fails_before_sharding(
        tmp_path: Path) -> None:
    path = run_file(tmp_path, {"fsdp": {}, "tp": {"tensor_parallel_degree": 8}},
                    global_train_batch_size=8)  # 4 heads over 8 ranks
    with pytest.raises(ValueError, match="head"):
        plan_run(path, world_size=8, device=get_device("h100-sxm"), ranks=[0])


def tiny_mixtral(hidden_size: int = 64, num_hidden_layers: int = 2,
                 vocab_size: int = 128, max_seq_len: int = 32) -> Any:
    """A 2-layer transformers Mixtral, 4 experts, top-2 (a run file's model:
    ``name: tests.planning.test_plan.tiny_mixtral``)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from cadence.models.huggingface import HuggingFaceModel

    config = MixtralConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                           intermediate_size=2 * hidden_size,
                           num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=max_seq_len, tie_word_embeddings=False)
    return HuggingFaceModel(MixtralForCausalLM(config))


#: the run file's GPT-2 with its own output projection (pipeline stages cannot share one)
UNTIED_GPT2 = {"name": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 128,
               "max_seq_len": 32, "tie_word_embeddings": False}
PP2 = {"pp": {"pipeline_parallel_degree": 2, "num_microbatches": 4}}


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_pipeline_stages_planned_bytes_equal_the_real_run(tmp_path: Path, schedule: str) -> None:
    # PP=2 on 2 gloo ranks, 4 microbatches: rank 0 holds stage 0 (embeddings, block 0),
    # rank 1 stage 1 (block 1, the head); each rank's bytes exactly, its peak within 10 %
    pp = {"pp": {**PP2["pp"], "schedule": schedule}}
    _compare(tmp_path, 2, pp, global_train_batch_size=8, model=UNTIED_GPT2)


def test_pipeline_collectives_and_in_flight_microbatches(tmp_path: Path) -> None:
    # the stage boundary: [2, 32, 64] fp32 activations = 16 KiB per microbatch, 4 of them,
    # forward out of stage 0 and their gradients back; 1F1B holds 2 microbatches in flight
    # on the first stage, GPipe 4: GPipe's stage-0 activations are larger
    from cadence.planning.stages import schedule_order

    path = run_file(tmp_path, PP2, global_train_batch_size=8, model=UNTIED_GPT2)
    plans = {s: plan_run(path, [f"parallelism_config.pp.schedule={s}"], world_size=2,
                         device=get_device("h100-sxm"), remedies=False)
             for s in ("1F1B", "GPipe")}
    first, last = plans["1F1B"].ranks
    sends = {(r.rank, c.op): (c.count, c.bytes) for r in (first, last) for c in r.collectives
             if c.dim == "pp"}
    assert sends == {(0, "send"): (4, 4 * 16384), (0, "recv"): (4, 4 * 16384),
                     (1, "send"): (4, 4 * 16384), (1, "recv"): (4, 4 * 16384)}
    assert plans["GPipe"].ranks[0].activations_bytes > first.activations_bytes
    assert first.params_bytes != last.params_bytes  # the ranks differ: both reported
    order = schedule_order("1F1B", 2, 0, 4)
    assert order[:3] == [("F", 0, 0), ("F", 0, 1), ("B", 0, 0)]
    assert plans["1F1B"].estimate.step_seconds > plans["1F1B"].estimate.compute_seconds / 1.75


def test_pipeline_layouts_training_refuses_fail_with_trainings_message(tmp_path: Path) -> None:
    path = run_file(tmp_path, {"pp": {"pipeline_parallel_degree": 2, "num_microbatches": 1}},
                    global_train_batch_size=4, model=UNTIED_GPT2)
    with pytest.raises(ConfigError, match=r"1 microbatch\(es\) cannot fill 2 pipeline ranks"):
        plan_run(path, world_size=2, device=get_device("h100-sxm"))
    with pytest.raises(ValueError, match="ties its input embedding"):  # split_model's
        plan_run(path, ["parallelism_config.pp.num_microbatches=2",
                        "model.tie_word_embeddings=true"], world_size=2,
                 device=get_device("h100-sxm"), remedies=False)


EP2 = {"fsdp": {}, "ep": {"expert_parallel_degree": 2}}


def test_expert_parallel_planned_bytes_equal_the_real_run(tmp_path: Path) -> None:
    # EP=2 x FSDP2 on 2 gloo ranks: each rank holds 2 of the 4 experts of each block
    _compare(tmp_path, 2, EP2, model={"name": "tests.planning.test_plan.tiny_mixtral"})


def test_expert_parallel_all_to_all_is_in_the_collectives(tmp_path: Path) -> None:
    path = run_file(tmp_path, EP2, model={"name": "tests.planning.test_plan.tiny_mixtral"})
    plan = plan_run(path, world_size=2, device=get_device("h100-sxm"), ranks=[0],
                    remedies=False)
    a2a = [c for c in plan.ranks[0].collectives if c.op == "all_to_all"]
    assert [c.dim for c in a2a] == ["ep"]
    # balanced routing: 2 samples x 32 tokens x top-2 = 128 rows of 64 fp32 per all-to-all;
    # per block a dispatch and a combine in forward, as many in backward: 4 x 2 blocks
    assert a2a[0].count == 8 and a2a[0].bytes == 8 * 128 * 64 * 4
    assert plan.estimate.comm_seconds["ep"] > 0


def test_a_model_too_large_for_80_gb_is_told_the_first_remedy_that_fits(
        tmp_path: Path) -> None:
    # GPT-2 at d=2048, 8 layers, seq 2048, 64 samples per rank, fp32, no checkpointing:
    # activations alone are far over 80 GiB; checkpointing plus smaller microbatches fit
    path = run_file(tmp_path, {"fsdp": {}}, global_train_batch_size=128,
                    device_train_microbatch_size=64)
    overrides = ["model.n_layer=8", "model.n_embd=2048", "model.n_head=16",
                 "model.max_seq_len=2048", "model.vocab_size=32000",
                 "train_loader.seq_len=2048", "train_loader.vocab_size=32000"]
    plan = plan_run(path, overrides, world_size=2, device=get_device("a100-80gb"), ranks=[0])
    assert not plan.fits and plan.peak_bytes > plan.memory_limit_bytes
    assert plan.remedy is not None
    assert plan.remedy.overrides[0] == "parallelism_config.fsdp.activation_checkpointing=true"
    assert plan.remedy.peak_bytes <= plan.memory_limit_bytes
    assert plan.tried[-1] == (plan.remedy.overrides, plan.remedy.peak_bytes)
    assert all(p > plan.memory_limit_bytes for _, p in plan.tried[:-1])


def test_cli_json_parses_and_imports_no_cuda(tmp_path: Path) -> None:
    path = run_file(tmp_path, {"fsdp": {"verbose": True}})
    code = ("import sys, torch; from cadence.cli import main; rc = main(sys.argv[1:]); "
            "assert not torch.cuda.is_initialized(); sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code, "plan", path, "--world-size", "2",
                          "--gpu", "h100-sxm", "--json"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)  # the FSDP plan's verbose lines went to stderr
    assert {"ranks", "collectives", "step_seconds", "tokens_per_second_per_device", "mfu",
            "fits"} <= set(plan)
    assert [r["rank"] for r in plan["ranks"]] == [0, 1]
    assert {"rank", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
            "peak_bytes"} <= set(plan["ranks"][0])
    assert {c["op"] for c in plan["collectives"]} == {"all_gather", "reduce_scatter"}
    assert plan["fits"] is True and 0 < plan["mfu"] < 1
    assert "FSDP2 wrap plan" in out.stderr


def test_schedule_orders_hold_the_documented_microbatches_in_flight() -> None:
    from cadence.planning.stages import bubble_factor, schedule_order

    def most_in_flight(order: list[tuple[str, int, int]]) -> int:
        live, most = 0, 0
        for kind, _, _ in order:
            live += 1 if kind == "F" else -1
            most = max(most, live)
        return most

    # p = 4 pipeline ranks, m = 8 microbatches: GPipe holds all 8; 1F1B p - r on rank r
    assert [most_in_flight(schedule_order("GPipe", 4, r, 8)) for r in range(4)] == [8] * 4
    assert [most_in_flight(schedule_order("1F1B", 4, r, 8)) for r in range(4)] == [4, 3, 2, 1]
    # interleaved, v = 2 stages per rank: Megatron's warm-up 2 (p - r - 1) + (v - 1) p, + 1
    assert [most_in_flight(schedule_order("Interleaved1F1B", 4, r, 8, 2))
            for r in range(4)] == [11, 9, 7, 5]
    for schedule, v in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("LoopedBFS", 2),
                        ("ZBVZeroBubble", 2)):
        for r in range(4):  # every (stage, microbatch) runs forward once, then backward once
            order = schedule_order(schedule, 4, r, 8, v)
            forwards = [(s, i) for kind, s, i in order if kind == "F"]
            assert sorted(forwards) == [(s, i) for s in range(v) for i in range(8)]
            assert sorted((s, i) for kind, s, i in order if kind == "B") == sorted(forwards)
            for s, i in forwards:
                assert order.index(("F", s, i)) < order.index(("B", s, i))
    assert bubble_factor("1F1B", 4, 8) == 11 / 8 and bubble_factor("1F1B", 1, 8) == 1.0
    assert bubble_factor("Interleaved1F1B", 4, 8, 2) == (8 + 1.5) / 8


def test_a_dead_rank_simulation_says_how_it_ended() -> None:
    import os
    import signal

    from cadence.planning.planner import _exit_reason

    def ended(child) -> str:
        pid = os.fork()
        if pid == 0:
            child()
            os._exit(0)
        return _exit_reason(os.waitpid(pid, 0)[1])

    assert ended(lambda: os.kill(os.getpid(), signal.SIGKILL)) == "killed by SIGKILL"
    assert ended(lambda: os.kill(os.getpid(), signal.SIGRTMIN + 2)) == (
        f"killed by signal {signal.SIGRTMIN + 2}")
    assert ended(lambda: os._exit(3)) == "exit code 3"
