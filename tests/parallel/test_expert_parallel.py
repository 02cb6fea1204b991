"""Expert parallelism: a tiny transformers Mixtral (built from a config) trained with EP=2 on
2 gloo ranks and EP=2 x FSDP2 on 4 ranks follows the single-process loss curve (the
router's load-balancing loss included) and gradients, also when one expert receives no
token; the dispatch alone gives transformers' experts output; bad ``ep`` settings are
refused before anything is sharded, naming the key."""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from cadence.parallel import EPConfig, FSDPConfig, ParallelDims, ParallelismConfig
from cadence.parallel.config import parse_parallelism_config
from cadence.parallel.expert_parallel import expert_load, plan_expert_parallel
from cadence.parallel.moe_dispatch import combine, dispatch
from cadence.registry.errors import ConfigError

VOCAB, SEQ, GLOBAL_BATCH = 64, 8, 8
STEPS = 5
LR = 1.0  # SGD: the final weights compare the gradients faithfully (Adam would amplify
# the last bits of gradients near zero into whole steps)
EXPERTS = 4
# fp32: EP computes each expert on the same rows as one process and adds a token's experts
# in the same (expert) order; what differs is the matmul blocking of row subsets. Measured
# max relative loss difference over 5 steps: 0 (2 ranks, plain and starved), 1.1e-7 (4 ranks).
REL_TOLERANCE = 1e-5
EP2 = {"fsdp": {}, "ep": {"expert_parallel_degree": 2}}


def tiny_mixtral(num_experts: int = EXPERTS) -> Any:
    """A 2-layer Mixtral (hidden 16, 4 experts, top-2) whose loss includes the router's
    load-balancing loss (``output_router_logits``)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from cadence.models import HuggingFaceModel

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           num_local_experts=num_experts, num_experts_per_tok=2,
                           max_position_embeddings=SEQ, output_router_logits=True,
                           router_aux_loss_coef=0.05)
    return HuggingFaceModel(MixtralForCausalLM(config))


def tiny_moe(family: str) -> Any:
    """A 1-layer transformers MoE of ``family`` (``qwen2_moe``: with its shared expert;
    ``qwen3_moe``; ``olmoe``), 4 experts, top-2, as a ``HuggingFaceModel``."""
    import transformers

    from cadence.models import HuggingFaceModel

    names = {"qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe"}[family]
    common = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=SEQ, num_experts=EXPERTS,
                  num_experts_per_tok=2, intermediate_size=32, bos_token_id=0,
                  eos_token_id=1, pad_token_id=0)
    extra = {"qwen2_moe": dict(moe_intermediate_size=8, shared_expert_intermediate_size=8),
             "qwen3_moe": dict(moe_intermediate_size=8), "olmoe": {}}[family]
    config = getattr(transformers, f"{names}Config")(**common, **extra)
    torch.manual_seed(0)
    return HuggingFaceModel(getattr(transformers, f"{names}ForCausalLM")(config))


def starve_expert(model: Any, expert: int) -> None:
    """Route no token to ``expert``: each router's choice of it is replaced by another
    expert the token did not choose (a forward hook on every router, the same in every
    layout), so that expert gets no row and a zero gradient."""
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    def hook(_module: Any, _inputs: Any, output: Any) -> Any:
        logits, scores, index = output
        other = (index.roll(1, dims=-1) + 1) % EXPERTS  # differs from the other choice
        other = torch.where(other == expert, (other + 1) % EXPERTS, other)
        return logits, scores, torch.where(index == expert, other, index)

    for module in model.modules():
        if isinstance(module, MixtralTopKRouter):
            module.register_forward_hook(hook)


class Counting(Dataset):
    """``STEPS * GLOBAL_BATCH`` counting sequences from random starts."""

    def __init__(self) -> None:
        starts = torch.randint(0, VOCAB, (STEPS * GLOBAL_BATCH, 1),
                               generator=torch.Generator().manual_seed(7))
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def train(parallelism_config: Optional[dict[str, Any]], microbatch: Optional[int] = None,
          starve: Optional[int] = None, **kwargs: Any) -> tuple[list[float], Trainer]:
    """Train the tiny Mixtral for STEPS steps of GLOBAL_BATCH samples: the logged losses.

    The load-balancing loss is computed per forward over the tokens it sees, so the
    single-process reference runs microbatches of one data-parallel rank's size
    (``microbatch``): the same per-forward losses, weighted alike."""
    model = tiny_mixtral()
    if starve is not None:
        starve_expert(model, starve)
    dataset = Counting()
    if microbatch is None:
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // dist.get_world_size(),
                            sampler=dist.get_sampler(dataset, shuffle=False))
    else:  # one process, each batch's microbatches the ranks' batches (a rank's samples
        # are every world-th: DistributedSampler's order)
        world = GLOBAL_BATCH // microbatch
        order = [step * GLOBAL_BATCH + rank + world * i for step in range(STEPS)
                 for rank in range(world) for i in range(microbatch)]
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH, sampler=order)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=LR),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      device="cpu", parallelism_config=parallelism_config,
                      device_train_microbatch_size=microbatch, **kwargs)
    start = int(trainer.state.timestamp.batch)
    trainer.fit()
    trainer.close()
    losses = [float(v) for _, v in memory.data["loss/train/total"]]
    assert len(losses) == STEPS - start
    return losses, trainer


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` whole (DTensors gathered): a collective on several ranks."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def one_process(world: int, starve: Optional[int] = None) -> dict[str, Any]:
    """The single-process run a ``world``-rank run is compared with: its losses and final
    weights (microbatches of one rank's size)."""
    losses, trainer = train(None, microbatch=GLOBAL_BATCH // world, starve=starve)
    assert losses[-1] < losses[0]  # it learns
    return {"losses": losses, "state": full_state(trainer.state.model)}


@pytest.fixture(scope="module")
def reference_2() -> dict[str, Any]:
    """One process's runs for 2 ranks, computed once in the test process: plain, and with
    expert 3 starved."""
    return {"plain": one_process(2), "starved": one_process(2, starve=3)}


@pytest.fixture(scope="module")
def reference_4() -> dict[str, Any]:
    return {"plain": one_process(4), "starved": one_process(4, starve=0)}


def check_against(expected: dict[str, Any], parallelism_config: dict[str, Any],
                  starve: Optional[int], what: str, **kwargs: Any) -> Trainer:
    """The run's per-step losses (relative) and final weights against one process's."""
    losses, trainer = train(parallelism_config, starve=starve, **kwargs)
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, expected["losses"]))
    if dist.get_global_rank() == 0:
        print(f"max relative loss diff {what}: {worst:.2e}", flush=True)
    assert worst <= REL_TOLERANCE, f"{what}: {losses} vs {expected['losses']}"
    mine = full_state(trainer.state.model)
    assert mine.keys() == expected["state"].keys()
    for key, value in expected["state"].items():
        assert torch.allclose(mine[key], value, rtol=1e-4, atol=1e-6), f"{what}: {key}"
    return trainer


class TinyExperts(torch.nn.Module):
    """A user's experts module through the hook: ``num_experts``, one ``[E, H, H]`` weight,
    the transformers call signature, and ``expert_forward`` on the local experts."""

    def __init__(self, num_experts: int = EXPERTS, hidden: int = 8) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.weight = torch.nn.Parameter(torch.randn(num_experts, hidden, hidden) / hidden)

    def forward(self, hidden: torch.Tensor, index: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        for e in range(self.num_experts):
            token, slot = torch.where(index == e)
            y = torch.tanh(hidden[token] @ self.weight[e].T) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return out

    def expert_forward(self, rows: torch.Tensor, tokens_per_expert: list[int]) -> torch.Tensor:
        from cadence.utils.dtensor import local_tensor

        weight = local_tensor(self.weight)  # [E / ep, H, H]
        return torch.cat([torch.tanh(chunk @ weight[e].T)
                          for e, chunk in enumerate(rows.split(tokens_per_expert))])


class TinyMoE(torch.nn.Module):
    """A user's MoE block: a linear router (top-2 of softmax), then the experts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.router = torch.nn.Linear(8, EXPERTS, bias=False)
        self.experts = TinyExperts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, H]
        weights, index = self.router(x).softmax(-1).topk(2, dim=-1)  # [N, 2] each
        return self.experts(x, index, weights)


def test_ep_settings_are_typed_and_bad_ones_named() -> None:
    config = parse_parallelism_config(EP2)
    assert config.ep == EPConfig(expert_parallel_degree=2) and config.ep_degree == 2
    assert config.to_dict() == {"fsdp": {}, "ep": {"expert_parallel_degree": 2}}
    assert ParallelismConfig(ep={"expert_parallel_degree": 2}).ep == EPConfig(2)
    assert ParallelismConfig().ep_degree == 1
    with pytest.raises(ConfigError, match=r"parallelism_config\.ep\.expert_parallel_degree.*"
                                          r"0 must be a positive int"):
        EPConfig(expert_parallel_degree=0)
    with pytest.raises(ValueError, match=r"parallelism_config\.ep\.expert_parallel_degre: "
                                         r"unknown EP key\. Did you mean "
                                         r"'expert_parallel_degree'"):
        parse_parallelism_config({"ep": {"expert_parallel_degre": 2}})
    with pytest.raises(ValueError, match=r"parallelism_config\.ep: 2 must be a dict"):
        parse_parallelism_config({"ep": 2})
    with pytest.raises(ValueError, match=r"expert_parallel_degree: 'two' \(str\) is not a int"):
        parse_parallelism_config({"fsdp": {}, "ep": {"expert_parallel_degree": "two"}})


def test_run_file_names_a_bad_ep_setting_before_torch_is_needed() -> None:
    from cadence.config.schema import check_schema

    _, problems = check_schema({"parallelism_config": {"fsdp": {}, "ep": {
        "expert_parallel_degree": -2}}})
    assert [(p.key, p.message) for p in problems if "ep" in p.key] == [
        ("parallelism_config.ep.expert_parallel_degree",
         "-2 must be a positive int (1: no expert parallelism).")]


def _dims(config: dict[str, Any], world: int, local: int = 8) -> ParallelDims:
    return ParallelDims.from_config(parse_parallelism_config(config), world_size=world,
                                    local_world_size=local, global_rank=0)


def test_ep_is_borrowed_from_the_shard_ranks() -> None:
    d = _dims({"fsdp": {}, "ep": {"expert_parallel_degree": 2}}, 4)
    assert (d.world_size, d.dp_shard, d.ep, d.dp_size, d.gradient_divide_factor) == (4, 4, 2, 4, 4)
    assert d.mesh_shape == (4,) and d.mesh_dim_names == ("dp_shard",) and d.ep_enabled
    assert d.describe() == "dp_replicate=1 dp_shard=4 tp=1 ep=2 (4 ranks)"
    hybrid = _dims({"fsdp": {"sharding_strategy": "HYBRID_SHARD"},
                    "ep": {"expert_parallel_degree": 4}}, 8, local=4)
    assert (hybrid.dp_replicate, hybrid.dp_shard, hybrid.ep) == (2, 4, 4)
    with pytest.raises(ValueError, match=r"expert_parallel_degree=3 does not divide the 4 "
                                         r"data-parallel shard ranks"):
        _dims({"fsdp": {}, "ep": {"expert_parallel_degree": 3}}, 4)
    with pytest.raises(ValueError, match=r"expert_parallel_degree=8 does not divide the 4 "
                                         r"data-parallel shard ranks"):
        _dims({"fsdp": {"sharding_strategy": "HYBRID_SHARD"},
               "ep": {"expert_parallel_degree": 8}}, 8, local=4)
    with pytest.raises(ValueError, match=r"expert_parallel_degree=2 needs "
                                         r"parallelism_config\.fsdp.*add fsdp: \{\}"):
        _dims({"ep": {"expert_parallel_degree": 2}}, 2)
    with pytest.raises(ValueError, match="with tensor parallelism .* is not supported yet"):
        _dims({"fsdp": {}, "tp": {"tensor_parallel_degree": 2},
               "ep": {"expert_parallel_degree": 2}}, 4)
    with pytest.raises(ValueError, match=r"ep \(|does not divide the 4 data-parallel"):
        ParallelDims(dp_replicate=1, dp_shard=4, tp=1, world_size=4, ep=3)


def test_dispatch_and_combine_give_transformers_experts() -> None:
    """On one rank, dispatch -> the fused experts -> combine is transformers' eager experts
    forward (the loop over experts, which skips a dropped slot: index E), an expert no token
    chose included; so are the gradients."""
    from cadence.parallel.expert_parallel import _fused_expert_forward

    model = tiny_mixtral()
    experts = model.model.model.layers[0].mlp.experts
    experts.config._experts_implementation = "eager"  # (grouped_mm mishandles index E)
    hidden = torch.randn(12, 16, requires_grad=True)
    index = torch.randint(0, EXPERTS - 1, (12, 2))  # expert 3 gets no token
    index[:, 1] = (index[:, 0] + 1) % (EXPERTS - 1)
    index[5, 1] = EXPERTS  # a dropped slot
    weights = torch.rand(12, 2)
    expected = experts(hidden, index, weights)
    (grad_in,) = torch.autograd.grad(expected.square().sum(), hidden)
    rows, plan = dispatch(hidden, index, EXPERTS, None)
    assert plan.tokens_per_expert.tolist()[3] == 0 and sum(plan.tokens_per_local_expert) == 23
    out = combine(_fused_expert_forward(experts, rows, plan.tokens_per_local_expert), plan,
                  weights, 12, None)
    assert torch.allclose(out, expected, atol=1e-6)
    (grad,) = torch.autograd.grad(out.square().sum(), hidden)
    assert torch.allclose(grad, grad_in, atol=1e-6)


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe", "olmoe"])
def test_built_in_families_are_found_and_computed_alike(family: str) -> None:
    """Qwen2-MoE, Qwen3-MoE and OLMoE store their experts in the fused layout: found by the
    plan, and dispatch -> fused experts -> combine gives their eager experts' output."""
    from cadence.parallel.expert_parallel import _fused_expert_forward

    model = tiny_moe(family)
    found = plan_expert_parallel(model, 2)
    assert [(e.name, e.num_experts) for e in found] == [("model.model.layers.0.mlp.experts",
                                                         EXPERTS)]
    experts = found[0].module
    experts.config._experts_implementation = "eager"
    hidden = torch.randn(10, 16)
    index = torch.stack([torch.arange(10) % EXPERTS, (torch.arange(10) + 1) % EXPERTS], dim=1)
    weights = torch.rand(10, 2)
    rows, plan = dispatch(hidden, index, EXPERTS, None)
    out = combine(_fused_expert_forward(experts, rows, plan.tokens_per_local_expert), plan,
                  weights, 10, None)
    assert torch.allclose(out, experts(hidden, index, weights), atol=1e-6)


def test_plan_refuses_what_it_cannot_split() -> None:
    with pytest.raises(ValueError, match=r"expert_parallel_degree=3 does not divide the 4 "
                                         r"experts of model\.model\.layers\.0\.mlp\.experts "
                                         r"\(MixtralExperts\)"):
        plan_expert_parallel(tiny_mixtral(), 3)
    with pytest.raises(ValueError, match="the model has no mixture-of-experts experts module"):
        plan_expert_parallel(torch.nn.Linear(2, 2), 2)
    found = plan_expert_parallel(TinyMoE(), 2)
    assert [(e.name, e.num_experts) for e in found] == [("experts", EXPERTS)]
    named = TinyMoE()
    named.expert_parallel_modules = lambda: [named.router]  # the hook naming a wrong module
    with pytest.raises(ValueError, match=r"router \(Linear\), named by "
                                         r"expert_parallel_modules\(\), is neither"):
        plan_expert_parallel(named, 2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The folder the plain EP=2 run of :func:`test_ep2_on_two_ranks` saves in."""
    return str(tmp_path_factory.mktemp("ep-checkpoints"))


def _save_kwargs(folder: str, kind: str = "sharded") -> dict[str, Any]:
    """Checkpoints every 2 steps, ``kind`` (``sharded``: DCP; ``full``: one file)."""
    return {"save_folder": f"{folder}/run-ep2-{kind}", "save_interval": "2ba",
            "run_name": f"run-ep2-{kind}", "save_state_dict_type": kind}


@pytest.mark.world_size(2)
def test_ep2_on_two_ranks(reference_2: dict[str, Any], checkpoints: str) -> None:
    """EP=2 on 2 ranks (fsdp over both, experts split 2 + 2): the single-process losses and
    weights, plain (writing sharded checkpoints) and with expert 3 receiving no token; the
    layout; per-expert counts; every gradient, the gradient norm and clipping; a user's
    experts module through the hook; and the refusals, before anything shards."""
    trainer = check_against(reference_2["plain"], EP2, None, "ep2", **_save_kwargs(checkpoints))
    _write_losses(checkpoints, trainer, "sharded")
    dims = trainer.state.parallel_dims
    assert (dims.dp_shard, dims.ep, dims.world_size) == (2, 2, 2)
    assert dims.expert_mesh.mesh_dim_names == ("dp_shard_in_ep", "ep")
    assert tuple(dims.expert_mesh.shape) == (1, 2)
    model = trainer.state.model
    experts = model.model.model.layers[0].mlp.experts
    gate_up = experts.gate_up_proj
    assert isinstance(gate_up, DTensor) and tuple(gate_up.shape) == (EXPERTS, 64, 16)
    assert tuple(gate_up.to_local().shape) == (EXPERTS // 2, 64, 16)  # this rank's 2 experts
    attn = model.model.model.layers[0].self_attn.q_proj.weight
    assert tuple(attn.to_local().shape)[0] == tuple(attn.shape)[0] // 2  # FSDP2 over 2 ranks
    load = expert_load(model)
    assert sorted(load) == ["model.model.layers.0.mlp.experts", "model.model.layers.1.mlp.experts"]
    # the last forward: 4 samples x 8 tokens x top-2 on each of the 2 ranks
    assert all(int(counts.sum()) == 2 * 4 * SEQ * 2 for counts in load.values())
    assert experts.all_to_all_bytes > 0

    from cadence.callbacks import ExpertLoadMonitor

    starved = check_against(reference_2["starved"], EP2, 3, "ep2, expert 3 starved",
                            callbacks=[ExpertLoadMonitor(per_expert=True)],
                            **_save_kwargs(checkpoints, "full"))
    _write_losses(checkpoints, starved, "full")
    assert all(int(c[3]) == 0 for c in expert_load(starved.state.model).values())
    memory = next(d for d in starved.logger.destinations if isinstance(d, InMemoryLogger))
    name = "model.model.layers.1.mlp.experts"
    logged = {k: v[-1][1] for k, v in memory.data.items() if k.startswith("moe/")}
    assert logged[f"moe/{name}/tokens/3"] == 0 and logged[f"moe/{name}/min_over_mean"] == 0
    assert sum(logged[f"moe/{name}/tokens/{e}"] for e in range(EXPERTS)) == 2 * 4 * SEQ * 2
    assert logged["moe/max_over_mean"] >= logged[f"moe/{name}/max_over_mean"] > 1
    assert len(memory.data[f"moe/{name}/max_over_mean"]) == STEPS  # every batch

    _gradients_and_clipping_match_one_process(tiny_mixtral)
    _gradients_and_clipping_match_one_process(lambda: tiny_moe("qwen2_moe"))
    _user_hook_matches_one_process()
    _meta_init_is_the_same_under_ep()

    with pytest.raises(ValueError, match=r"expert_parallel_degree=2 does not divide the 3 "
                                         r"experts of model\.model\.layers\.0\.mlp\.experts"):
        Trainer(model=tiny_mixtral(num_experts=3), progress_bar=False, device="cpu",
                parallelism_config=EP2)
    odd = tiny_mixtral()
    with pytest.raises(ValueError, match=r"expert_parallel_degree=4 does not divide the 2 "
                                         r"data-parallel shard ranks"):
        Trainer(model=odd, progress_bar=False, device="cpu",
                parallelism_config={"fsdp": {}, "ep": {"expert_parallel_degree": 4}})
    assert not any(isinstance(p, DTensor) for p in odd.parameters())


def _gradients_and_clipping_match_one_process(build: Any) -> None:
    """One forward-backward of each rank's half batch under EP=2: every gradient (experts
    and the rest) is the whole batch's on one process; the total gradient norm and norm
    clipping too, over the two meshes (the experts' and the rest's)."""
    from cadence.algorithms.gradient_clipping import apply_gradient_clipping
    from cadence.parallel import ParallelPlan, parallelize
    from cadence.parallel.grad_norm import get_grad_norm

    model = build()
    whole = copy.deepcopy(model)
    ids = Counting().ids[:GLOBAL_BATCH]
    for rank in range(2):  # one process: the mean of the two ranks' losses
        half = {"input_ids": ids[rank::2], "labels": ids[rank::2]}
        (whole.loss(whole(half), half) / 2).backward()
    model = parallelize(model, ParallelPlan(parse_parallelism_config(EP2)))
    mine = {"input_ids": ids[dist.get_global_rank()::2], "labels": ids[dist.get_global_rank()::2]}
    model.loss(model(mine), mine).backward()
    expected = dict(whole.named_parameters())
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad.full_tensor(), expected[name].grad, atol=1e-8), name
    reference_norm = torch.nn.utils.get_total_norm([p.grad for p in whole.parameters()])
    assert torch.allclose(get_grad_norm(model.parameters()), reference_norm, rtol=1e-6)
    assert torch.allclose(apply_gradient_clipping(model, "norm", 0.05), reference_norm, rtol=1e-6)
    apply_gradient_clipping(whole, "norm", 0.05)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad.full_tensor(), expected[name].grad, atol=1e-8), name


def _meta_init_is_the_same_under_ep() -> None:
    """A Mixtral built on the meta device and initialised after sharding (its
    ``init_weights``) gets the same weights under EP=2 as under FSDP2 alone."""
    from transformers import MixtralForCausalLM

    from cadence.models import HuggingFaceModel
    from cadence.parallel import ParallelPlan, parallelize

    config = tiny_mixtral().model.config

    def built(parallelism: dict[str, Any]) -> dict[str, torch.Tensor]:
        with torch.device("meta"):
            model = HuggingFaceModel(MixtralForCausalLM(config))
        model = parallelize(model, ParallelPlan(parse_parallelism_config(parallelism), seed=0))
        return full_state(model)

    with_ep, fsdp_alone = built(EP2), built({"fsdp": {}})
    assert with_ep.keys() == fsdp_alone.keys()
    for key, value in fsdp_alone.items():
        assert torch.equal(with_ep[key], value), key


def _user_hook_matches_one_process() -> None:
    """A user's MoE block (``expert_forward`` hook) under EP=2: each rank's output and the
    gradients are the whole block's on one process."""
    from cadence.parallel import ParallelPlan, parallelize

    block = TinyMoE()
    whole = copy.deepcopy(block)
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(dist.get_global_rank()))
    block = parallelize(block, ParallelPlan(parse_parallelism_config(EP2)))
    out, ref = block(x), whole(x)
    assert torch.allclose(out, ref, atol=1e-6)
    out.square().sum().backward()
    ref.square().sum().backward()
    # the reference gradient of the whole batch: sum over ranks, mean by FSDP2's division
    grad = whole.experts.weight.grad.clone()
    torch.distributed.all_reduce(grad)
    assert torch.allclose(block.experts.weight.grad.full_tensor(), grad / 2, atol=1e-6)


@pytest.mark.slow
@pytest.mark.world_size(4)
def test_ep2_x_fsdp2_on_four_ranks(reference_4: dict[str, Any]) -> None:
    """EP=2 x FSDP2 on 4 ranks: experts split over ep=2 and FSDP2-sharded over the other 2
    (one expert per rank), the rest over all 4; the single-process losses and weights,
    plain and with expert 0 receiving no token."""
    trainer = check_against(reference_4["plain"], EP2, None, "ep2 x fsdp2")
    dims = trainer.state.parallel_dims
    assert tuple(dims.expert_mesh.shape) == (2, 2) and dims.dp_shard == 4
    gate_up = trainer.state.model.model.model.layers[0].mlp.experts.gate_up_proj
    assert tuple(gate_up.to_local().shape) == (1, 64, 16)
    starved = check_against(reference_4["starved"], EP2, 0, "ep2 x fsdp2, expert 0 starved")
    assert all(int(c[0]) == 0 for c in expert_load(starved.state.model).values())


def _write_losses(folder: str, trainer: Trainer, kind: str) -> None:
    """Rank 0 writes the run's logged losses to ``folder/run-ep2-{kind}.json``."""
    import json
    from pathlib import Path

    memory = next(d for d in trainer.logger.destinations if isinstance(d, InMemoryLogger))
    if dist.get_global_rank() == 0:
        losses = [float(v) for _, v in memory.data["loss/train/total"]]
        Path(folder, f"run-ep2-{kind}.json").write_text(json.dumps(losses))
    dist.barrier()


def _save_ep2(folder: str) -> None:
    """The EP=2 runs with their checkpoints alone (when :func:`test_ep2_on_two_ranks` did
    not run first): plain, sharded; expert 3 starved, full."""
    _, trainer = train(EP2, **_save_kwargs(folder))
    _write_losses(folder, trainer, "sharded")
    _, trainer = train(EP2, starve=3, **_save_kwargs(folder, "full"))
    _write_losses(folder, trainer, "full")


def test_ep2_sharded_checkpoint_resumes_on_one_process(checkpoints: str,
                                                       reference_2: dict[str, Any]) -> None:
    """The EP=2 run's sharded (DCP) checkpoint at step 2, every expert shard in it, resumed
    on one process: steps 3 to 5 continue the EP=2 run's loss curve; so does the starved
    run's full checkpoint (whole experts, gathered on rank 0); the final sharded checkpoint
    exported to a Hugging Face Mixtral holds one process's weights."""
    import json
    from pathlib import Path

    from tests.common.distributed import run_in_processes

    folder = Path(checkpoints)
    if not (folder / "run-ep2-full.json").exists():
        run_in_processes(2, __file__, "_save_ep2", {"folder": checkpoints}, timeout=300)
    for kind, starve in (("sharded", None), ("full", 3)):
        straight = json.loads((folder / f"run-ep2-{kind}.json").read_text())
        (step2,) = sorted((folder / f"run-ep2-{kind}").glob("*ba2*"))
        assert step2.is_dir() == (kind == "sharded")
        losses, _ = train(None, microbatch=GLOBAL_BATCH // 2, starve=starve,
                          load_path=str(step2))
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, straight[2:]))
        print(f"max relative loss diff ep2 {kind} -> 1 process: {worst:.2e}", flush=True)
        assert len(losses) == STEPS - 2 and worst <= REL_TOLERANCE, (kind, losses, straight)

    # cadence convert --to hf of the final EP=2 checkpoint: whole experts, one process's
    # weights (SGD: the same to rounding)
    from transformers import MixtralForCausalLM

    from cadence.models.hf_export import to_huggingface

    (final,) = sorted((folder / "run-ep2-sharded").glob(f"*ba{STEPS}"))
    hf = MixtralForCausalLM.from_pretrained(str(to_huggingface(final, folder / "hf")))
    expected = {k[len("model."):]: v for k, v in reference_2["plain"]["state"].items()}
    exported = hf.state_dict()
    assert exported["model.layers.0.mlp.experts.gate_up_proj"].shape == (EXPERTS, 64, 16)
    for key, value in expected.items():
        assert torch.allclose(exported[key], value, rtol=1e-4, atol=1e-6), key
