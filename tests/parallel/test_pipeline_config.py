"""``parallelism_config.pp`` before anything is built: the settings checked naming their key,
the degrees and mesh order ``(pp, dp_replicate, dp_shard, tp)``, which stages each rank
runs, and the splits refused (more stages than blocks, a split point matching nothing)."""

from __future__ import annotations

import pytest
import torch

from cadence.models.gpt import gpt2
from cadence.parallel import FSDPConfig, ParallelDims, ParallelismConfig
from cadence.parallel.config import PPConfig, parse_parallelism_config
from cadence.parallel.pipeline import stage_ids
from cadence.parallel.pipeline_split import split_model


def problems(pp: dict) -> str:
    with pytest.raises(ValueError) as info:
        parse_parallelism_config({"pp": pp})
    return str(info.value)


def test_settings_are_typed_and_canonical() -> None:
    config = parse_parallelism_config({"pp": {"pipeline_parallel_degree": 2,
                                              "schedule": "interleaved1f1b"}})
    assert config.pp == PPConfig(pipeline_parallel_degree=2, schedule="Interleaved1F1B",
                                 stages_per_rank=2)
    assert config.pp_degree == 2 and config.pp.num_stages == 4
    assert parse_parallelism_config(config.to_dict()) == config
    assert PPConfig(schedule="gpipe").stages_per_rank == 1


def test_bad_settings_are_named() -> None:
    message = problems({"pipeline_parallel_degree": 0, "schedul": "1F1B",
                        "microbatch_size": 2, "num_microbatches": 2})
    assert "pp.pipeline_parallel_degree: 0 must be a positive int" in message
    assert "pp.schedul: unknown pipeline key. Did you mean 'schedule'?" in message
    assert "pp.num_microbatches: set microbatch_size or num_microbatches, not both" in message
    assert "pp.schedule: 'gpip' is not one of: GPipe, 1F1B" in problems({"schedule": "gpip"})
    assert "1F1B runs one stage per rank" in problems({"stages_per_rank": 2})
    assert "DualPipeV runs exactly two stages per rank" in problems(
        {"schedule": "DualPipeV", "stages_per_rank": 3})
    assert "pp.split_points: 2 split point(s) make 3 stages, but pipeline_parallel_degree x " \
           "stages_per_rank = 2; give 1" in problems(
               {"pipeline_parallel_degree": 2, "split_points": ["a", "b"]})
    assert "pp.split_points: ['a', 'a'] names a module twice" in problems(
        {"split_points": ["a", "a"]})
    with pytest.raises(ValueError, match="pp.stages_per_rank: 3: GPipe runs one stage"):
        PPConfig(schedule="GPipe", stages_per_rank=3)
    with pytest.raises(ValueError, match="set it under parallelism_config.pp"):
        parse_parallelism_config({"tp": {"pipeline_parallel_degree": 2}})


def dims(config: dict, world: int, rank: int = 0) -> ParallelDims:
    return ParallelDims.from_config(parse_parallelism_config(config), world_size=world,
                                    local_world_size=world, global_rank=rank)


def test_pp_is_the_outermost_dimension_and_not_data_parallel() -> None:
    config = {"pp": {"pipeline_parallel_degree": 2}, "fsdp": {},
              "tp": {"tensor_parallel_degree": 2}}
    ranks = [dims(config, 8, r) for r in range(8)]
    assert ranks[0].mesh_shape == (2, 2, 2)
    assert ranks[0].mesh_dim_names == ("pp", "dp_shard", "tp")
    assert [d.dp_rank for d in ranks] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [d.pp_rank for d in ranks] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {d.dp_size for d in ranks} == {2}
    alone = dims({"pp": {"pipeline_parallel_degree": 2}}, 2, 1)
    assert alone.mesh_dim_names == ("pp", "dp_replicate") and alone.dp_size == 1
    assert not alone.uses_ddp and alone.describe() == "dp_replicate=1 dp_shard=1 tp=1 pp=2 " \
                                                      "(2 ranks)"


def test_degrees_that_do_not_fit_are_named() -> None:
    with pytest.raises(ValueError, match="pipeline_parallel_degree=3 does not divide the "
                                         "world size 4"):
        dims({"pp": {"pipeline_parallel_degree": 3}}, 4)
    with pytest.raises(ValueError, match="leaves 2 data-parallel ranks per stage, which need "
                                         r"parallelism_config.fsdp"):
        dims({"pp": {"pipeline_parallel_degree": 2}}, 4)
    assert ParallelismConfig(fsdp=FSDPConfig()).pp_degree == 1


def test_stages_per_rank_loop_or_v() -> None:
    assert [stage_ids(r, 2, 1, "1F1B") for r in range(2)] == [[0], [1]]
    assert [stage_ids(r, 2, 2, "Interleaved1F1B") for r in range(2)] == [[0, 2], [1, 3]]
    assert [stage_ids(r, 2, 2, "ZBVZeroBubble") for r in range(2)] == [[0, 3], [1, 2]]


def tiny(n_layer: int = 4, **kwargs: object) -> torch.nn.Module:
    return gpt2(n_layer=n_layer, n_head=2, n_embd=16, vocab_size=32, max_seq_len=8,
                tie_word_embeddings=kwargs.pop("tie", False), **kwargs)


def test_stages_chain_to_the_whole_model_without_copying() -> None:
    model = tiny(n_layer=5)
    ids = torch.randint(0, 32, (2, 8))
    split = split_model(model, 3)
    assert [list(s.blocks) for s in split.stages] == [["0", "1"], ["2", "3"], ["4"]]
    assert split.stages[0].wte is model.model.transformer.wte  # shared, not copied
    x = split.inputs({"input_ids": ids})
    for stage in split.stages:
        x = stage(x)
    torch.testing.assert_close(x, model({"input_ids": ids}).logits, rtol=0, atol=0)
    uneven = split_model(model, 2, ["model.transformer.h.4"])
    assert [list(s.blocks) for s in uneven.stages] == [["0", "1", "2", "3"], ["4"]]


def test_splits_that_do_not_fit_are_refused() -> None:
    model = tiny()
    with pytest.raises(ValueError, match=r"5 stages \(pipeline_parallel_degree x "
                                         r"stages_per_rank\) but the model has 4 blocks"):
        split_model(model, 5)
    with pytest.raises(ValueError, match="split_points: 'model.transformer.h.9' matches no "
                                         "block of the model. Did you mean"):
        split_model(model, 2, ["model.transformer.h.9"])
    with pytest.raises(ValueError, match="does not come after the previous stage's first"):
        split_model(model, 3, ["model.transformer.h.2", "model.transformer.h.1"])
    with pytest.raises(ValueError, match="ties its input embedding .* tie_word_embeddings=False"):
        split_model(tiny(tie=True), 2)
    with pytest.raises(ValueError, match="cannot split Linear into pipeline stages.*Define "
                                         "pipeline_split"):
        split_model(torch.nn.Linear(2, 2), 2)


def test_a_models_pipeline_split_hook_is_used() -> None:
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

        def pipeline_split(self, num_stages: int, split_points: object) -> list:
            return [self.a, self.b][:num_stages]

    split = split_model(Two(), 2)
    assert split.inputs((torch.ones(3, 4), None)).shape == (3, 4)
    with pytest.raises(ValueError, match=r"pipeline_split\(3, \.\.\.\) returned 2 stages"):
        split_model(Two(), 3)


def test_microbatches_for_counts_as_the_step_and_refuses_what_the_schedule_cannot_run() -> None:
    # the one count the Trainer's pipeline step and `cadence plan` both use
    assert PPConfig(pipeline_parallel_degree=2).microbatches_for(8) == 2  # one per stage
    assert PPConfig(pipeline_parallel_degree=2, microbatch_size=2).microbatches_for(8) == 4
    assert PPConfig(pipeline_parallel_degree=2).microbatches_for(8, 1) == 8
    assert PPConfig(pipeline_parallel_degree=2, num_microbatches=4).microbatches_for(8, 1) == 4
    with pytest.raises(ValueError, match=r"batch of 8 samples does not split evenly into "
                                         r"microbatches \(parallelism_config.pp.microbatch_size"):
        PPConfig(pipeline_parallel_degree=2, microbatch_size=3).microbatches_for(8)
    with pytest.raises(ValueError, match=r"1 microbatch\(es\) cannot fill 2 pipeline ranks"):
        PPConfig(pipeline_parallel_degree=2, num_microbatches=1).microbatches_for(8)
    interleaved = PPConfig(pipeline_parallel_degree=2, schedule="Interleaved1F1B",
                           num_microbatches=3)
    with pytest.raises(ValueError, match="Interleaved1F1B needs a number of microbatches that "
                                         "is a multiple of pipeline_parallel_degree=2; got 3"):
        interleaved.microbatches_for(6)
    # the V schedules take any number from p up
    assert PPConfig(pipeline_parallel_degree=2, schedule="ZBVZeroBubble",
                    num_microbatches=3).microbatches_for(6) == 3
