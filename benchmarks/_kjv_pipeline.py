"""The KJV pipeline of ``benchmarks/peft_methods.py``: pretrain the quickstart GPT on Shakespeare,
export it, LoRA-fine-tune it on King James verse pairs, export the adapter and the merged
model, and measure what changed.

Every step is the README's command (``cadence train``/``cadence convert`` in a subprocess, in
``--kjv-dir``); a step whose output is already there is not run again, so an interrupted run
resumes. Then, in this process:

* **held-out perplexity**: ``exp`` of the summed next-token cross-entropy over the response
  tokens of the validation pairs (the last 5 % of each book's pairs, never trained on) divided
  by their number, for the Shakespeare GPT (before) and the merged export (after); the packed
  rows' ``position_ids`` keep records apart, as in training;
* **greedy samples** for the run file's three ``Generate`` prompts, before and after.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS_FROM = ROOT / "yamls/lora_kjv.yaml"


def _cadence(args: list[str], cwd: Path, log: Path) -> float:
    """Run ``cadence ARGS`` in ``cwd`` (output to ``log``); its wall seconds."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-c", "from cadence.cli import run; run()",
                               *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              check=False)
    if done.returncode != 0:
        raise SystemExit(f"cadence {' '.join(args)} failed ({done.returncode}); see {log}")
    return time.perf_counter() - start


def run_steps(args: argparse.Namespace) -> dict[str, float]:
    """The README's five commands, skipping finished ones; wall seconds of those run."""
    work = args.kjv_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    pretrain_ckpt = work / "runs/quickstart/latest-rank0.pt"
    lora_ckpt = work / "runs/lora_kjv/latest-rank0.pt"
    steps = [
        ("pretrain", pretrain_ckpt,
         ["train", str(ROOT / "yamls/quickstart.yaml"), "save_folder=runs/quickstart",
          f"save_interval={args.kjv_pretrain_batches}ba",
          f"max_duration={args.kjv_pretrain_batches}ba"]),
        ("export base", work / "runs/shakespeare-gpt/config.json",
         ["convert", str(pretrain_ckpt), "--to", "hf", "runs/shakespeare-gpt"]),
        ("lora", lora_ckpt,
         ["train", str(PROMPTS_FROM), f"max_duration={args.kjv_lora_batches}ba",
          f"save_interval={args.kjv_lora_batches}ba"]),
        ("export adapter", work / "runs/kjv-adapter/adapter_config.json",
         ["convert", str(lora_ckpt), "--to", "hf", "runs/kjv-adapter"]),
        ("export merged", work / "runs/kjv-merged/config.json",
         ["convert", str(lora_ckpt), "--to", "hf", "runs/kjv-merged", "--merge"]),
    ]
    seconds: dict[str, float] = {}
    for name, output, command in steps:
        if output.exists():
            print(f"kjv: {name}: done already ({output})", flush=True)
            continue
        print(f"kjv: {name}: cadence {' '.join(command)}", flush=True)
        seconds[name] = _cadence(command, work, work / f"{name.replace(' ', '_')}.log")
        print(f"kjv: {name}: {seconds[name]:.0f} s", flush=True)
    return seconds


def held_out_perplexity(model_dir: Path, tokenizer_dir: Path, num_val: int) -> tuple[float, int]:
    """Perplexity of the response tokens of the validation pairs, and how many tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from cadence.data.kjv_pairs import kjv_instruction_dataloader

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    loader = kjv_instruction_dataloader(str(tokenizer_dir), split="val", max_seq_len=128,
                                        batch_size=32, max_records=num_val)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            logits = model(input_ids=batch["input_ids"],
                           position_ids=batch["position_ids"]).logits  # [batch, seq, vocab]
            labels = batch["labels"][:, 1:]  # token t predicts t + 1
            total += float(torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                reduction="sum"))
            tokens += int((labels != -100).sum())
    return math.exp(total / tokens), tokens


def greedy_samples(model_dir: Path, prompts: list[str], new_tokens: int) -> list[str]:
    """Greedy continuations of ``prompts`` (text after the prompt)."""
    import torch
    from transformers import AutoModelForCausalLM

    from cadence.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(str(model_dir))
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
                else tokenizer.eos_token_id
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new_tokens, pad_token_id=pad)
            out.append(tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
    return out


def _prompts() -> list[str]:
    import yaml

    return list(yaml.safe_load(PROMPTS_FROM.read_text())["callbacks"]["generate"]["prompts"])


def _size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def report(args: argparse.Namespace, seconds: dict[str, float]) -> str:
    """The perplexity table, sizes and samples, as Markdown."""
    work = args.kjv_dir.resolve()
    base, merged = work / "runs/shakespeare-gpt", work / "runs/kjv-merged"
    before, tokens = held_out_perplexity(base, base, args.kjv_num_val)
    after, _ = held_out_perplexity(merged, base, args.kjv_num_val)
    lines = [f"KJV pipeline: pretrain {args.kjv_pretrain_batches} batches, LoRA "
             f"{args.kjv_lora_batches} batches; held-out pairs: {args.kjv_num_val} read, "
             f"{tokens} response tokens scored", "",
             "| model | held-out KJV perplexity |", "|---|---:|",
             f"| Shakespeare GPT (before) | {before:.1f} |",
             f"| merged LoRA (after) | {after:.1f} |", ""]
    if seconds:
        lines += ["| step | wall s |", "|---|---:|"]
        lines += [f"| {name} | {s:.0f} |" for name, s in seconds.items()] + [""]
    checkpoint = (work / "runs/lora_kjv/latest-rank0.pt").resolve()
    lines += [f"adapter-only checkpoint {checkpoint.stat().st_size / 2**20:.2f} MiB; adapter "
              f"folder {_size_mib(work / 'runs/kjv-adapter'):.2f} MiB; merged model folder "
              f"{_size_mib(merged):.2f} MiB", ""]
    prompts = _prompts()
    samples = zip(prompts, greedy_samples(base, prompts, args.kjv_new_tokens),
                  greedy_samples(merged, prompts, args.kjv_new_tokens))
    lines += [f"Greedy samples ({args.kjv_new_tokens} new tokens):", "",
              "| prompt | before | after |", "|---|---|---|"]
    for prompt, old, new in samples:
        cells = [text.strip().replace("\n", "\\n").replace("|", "\\|")
                 for text in (prompt, old, new)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kjv-dir", type=Path, default=Path("runs/bench-kjv"),
                        help="work folder of the pipeline (finished steps are reused)")
    parser.add_argument("--kjv-pretrain-batches", type=int, default=360)
    parser.add_argument("--kjv-lora-batches", type=int, default=300)
    parser.add_argument("--kjv-num-val", type=int, default=500, help="held-out pairs read")
    parser.add_argument("--kjv-new-tokens", type=int, default=40)


def main(args: argparse.Namespace) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return report(args, run_steps(args))
