"""Nothing whole on any device, and init on the meta device after sharding (issue 22,
items 1 and 2), on 1, 2 and 4 gloo ranks with FSDP, TP and FSDP x TP.

Item 1 on CPU. The run's device is the CPU here, so a move "to the device" costs nothing
and no allocation shows it. What makes the check meaningful is recording every request
to put a tensor or module on the run's device, whatever device that is: every
``Module.to/to_empty/cuda`` and ``Tensor.to`` with a device (the bytes of that module or
tensor, local shards for DTensors), every tensor allocated on a non-meta device (a
``TorchDispatchMode``: the bytes of each new storage), and, at each sharding call
(``fully_shard``, ``parallelize_module``), each parameter's device and size. The
Trainer's old ``module.to(state.device)`` of the whole model is one such request, as large
as the model, and fails the bound: no single materialisation may exceed this rank's
shard (its local bytes after sharding) plus the largest tensor.

Item 2: every rank builds ``gpt2(init_device="meta")``; after sharding, each layout's
gathered full state dict is ``torch.equal`` to a one-process build with the same seed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.parallel.config import parse_parallelism_config
from cadence.models.gpt import gpt2
from cadence.parallel import param_init
from cadence.parallel.param_init import materialize_and_init
from cadence.parallel.plan import ParallelPlan, parallelize
from tests.parallel.test_fsdp_parity import parity_tokens

SEED = 1234
VOCAB, SEQ = 64, 16
FSDP: dict[str, Any] = {"fsdp": {}}
TP2: dict[str, Any] = {"tp": {"tensor_parallel_degree": 2}}
FSDP_X_TP: dict[str, Any] = {"fsdp": {}, "tp": {"tensor_parallel_degree": 2}}
RANK0: dict[str, Any] = {"fsdp": {"cpu_ram_efficient_loading": True}}
LAYOUTS: dict[int, list[dict[str, Any]]] = {1: [FSDP], 2: [FSDP, TP2, RANK0],
                                            4: [FSDP, FSDP_X_TP]}


def tiny(init_device: Optional[str] = None) -> Any:
    """A 2-layer GPT-2 of width 32 (26,368 parameters, 103 KiB in fp32)."""
    torch.manual_seed(0)
    return gpt2(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ,
                init_device=init_device)


def _nbytes(tensor: torch.Tensor) -> int:
    local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
    return 0 if local.is_meta else local.numel() * local.element_size()


def _unique(module: nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[torch.device]:
    """The target device of a ``to(...)`` call, or None (a dtype-only call)."""
    try:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
    except (TypeError, RuntimeError):
        return None
    return None if device is None or device.type == "meta" else device


class Record:
    """What one rank put on a device while the recorder was on (a plain class: the
    distributed harness imports this file without registering it, which dataclasses need)."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, int]] = []  # (what, bytes)
        self.allocations: list[tuple[str, int]] = []  # (op, storage bytes)
        self.shard_calls: list[tuple[str, list[tuple[str, str, int, bool]]]] = []

    @property
    def largest_move(self) -> tuple[str, int]:
        return max(self.moves, key=lambda m: m[1], default=("-", 0))

    @property
    def largest_allocation(self) -> tuple[str, int]:
        return max(self.allocations, key=lambda m: m[1], default=("-", 0))


class _Allocations(TorchDispatchMode):
    """Every new storage an op returns on a non-meta device (views and in-place results
    share an input's storage and do not count)."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr()
                  for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) and not t.is_meta}
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, DTensor):
                t = t._local_tensor
            if isinstance(t, torch.Tensor) and not t.is_meta \
                    and t.untyped_storage().data_ptr() not in inputs:
                self.record.allocations.append((str(func), t.untyped_storage().nbytes()))
        return out


@contextlib.contextmanager
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[Record]:
    """Record moves to a device, allocations, and the parameters at each sharding call."""
    import cadence.parallel.fsdp as fsdp_module
    import cadence.parallel.tp as tp_module

    record = Record()
    module_to, module_to_empty, tensor_to = nn.Module.to, nn.Module.to_empty, torch.Tensor.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _device_of(args, kwargs) is not None:
            record.moves.append((f"{type(self).__name__}.to",
                                 sum(_nbytes(t) for t in _unique(self))))
        return module_to(self, *args, **kwargs)

    def to_empty(self: nn.Module, *, device: Any, recurse: bool = True) -> Any:
        if torch.device(device).type != "meta":
            record.moves.append((f"{type(self).__name__}.to_empty",
                                 sum(t.numel() * t.element_size() if not isinstance(t, DTensor)
                                     else t._local_tensor.numel() * t.element_size()
                                     for t in _unique(self))))
        return module_to_empty(self, device=device, recurse=recurse)

    def cuda(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        record.moves.append((f"{type(self).__name__}.cuda", sum(_nbytes(t) for t in _unique(self))))
        return module_to(self, "cuda")

    def tensor_to_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _device_of(args, kwargs) is not None and not self.is_meta:
            record.moves.append(("Tensor.to", _nbytes(self)))
        return tensor_to(self, *args, **kwargs)

    def watch(name: str, fn: Any) -> Any:
        def sharding_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            params = [(n, str(p.device) if not isinstance(p, DTensor)
                       else f"dtensor:{p._local_tensor.device}", p.numel(),
                       isinstance(p, DTensor)) for n, p in module.named_parameters()]
            record.shard_calls.append((name, params))
            return fn(module, *args, **kwargs)
        return sharding_call

    monkeypatch.setattr(nn.Module, "to", to)
    monkeypatch.setattr(nn.Module, "to_empty", to_empty)
    monkeypatch.setattr(nn.Module, "cuda", cuda)
    monkeypatch.setattr(torch.Tensor, "to", tensor_to_)
    monkeypatch.setattr(fsdp_module, "fully_shard", watch("fully_shard", fsdp_module.fully_shard))
    monkeypatch.setattr(tp_module, "parallelize_module",
                        watch("parallelize_module", tp_module.parallelize_module))
    try:
        with _Allocations(record):
            yield record
    finally:
        monkeypatch.undo()


def _bound(model: nn.Module) -> tuple[int, int]:
    """(this rank's shard: local bytes of every parameter and buffer, the largest tensor's
    full bytes)."""
    tensors = _unique(model)
    return (sum(_nbytes(t) for t in tensors),
            max(t.numel() * t.element_size() for t in tensors))


def _check(record: Record, model: nn.Module, label: str) -> str:
    shard, largest = _bound(model)
    for name, params in record.shard_calls:  # unsharded parameters still on the CPU / meta
        for pname, device, numel, is_dtensor in params:
            assert is_dtensor or device in ("cpu", "meta"), (label, name, pname, device)
    what, moved = record.largest_move
    op, allocated = record.largest_allocation
    assert moved <= shard + largest, (f"{label}: {what} put {moved} bytes on the device at "
                                      f"once; bound {shard} + {largest}")
    assert allocated <= shard + largest, (f"{label}: {op} allocated {allocated} bytes at once; "
                                          f"bound {shard} + {largest}")
    assert record.shard_calls, label
    return (f"{label}: rank {dist.get_global_rank()} shard {shard} B, largest tensor "
            f"{largest} B; largest move {moved} B ({what}), largest allocation {allocated} B")


def _full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full (gathered) state dict; a collective on sharded models."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def _name(layout: dict[str, Any]) -> str:
    parts = [k for k in layout]
    if layout.get("fsdp", {}).get("cpu_ram_efficient_loading"):
        parts = ["fsdp(rank0)"]
    return " x ".join(parts)


def _trainer(model: Any, layout: dict[str, Any]) -> Trainer:
    dataset = parity_tokens()
    tp = layout.get("tp", {}).get("tensor_parallel_degree", 1)
    loader = DataLoader(dataset, batch_size=2, sampler=dist.get_sampler(dataset, shuffle=False)
                        if dist.get_world_size() > tp else None)
    return Trainer(model=model, train_dataloader=loader, max_duration="1ba", seed=SEED,
                   parallelism_config=layout, device="cpu", progress_bar=False)


def run_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 1 through the Trainer (a CPU model) and item 2 (a meta model), every layout of
    this world size."""
    import logging

    # gathering an FSDP x TP parameter warns that it takes two all-gathers: expected here
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    reference = tiny("meta")
    materialize_and_init(reference, "cpu", seed=SEED)  # the one-process build
    expected = reference.state_dict()
    lines = []
    for layout in LAYOUTS[dist.get_world_size()]:
        label = _name(layout)
        model = tiny("meta" if layout is RANK0 and dist.get_global_rank() != 0 else None)
        with recording(monkeypatch) as record:
            trainer = _trainer(model, layout)
        lines.append(_check(record, trainer.state.model, f"{label}, CPU model"))
        trainer.close()

        meta = tiny("meta")
        if layout is RANK0:  # rank 0 holds weights, on the CPU: the reference's
            meta = tiny("meta" if dist.get_global_rank() else None)
            if dist.get_global_rank() == 0:
                meta.load_state_dict(expected)
        with recording(monkeypatch) as record:
            sharded = parallelize(meta, ParallelPlan(parse_parallelism_config(layout),
                                                     seed=SEED))
        lines.append(_check(record, sharded, f"{label}, meta model"))
        full = _full_state(sharded)
        assert full.keys() == expected.keys()
        different = [k for k in expected if not torch.equal(full[k], expected[k])]
        assert not different, f"{label}: {different}"
    if dist.get_global_rank() in (0, dist.get_world_size() - 1):
        print("\n".join(lines), flush=True)


def test_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    run_layouts(monkeypatch)


@pytest.mark.world_size(2)
def test_two_ranks() -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_layouts(monkeypatch)


@pytest.mark.world_size(4)
def test_four_ranks() -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_layouts(monkeypatch)


def test_the_old_whole_model_move_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not vacuous on CPU: moving the unsharded model to the run's device
    before sharding (what the Trainer did) is recorded at the model's full size."""
    model = tiny()
    with recording(monkeypatch) as record:
        model.to(torch.device("cpu"))
    whole = sum(_nbytes(t) for t in _unique(model))
    assert record.largest_move == ("HuggingFaceModel.to", whole)
    # on 2 FSDP ranks the bound would be about half of that plus the largest tensor
    assert whole > whole // 2 + max(t.numel() * 4 for t in model.parameters())


def test_meta_init_is_gpt2s_normal_init() -> None:
    """``gpt2(init_device="meta")`` materialised and initialised gives transformers' own
    GPT-2 init, and ``param_init_fn`` per module (children first) gives the same."""
    model = tiny("meta")
    assert all(p.is_meta for p in model.parameters())
    materialize_and_init(model, "cpu", seed=SEED)
    inner = model.model
    assert inner.lm_head.weight is inner.transformer.wte.weight  # still tied
    # the same as transformers' _init_weights applied to a normally built model
    normal = tiny().model
    torch.manual_seed(SEED)
    with torch.no_grad():
        normal.apply(normal._init_weights)
    for name, tensor in normal.state_dict().items():
        assert torch.equal(tensor, inner.state_dict()[name]), name
    # Composer's per-module hook: the same weights
    by_module = tiny("meta")
    by_module.to_empty(device="cpu")
    by_module.model.lm_head.weight = by_module.model.transformer.wte.weight
    torch.manual_seed(SEED)
    with torch.no_grad():
        for module in _post_order(by_module):
            by_module.param_init_fn(module)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, by_module.state_dict()[name]), name
    std = 0.02 / (2 * 2) ** 0.5  # GPT-2's scaled residual projections
    assert abs(float(inner.transformer.h[0].mlp.c_proj.weight.detach().std()) - std) < 0.3 * std


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def test_meta_init_trains_in_one_process() -> None:
    """A meta model through the Trainer, unsharded (moved whole) and with FSDP on one rank."""
    for layout in (None, FSDP):
        trainer = _trainer(tiny("meta"), layout or {})
        assert not any(p.is_meta for p in trainer.state.model.parameters())
        trainer.fit()
        trainer.close()


def test_a_meta_model_without_an_init_hook_is_refused() -> None:
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

    with torch.device("meta"):
        model = Plain()
    with pytest.raises(ValueError, match="neither init_weights\\(\\) nor param_init_fn"):
        parallelize(model, ParallelPlan(parse_parallelism_config(FSDP)))
    with pytest.raises(ValueError, match="cpu_ram_efficient_loading"):
        param_init.materialize_and_init(model, "cpu")


def test_a_users_meta_model_with_param_init_fn() -> None:
    """A plain model built under ``torch.device('meta')`` with Composer's ``param_init_fn``:
    the same weights as the same init run in one process on the CPU."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)
            self.register_buffer("scale", torch.ones(4))

        def param_init_fn(self, module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                module.reset_parameters()
            if module is self:
                self.scale.fill_(2.0)

    with torch.device("meta"):
        model = Net()
    sharded = parallelize(model, ParallelPlan(parse_parallelism_config(FSDP), seed=SEED))
    reference = Net()
    torch.manual_seed(SEED)
    with torch.no_grad():
        for module in _post_order(reference):
            reference.param_init_fn(module)
    full = _full_state(sharded)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(full[name], tensor), name
