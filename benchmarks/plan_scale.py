"""How fast ``cadence plan`` is at scale: Llama-3.1-shaped 8B, 70B and 405B models planned
on FSDP2 x TP = 8 meshes, printing the planning time and the host memory (peak RSS of the
planning process and its forked rank simulations) and the CPU seconds (wall seconds on a
shared machine say more about the neighbours). Nothing is materialised: the models are
built on the meta device and the step runs on fake tensors.

    python benchmarks/plan_scale.py [--shapes 8b,70b,405b] [--world-size 512]
    python benchmarks/plan_scale.py --shapes llama2-70b --world-size 8 --tp 1 \
        --gpu a100-80gb [--cpu-offload]
    python benchmarks/plan_scale.py --shapes 70b --world-size 256 --local-batch 16  # torchtitan
    python benchmarks/plan_scale.py --shapes mpt-7b --world-size 8 --tp 1 --local-batch 6 \
        --no-activation-checkpointing  # llm-foundry's MPT-7B row

Shapes: Llama 3.1 (Meta's model cards / ``config.json``): 8B d=4096 L=32 H=32 KV=8
ffn=14336; 70B d=8192 L=80 H=64 KV=8 ffn=28672; 405B d=16384 L=126 H=128 KV=8 ffn=53248;
vocabulary 128,256; sequence 8,192; bf16 (``amp_bf16``), AdamW, activation checkpointing,
one sample per data-parallel rank. ``mpt-7b``: MPT-7B's shape (d=4096 L=32 H=32, a 4 d GELU
MLP, vocabulary 50,432, sequence 2,048, tied embeddings: Mosaic's model card) as a GPT-2
(cadence has no MPT builder; GPT-2's learned position embedding stands in for ALiBi: 8.4 M
parameters more, a look-up that adds no FLOPs).
"""

from __future__ import annotations

import argparse
import resource
import time

SHAPES = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               intermediate_size=14336),
    "70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                intermediate_size=28672),
    "405b": dict(hidden_size=16384, num_hidden_layers=126, num_attention_heads=128,
                 intermediate_size=53248),
    # a toy shape for the smoke test (tests/benchmarks/test_plan_scale_smoke.py)
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                 intermediate_size=128, vocab_size=256, max_position_embeddings=64),
    # Llama 2 70B (Touvron et al. 2023): vocabulary 32,000, sequence 4,096
    "mpt-7b": dict(n_layer=32, n_head=32, n_embd=4096, vocab_size=50432, max_seq_len=2048),
    "llama2-70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                       intermediate_size=28672, vocab_size=32000,
                       max_position_embeddings=4096),
}


def llama(shape: str):  # noqa: ANN201 - a HuggingFaceModel on the meta device
    import torch

    if shape == "mpt-7b":
        from cadence.models.gpt import gpt2

        return gpt2(**SHAPES[shape], init_device="meta")
    from transformers import LlamaConfig, LlamaForCausalLM

    from cadence.models.huggingface import HuggingFaceModel

    shape_args = {"vocab_size": 128256, "max_position_embeddings": 8192, **SHAPES[shape]}
    config = LlamaConfig(num_key_value_heads=8, rope_theta=500000.0, tie_word_embeddings=False,
                         **shape_args)
    with torch.device("meta"):
        return HuggingFaceModel(LlamaForCausalLM(config), use_logits=True)


def plan_shape(shape: str, world_size: int, tp: int, gpu: str, local_batch: int = 1,
               memory_gib: float | None = None, cpu_offload: bool = False,
               activation_checkpointing: bool = True, pp: int = 1,
               schedule: str = "1F1B"):  # noqa: ANN201
    from cadence.config.load import load_config
    from cadence.planning.devices import get_device
    from cadence.planning.planner import plan_config

    pipeline = ({"pp": {"pipeline_parallel_degree": pp, "schedule": schedule,
                        "microbatch_size": 1}} if pp > 1 else {})
    run = {"max_duration": "1ba",
           "global_train_batch_size": local_batch * world_size // (tp * pp),
           "precision": "amp_bf16", "model": {"name": "gpt2"},
           "train_loader": {"name": "shakespeare"},
           "optimizer": {"name": "adamw", "lr": 1e-4},
           "parallelism_config": {"fsdp": {"activation_checkpointing": activation_checkpointing,
                                           "cpu_offload": cpu_offload},
                                  **({"tp": {"tensor_parallel_degree": tp}} if tp > 1
                                     else {}), **pipeline}}
    cfg = load_config(run, world_size=world_size)
    return plan_config(cfg, world_size=world_size, nnodes=max(world_size // 8, 1),
                       device=get_device(gpu, memory_gib=memory_gib),
                       ranks=[0, world_size - 1] if pp > 1 else [0],
                       seq_len=int(SHAPES[shape].get("max_position_embeddings",
                                                     SHAPES[shape].get("max_seq_len", 8192))),
                       build_model=lambda: llama(shape))


def _cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (the forked simulations):
    the planning time on an idle machine, whatever else shares the cores."""
    own, children = (resource.getrusage(resource.RUSAGE_SELF),
                     resource.getrusage(resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8b,70b,405b")
    parser.add_argument("--world-size", type=int, default=512)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--local-batch", type=int, default=1,
                        help="samples per data-parallel rank (default 1)")
    parser.add_argument("--cpu-offload", action="store_true",
                        help="FSDP2's CPU offload of the sharded state")
    parser.add_argument("--pp", type=int, default=1,
                        help="pipeline-parallel degree (microbatches of 1 sample; the first "
                             "and the last rank simulated)")
    parser.add_argument("--schedule", default="1F1B", help="the pipeline schedule")
    parser.add_argument("--no-activation-checkpointing", action="store_true",
                        help="train without activation checkpointing")
    parser.add_argument("--memory-gib", type=float, default=None,
                        help="device memory, GiB (default: the --gpu's)")
    args = parser.parse_args(argv)
    from cadence.planning.report import format_bytes

    print(f"{'shape':<6} {'ranks':>6} {'seconds':>8} {'cpu s':>6} {'host MiB':>9} "
          f"{'peak/rank':>11} "
          f"{'step s':>7} {'tok/s/dev':>9} {'MFU':>6}")
    for shape in args.shapes.split(","):
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        plan = plan_shape(shape, args.world_size, args.tp, args.gpu, args.local_batch,
                          args.memory_gib, args.cpu_offload,
                          not args.no_activation_checkpointing, args.pp, args.schedule)
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
        rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
        e = plan.estimate
        print(f"{shape:<6} {args.world_size:>6} {seconds:>8.1f} {cpu:>6.1f} {rss:>9.0f} "
              f"{format_bytes(plan.peak_bytes):>11} {e.step_seconds:>7.2f} "
              f"{e.tokens_per_second_per_device:>9,.0f} {e.mfu:>6.1%} "
              f"{'fits' if plan.fits else 'does not fit'}", flush=True)


if __name__ == "__main__":
    main()
