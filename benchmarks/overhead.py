"""How much time the cadence Trainer adds to a training step, on CPU.

Three arms train the same ~0.93 M-parameter GPT-2 (``cadence.models.gpt.gpt2``: 2 layers,
width 128, 4 heads, vocabulary 4,096, 64 positions) on the same pre-generated random token
batches (``[8, 64]`` ``input_ids``, ``labels`` = a copy, as the Shakespeare loader yields
them), with AdamW (lr 1e-3), from the same seed:

``raw``
    a plain PyTorch loop over the ``transformers.GPT2LMHeadModel``: ``model(**batch)``,
    ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``;
    the loss is read with ``.item()`` on step 1 and every ``--log-interval`` steps (the
    Trainer logs at the same steps).
``trainer``
    :class:`cadence.Trainer` as a run file like ``yamls/quickstart.yaml`` sets it up: the
    progress destination (``ConsoleLogger``, what ``progress_bar=True`` adds when stdout is
    not a terminal; here writing to ``os.devnull``), the ``speed_monitor`` and
    ``lr_monitor`` callbacks, and the ``file`` logger (``metrics.jsonl`` in a temporary
    folder). The quickstart's ``gradient_clipping`` algorithm is left out: it changes the
    computation, it is not overhead.
``bare``
    :class:`cadence.Trainer` with everything optional off: ``progress_bar=False``, no
    callbacks, no loggers.

Steady state: each arm keeps one model, optimizer (and Trainer) for the whole run; a
round trains ``--steps`` more steps (the Trainer by raising ``state.max_duration`` and
calling ``fit()`` again, each round a new epoch, so a round's time includes one
``FIT_START``/``EPOCH_START``/``FIT_END``). Every arm ends with bit-identical parameters
(reported), so all did the same arithmetic on the same batches in the same order.
After ``--warmup`` steps per arm, ``--rounds`` rounds are interleaved in one process, the
arm order rotating every round (raw, trainer, bare; trainer, bare, raw; ...), so load from
other processes falls on every arm alike. Reported per arm: the median wall time per step
over rounds, its spread (25th-75th percentile), the ratio to ``raw`` (the median of the
per-round ratios, each round's arms having run back to back) and the same for process CPU
time per step (which leaves out time the process waited for a core).

Startup, in fresh processes (``--startup-trials`` each, median): time to the first step
(model build + optimizer/Trainer construction + one step, after imports) and peak RSS
(``VmHWM``, see :func:`peak_rss_mb`) after ``--warmup`` steps; the ``raw`` child builds the
same model with ``transformers`` alone and never imports cadence. Import time: fresh
interpreters running ``import torch`` vs ``import torch, cadence``, and the same after
``from transformers import GPT2LMHeadModel`` (what cadence adds for a Hugging Face user),
all alternated, ``--import-trials`` each, median of the paired differences.

Hugging Face model, a fresh process per run (``--process-rounds``, default 8; 0 skips;
``--process-only`` runs just this): a 1-layer ``GPT2LMHeadModel`` (n_embd 16, vocabulary
256, seq 32, batch 16, AdamW, fp32) built before anything else, a ``DataLoader`` over a
map-style dataset of dict samples, the loss read every step. Arms ``raw`` (a plain loop,
``shuffle=False``), ``bare`` (``HuggingFaceModel`` + ``Trainer(progress_bar=False)``, the
sampler ``cadence.dist.get_sampler(ds, shuffle=False)``, a callback reading ``state.loss``
at ``BATCH_END``) and ``logging`` (the same with the Trainer's default progress output),
each once a round in a new interpreter, the order rotating; per arm the median over runs of
each run's median time between batch ends, the per-round ratio to ``raw``, and the fastest
run (:func:`process_report`). All arms end at the same loss.

Usage::

    python benchmarks/overhead.py --markdown           # defaults: 40 rounds x 30 steps
    # the Trainer's own time per step, with a model that does no compute:
    python benchmarks/overhead.py --size null --markdown --rounds 40 --steps 300 --warmup 50
    python benchmarks/overhead.py --profile trainer    # cProfile one arm, top functions
    python benchmarks/overhead.py --process-only --process-rounds 12 --markdown

Many short rounds interleave the arms finely, which cancels a machine's changing load
better than a few long ones. Time on a 2-core CPU: about 6-7 minutes with the defaults
(most of it the small model's ~65 ms steps; the import and startup trials ~2 minutes),
plus about 2 minutes for the 24 whole-process runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["main", "MODEL_SIZES", "MODEL_KWARGS", "BATCH_SIZE", "SEQ_LEN", "LR", "ARMS",
           "PROCESS_ARMS", "process_child", "process_rounds", "process_report"]

# Model, data and optimizer, shared by every arm. ``small`` is the benchmark. ``tiny``
# (~20 k parameters) and ``null`` (one 16-element parameter, loss = sum of its squares: no
# model compute at all) shrink the step so the framework's own time per step, in
# microseconds, stands out of the noise.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "small": {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 4096, "max_seq_len": 64},
    "tiny": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "max_seq_len": 64},
    "null": {"n_layer": 0, "n_head": 0, "n_embd": 16, "vocab_size": 256, "max_seq_len": 64},
}
MODEL_KWARGS = MODEL_SIZES["small"]
BATCH_SIZE = 8
SEQ_LEN = 64
LR = 1e-3
NUM_BATCHES = 16  # distinct pre-generated batches, cycled
ARMS = ("raw", "trainer", "bare")
_ARM_TITLES = {
    "raw": "raw PyTorch loop",
    "trainer": "Trainer, defaults on (console, speed_monitor, lr_monitor, file)",
    "bare": "Trainer, everything optional off",
}
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- arms
def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only settable before inter-op work started
        torch.set_num_interop_threads(threads)


def make_batches(seed: int, model_kwargs: dict[str, int] = MODEL_KWARGS,
                 num_batches: int = NUM_BATCHES) -> list[dict[str, Any]]:
    """``num_batches`` random batches ``{"input_ids": [8, 64], "labels": [8, 64]}`` (int64)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model_kwargs["vocab_size"], (num_batches, BATCH_SIZE, SEQ_LEN),
                        generator=generator)
    return [{"input_ids": ids[i].clone(), "labels": ids[i].clone()} for i in range(num_batches)]


def build_null_model(seed: int, width: int) -> Any:
    """A model with no compute: ``forward(input_ids, labels)`` returns ``loss`` = the sum of
    squares of one ``[width]`` parameter, as a ``transformers``-style output object."""
    import types

    import torch

    class NullLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(width))

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
            del input_ids, labels
            return types.SimpleNamespace(loss=self.weight.square().sum())

    torch.manual_seed(seed)
    return NullLM()


def build_hf_model_plain(seed: int, model_kwargs: dict[str, int] = MODEL_KWARGS) -> Any:
    """The ``transformers.GPT2LMHeadModel`` that ``cadence.models.gpt.gpt2(**MODEL_KWARGS)``
    wraps, built without importing cadence (for the raw arm's startup and memory figures)."""
    import torch

    if model_kwargs["n_layer"] == 0:
        return build_null_model(seed, model_kwargs["n_embd"])
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=model_kwargs["vocab_size"], n_positions=model_kwargs["max_seq_len"],
        n_embd=model_kwargs["n_embd"], n_layer=model_kwargs["n_layer"],
        n_head=model_kwargs["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, use_cache=False, attn_implementation="sdpa",
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def build_cadence_model(seed: int, model_kwargs: dict[str, int] = MODEL_KWARGS) -> Any:
    """``cadence.models.gpt.gpt2(**model_kwargs)`` (a HuggingFaceModel), seeded."""
    import torch

    from cadence.models.gpt import gpt2
    from cadence.models.huggingface import HuggingFaceModel

    if model_kwargs["n_layer"] == 0:
        return HuggingFaceModel(build_null_model(seed, model_kwargs["n_embd"]))
    torch.manual_seed(seed)
    return gpt2(**model_kwargs)


class CyclingLoader:
    """A sized dataloader that cycles over ``batches`` for ``length`` batches an epoch. Its
    iterators continue where the last one stopped, so a Trainer that starts a new epoch each
    round sees the batches in the raw loop's order (``batches[step % len(batches)]``)."""

    def __init__(self, batches: list[dict[str, Any]], length: int = 10**9) -> None:
        self.batches = batches
        self.length = length
        self.position = 0

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Any:
        for _ in range(self.length):
            batch = self.batches[self.position % len(self.batches)]
            self.position += 1
            yield batch


class RawArm:
    """The plain PyTorch loop. ``run(n)`` trains ``n`` more steps."""

    name = "raw"

    def __init__(self, hf_model: Any, batches: list[dict[str, Any]], log_interval: int) -> None:
        import torch

        self.model = hf_model
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.batches = batches
        self.log_interval = log_interval
        self.step = 0
        self.last_loss: Optional[float] = None

    def run(self, steps: int) -> None:
        model, optimizer, batches = self.model, self.optimizer, self.batches
        for _ in range(steps):
            batch = batches[self.step % len(batches)]
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self.step += 1
            if self.step == 1 or self.step % self.log_interval == 0:
                self.last_loss = loss.item()

    def close(self) -> None:
        pass


class TrainerArm:
    """A cadence Trainer kept for the whole run; ``run(n)`` raises ``max_duration`` by ``n``
    batches and calls ``fit()``.

    Each ``run`` is a new epoch: the timestamp is moved to the next epoch first (what an
    epoch's end does), so ``fit()`` does not take the stop between rounds for a mid-epoch
    resume (which would replay the consumed batches of a loader without a sampler).
    """

    def __init__(self, name: str, model: Any, batches: list[dict[str, Any]], log_interval: int,
                 folder: str, seed: int) -> None:
        import torch

        from cadence import Trainer
        from cadence.callbacks import LRMonitor, SpeedMonitor
        from cadence.loggers import ConsoleLogger, FileLogger

        self.name = name
        self._devnull = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        kwargs: dict[str, Any] = {}
        if name == "trainer":
            kwargs = {
                "callbacks": [SpeedMonitor(window_size=20), LRMonitor()],
                "loggers": [ConsoleLogger(log_interval=log_interval, stream=self._devnull),
                            FileLogger(folder=folder)],
                "progress_bar": True,
            }
        elif name == "bare":
            kwargs = {"callbacks": [], "loggers": [], "progress_bar": False}
        else:
            raise ValueError(f"unknown trainer arm {name!r}; use 'trainer' or 'bare'.")
        self.trainer = Trainer(
            model=model, train_dataloader=CyclingLoader(batches), max_duration=None,
            optimizers=optimizer,
            device="cpu", seed=seed, log_interval=f"{log_interval}ba",
            run_name=f"overhead-{name}", **kwargs,  # no save_folder: no checkpoints
        )

    @property
    def step(self) -> int:
        return int(self.trainer.state.timestamp.batch)

    def run(self, steps: int) -> None:
        from cadence import Time, TimeUnit

        state = self.trainer.state
        if state.timestamp.batch_in_epoch > 0:
            state.timestamp = state.timestamp.to_next_epoch()
        state.max_duration = Time(int(state.timestamp.batch) + steps, TimeUnit.BATCH)
        self.trainer.fit()

    def close(self) -> None:
        self.trainer.close()
        self._devnull.close()


def build_arm(name: str, seed: int, batches: list[dict[str, Any]], log_interval: int,
              folder: str, model_kwargs: dict[str, int] = MODEL_KWARGS,
              plain_raw: bool = False) -> Any:
    """A fresh arm with a fresh model (same seed, so the same initial weights)."""
    if name == "raw":
        model = (build_hf_model_plain(seed, model_kwargs) if plain_raw
                 else build_cadence_model(seed, model_kwargs).model)
        return RawArm(model, batches, log_interval)
    return TrainerArm(name, build_cadence_model(seed, model_kwargs), batches, log_interval,
                      os.path.join(folder, name), seed)


# ----------------------------------------------------------------------------- statistics
def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class ArmResult:
    """Per-round seconds per step (wall and process CPU) and the startup figures."""

    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    first_step_s: list[float] = field(default_factory=list)
    construct_s: list[float] = field(default_factory=list)
    peak_rss_mb: list[float] = field(default_factory=list)


def _loadavg() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


# ----------------------------------------------------------------------------- phases
def steady_state(args: argparse.Namespace,
                 log: Callable[[str], None]) -> tuple[dict[str, ArmResult], float]:
    """Warm up every arm, then interleave ``args.rounds`` rounds of ``args.steps`` steps.

    Returns:
        The per-arm results, and the largest parameter difference between arms at the end.
    """
    _set_threads(args.threads)
    model_kwargs = MODEL_SIZES[args.size]
    batches = make_batches(args.seed, model_kwargs)
    results = {name: ArmResult(name) for name in ARMS}
    with tempfile.TemporaryDirectory(prefix="cadence-overhead-") as folder:
        arms = {name: build_arm(name, args.seed, batches, args.log_interval, folder, model_kwargs)
                for name in ARMS}
        try:
            for name in ARMS:
                arms[name].run(args.warmup)
            for round_index in range(args.rounds):
                shift = round_index % len(ARMS)
                order = ARMS[shift:] + ARMS[:shift]
                for name in order:
                    gc.collect()
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    arms[name].run(args.steps)
                    wall1, cpu1 = time.perf_counter(), time.process_time()
                    results[name].wall.append((wall1 - wall0) / args.steps)
                    results[name].cpu.append((cpu1 - cpu0) / args.steps)
                log(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
                    f"{n} {results[n].wall[-1] * 1e3:.2f} ms" for n in ARMS))
            same = _max_param_difference(arms)
            log(f"max |parameter difference| between arms after training: {same:.3g}")
        finally:
            for arm in arms.values():
                arm.close()
    return results, same


def _parameters(arm: Any) -> list[Any]:
    if isinstance(arm, RawArm):
        return list(arm.model.parameters())
    return list(arm.trainer.state.model.model.parameters())  # the wrapped GPT2LMHeadModel


def _max_param_difference(arms: dict[str, Any]) -> float:
    """The largest elementwise difference between the raw arm's parameters and each other
    arm's (0.0: every arm did exactly the same arithmetic on the same batches)."""
    reference = _parameters(arms["raw"])
    worst = 0.0
    for name, arm in arms.items():
        for a, b in zip(reference, _parameters(arm)):
            worst = max(worst, float((a.detach() - b.detach()).abs().max()))
    return worst


def child_startup(arm_name: str, threads: int, warmup: int, seed: int, log_interval: int,
                  size: str) -> dict[str, float]:
    """In a fresh process: imports, time to the first step, then peak RSS after warmup."""
    t_start = time.perf_counter()
    import torch  # noqa: F401

    if arm_name == "raw":
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401 (lazy modules)
    else:
        import cadence  # noqa: F401
        import cadence.models.gpt  # noqa: F401
    t_imported = time.perf_counter()
    _set_threads(threads)
    model_kwargs = MODEL_SIZES[size]
    batches = make_batches(seed, model_kwargs)
    with tempfile.TemporaryDirectory(prefix="cadence-overhead-") as folder:
        t0 = time.perf_counter()
        arm = build_arm(arm_name, seed, batches, log_interval, folder, model_kwargs,
                        plain_raw=True)
        t1 = time.perf_counter()
        arm.run(1)
        t2 = time.perf_counter()
        arm.run(max(0, warmup - 1))
        peak_mb = peak_rss_mb()
        arm.close()
    return {"import_s": t_imported - t_start, "construct_s": t1 - t0, "first_step_s": t2 - t0,
            "peak_rss_mb": peak_mb}


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB.

    Linux: ``VmHWM`` from ``/proc/self/status``. ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
    is not used there because Linux carries the high-water mark of the process that forked
    across ``exec``: every child of a 560 MB parent would report at least 560 MB. Elsewhere
    ``ru_maxrss`` (KiB on Linux, bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024.0


def startup(args: argparse.Namespace, results: dict[str, ArmResult],
            log: Callable[[str], None]) -> None:
    """Run each arm's startup child ``args.startup_trials`` times, alternating arms."""
    for trial in range(args.startup_trials):
        for name in ARMS:
            command = [sys.executable, os.path.abspath(__file__), "--child", name,
                       "--threads", str(args.threads), "--warmup", str(args.warmup),
                       "--seed", str(args.seed), "--log-interval", str(args.log_interval),
                       "--size", args.size]
            out = subprocess.run(command, check=True, capture_output=True, text=True,
                                 cwd=_REPO, env=_child_env())
            record = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].first_step_s.append(record["first_step_s"])
            results[name].construct_s.append(record["construct_s"])
            results[name].peak_rss_mb.append(record["peak_rss_mb"])
        log(f"startup trial {trial + 1}/{args.startup_trials} done")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = _REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


#: Interpreter commands timed for the import figures, as (baseline, with cadence) pairs.
IMPORT_PAIRS = (
    ("import torch", "import torch, cadence"),
    ("import torch; from transformers import GPT2LMHeadModel",
     "import torch; from transformers import GPT2LMHeadModel; import cadence"),
)


def import_time(trials: int) -> Optional[list[tuple[str, str, float, float, float]]]:
    """For each pair of :data:`IMPORT_PAIRS`: the commands, the median wall seconds of each
    in fresh interpreters (all four commands alternated, ``trials`` times), and the median
    of the per-trial differences (what ``import cadence`` adds to the baseline)."""
    if trials <= 0:
        return None
    times: dict[str, list[float]] = {code: [] for pair in IMPORT_PAIRS for code in pair}
    for _ in range(trials):
        for code in times:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=_REPO, env=_child_env())
            times[code].append(time.perf_counter() - t0)
    results = []
    for base, more in IMPORT_PAIRS:
        diffs = [b - a for a, b in zip(times[base], times[more])]
        results.append((base, more, statistics.median(times[base]), statistics.median(times[more]),
                        statistics.median(diffs)))
    return results


def profile_arm(args: argparse.Namespace) -> None:
    """cProfile ``args.steps`` steps of one arm (after warmup); print the top functions."""
    import cProfile
    import pstats

    _set_threads(args.threads)
    model_kwargs = MODEL_SIZES[args.size]
    batches = make_batches(args.seed, model_kwargs)
    with tempfile.TemporaryDirectory(prefix="cadence-overhead-") as folder:
        arm = build_arm(args.profile, args.seed, batches, args.log_interval, folder, model_kwargs)
        arm.run(args.warmup)
        profiler = cProfile.Profile()
        profiler.enable()
        arm.run(args.steps)
        profiler.disable()
        arm.close()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(35)


# ----------------------------------------------------------------------------- process arms
# The whole-process setting of issue 15 (item 5): a fresh interpreter per run, a 1-layer
# GPT2LMHeadModel built before the Trainer, a DataLoader over a map-style dataset of dict
# samples (the Trainer arms with ``cadence.dist.get_sampler(ds, shuffle=False)``), and the loss
# read every step (the Trainer arms: a callback reading ``state.loss`` at BATCH_END).
PROCESS_ARMS = ("raw", "bare", "logging")
_PROCESS_TITLES = {
    "raw": "plain PyTorch loop, DataLoader(shuffle=False), loss.item() every step",
    "bare": "HuggingFaceModel + Trainer(progress_bar=False), nothing optional",
    "logging": "HuggingFaceModel + Trainer defaults (progress_bar=True: plain lines to the "
               "stdout pipe every 10 batches)",
}
PROCESS_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "max_seq_len": 32}
PROCESS_BATCH_SIZE = 16


def process_child(arm: str, threads: int, warmup: int, steps: int,
                  seed: int) -> dict[str, Any]:
    """One whole-process run of ``arm``: ``warmup + steps`` steps, one epoch.

    Returns:
        ``wall_ms`` / ``cpu_ms``: medians over the timed steps of the wall and process CPU
        time between consecutive batch ends (milliseconds); ``final_loss``: the last step's
        loss (equal in every arm: the same arithmetic).
    """
    _set_threads(threads)
    import torch

    kwargs = PROCESS_MODEL
    samples = (warmup + steps) * PROCESS_BATCH_SIZE
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, kwargs["vocab_size"], (samples, kwargs["max_seq_len"]),
                        generator=generator)

    class TokenDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return samples

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[index], "labels": ids[index]}

    dataset = TokenDataset()
    model = build_hf_model_plain(seed, kwargs)  # before the Trainer, as a user does
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    stamps: list[tuple[float, float]] = []
    losses: list[float] = []
    if arm == "raw":
        loader = torch.utils.data.DataLoader(dataset, batch_size=PROCESS_BATCH_SIZE,
                                             shuffle=False)
        model.train()
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            stamps.append((time.perf_counter(), time.process_time()))
    else:
        import cadence.dist
        from cadence import Callback, Trainer
        from cadence.models.huggingface import HuggingFaceModel

        class ReadLoss(Callback):
            def batch_end(self, state: Any, logger: Any) -> None:
                losses.append(state.loss.item())
                stamps.append((time.perf_counter(), time.process_time()))

        sampler = cadence.dist.get_sampler(dataset, shuffle=False)
        loader = torch.utils.data.DataLoader(dataset, batch_size=PROCESS_BATCH_SIZE,
                                             sampler=sampler)
        trainer = Trainer(model=HuggingFaceModel(model), train_dataloader=loader,
                          max_duration="1ep", optimizers=optimizer, callbacks=[ReadLoss()],
                          progress_bar=arm == "logging", device="cpu", seed=seed)
        trainer.fit()
        trainer.close()
    timed = stamps[warmup:] if warmup > 0 else stamps
    wall = [b[0] - a[0] for a, b in zip(timed, timed[1:])]
    cpu = [b[1] - a[1] for a, b in zip(timed, timed[1:])]
    return {"wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
            "final_loss": losses[-1], "steps": len(losses)}


def process_rounds(args: argparse.Namespace,
                   log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    """``args.process_rounds`` rounds; each round runs every arm of :data:`PROCESS_ARMS` once
    in a fresh interpreter, the arm order rotating every round."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PROCESS_ARMS}
    for round_index in range(args.process_rounds):
        shift = round_index % len(PROCESS_ARMS)
        for name in PROCESS_ARMS[shift:] + PROCESS_ARMS[:shift]:
            command = [sys.executable, os.path.abspath(__file__), "--process-child", name,
                       "--threads", str(args.threads), "--seed", str(args.seed),
                       "--process-warmup", str(args.process_warmup),
                       "--process-steps", str(args.process_steps)]
            out = subprocess.run(command, check=True, capture_output=True, text=True,
                                 cwd=_REPO, env=_child_env(), timeout=600)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        log(f"process round {round_index + 1}/{args.process_rounds}: " + ", ".join(
            f"{n} {runs[n][-1]['wall_ms']:.2f} ms" for n in PROCESS_ARMS))
    return runs


def process_report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    """The table of :func:`process_rounds`: per arm, the median over runs of each run's
    median step, its spread, and the median of the per-round ratios to ``raw``."""
    raw = runs["raw"]
    headers = ["arm", "ms/step (median)", "p25-p75", "ratio to raw", "ratio p25-p75",
               "extra us/step", "best run ms/step", "best-run ratio", "CPU ms/step",
               "CPU ratio", "final loss"]
    best_raw = min(r["wall_ms"] for r in raw)
    rows = []
    for name in PROCESS_ARMS:
        wall = [r["wall_ms"] for r in runs[name]]
        cpu = [r["cpu_ms"] for r in runs[name]]
        ratios = [w / b["wall_ms"] for w, b in zip(wall, raw)]
        cpu_ratios = [c / b["cpu_ms"] for c, b in zip(cpu, raw)]
        extra = [(w - b["wall_ms"]) * 1e3 for w, b in zip(wall, raw)]
        finals = sorted({f"{r['final_loss']:.6f}" for r in runs[name]})
        rows.append([
            name, f"{statistics.median(wall):.3f}",
            f"{_quantile(wall, .25):.2f}-{_quantile(wall, .75):.2f}",
            f"{statistics.median(ratios):.3f}",
            f"{_quantile(ratios, .25):.3f}-{_quantile(ratios, .75):.3f}",
            f"{statistics.median(extra):+.0f}", f"{min(wall):.3f}",
            f"{min(wall) / best_raw:.3f}", f"{statistics.median(cpu):.3f}",
            f"{statistics.median(cpu_ratios):.3f}", ", ".join(finals),
        ])
    model = ", ".join(f"{k}={v}" for k, v in PROCESS_MODEL.items())
    return "\n".join([
        "Hugging Face model, fresh process per run (issue 15, item 5)",
        "",
        f"- model: GPT2LMHeadModel({model}), fp32, batch {PROCESS_BATCH_SIZE}, AdamW lr {LR}, "
        f"torch.set_num_threads({args.threads})",
        f"- schedule: {args.process_rounds} rounds, each arm once a round in a fresh process "
        f"(order rotated); per run {args.process_warmup} warmup + {args.process_steps} timed "
        "steps, one epoch",
        "",
        _table(headers, rows, args.markdown),
        "",
        "arms: " + "; ".join(f"{n} = {_PROCESS_TITLES[n]}" for n in PROCESS_ARMS) + ".",
        "ms/step = median over runs of the run's median time between consecutive batch ends; "
        "ratio = median over rounds of (arm / raw in the same round); best run = the fastest "
        "run's ms/step (the least disturbed by other processes; best-run ratio = arm's best / "
        "raw's best); CPU = process CPU time (it leaves out waiting for a core, but not a "
        "core slowed by other work on the host: shared caches, a vCPU's physical core); "
        "final loss = every run's last-step loss "
        "(one value per arm and the same in every arm: identical arithmetic).",
    ])


# ----------------------------------------------------------------------------- report
def _table(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def report(args: argparse.Namespace, results: dict[str, ArmResult],
           imports: Optional[list[tuple[str, str, float, float, float]]],
           context: dict[str, str]) -> str:
    raw = results["raw"]
    headers = ["arm", "ms/step (median)", "p25-p75", "ratio to raw", "ratio p25-p75",
               "extra us/step", "CPU ms/step", "CPU ratio", "first step s", "peak RSS MB"]
    rows = []
    for name in ARMS:
        r = results[name]
        ratios = [w / b for w, b in zip(r.wall, raw.wall)]
        cpu_ratios = [c / b for c, b in zip(r.cpu, raw.cpu)]
        extra = [w - b for w, b in zip(r.wall, raw.wall)]
        first = f"{statistics.median(r.first_step_s):.2f}" if r.first_step_s else "-"
        rss = f"{statistics.median(r.peak_rss_mb):.0f}" if r.peak_rss_mb else "-"
        rows.append([
            name,
            f"{statistics.median(r.wall) * 1e3:.3f}",
            f"{_quantile(r.wall, .25) * 1e3:.2f}-{_quantile(r.wall, .75) * 1e3:.2f}",
            f"{statistics.median(ratios):.4f}",
            f"{_quantile(ratios, .25):.3f}-{_quantile(ratios, .75):.3f}",
            f"{statistics.median(extra) * 1e6:+.0f}",
            f"{statistics.median(r.cpu) * 1e3:.3f}",
            f"{statistics.median(cpu_ratios):.4f}",
            first, rss,
        ])
    lines = [
        "cadence Trainer overhead (benchmarks/overhead.py)",
        "",
        *(f"- {k}: {v}" for k, v in context.items()),
        "",
        _table(headers, rows, args.markdown),
        "",
        "arms: " + "; ".join(f"{n} = {_ARM_TITLES[n]}" for n in ARMS) + ".",
        "ratio = median over rounds of (arm's ms/step / raw's ms/step in the same round); "
        "extra us/step = median over rounds of (arm - raw) wall time per step; "
        "CPU = process CPU time (user+sys). first step = model build + optimizer/Trainer "
        "construction + one step, in a fresh process after imports (median of "
        f"{args.startup_trials}); peak RSS = VmHWM after {args.warmup} steps in that process "
        "(raw never imports cadence).",
    ]
    if imports is not None:
        lines.append(f"import time (fresh interpreters, wall seconds, median of "
                     f"{args.import_trials}; 'adds' = median of paired differences):")
        for base, more, t_base, t_more, diff in imports:
            lines.append(f"- `{base}` {t_base:.2f} s; `{more}` {t_more:.2f} s: "
                         f"cadence adds {diff:.2f} s")
    return "\n".join(lines)


def _context(args: argparse.Namespace, argv: list[str], load_before: str, load_after: str,
             cpu_share: Optional[float], param_diff: float) -> dict[str, str]:
    import torch

    model_kwargs = MODEL_SIZES[args.size]
    n_params = sum(p.numel() for p in build_cadence_model(args.seed, model_kwargs).parameters())
    context = {
        "command": "python " + " ".join([os.path.relpath(os.path.abspath(__file__), _REPO)]
                                        + argv),
        "model": (f"gpt2({', '.join(f'{k}={v}' for k, v in model_kwargs.items())}), "
                  f"{n_params / 1e6:.2f} M parameters, fp32, sdpa attention")
        if model_kwargs["n_layer"] else
        f"null model ({n_params} parameters; loss = their sum of squares; no model compute)",
        "data": f"{NUM_BATCHES} random batches [{BATCH_SIZE}, {SEQ_LEN}] (input_ids, labels), "
                f"cycled; AdamW lr {LR}",
        "schedule": f"{args.warmup} warmup steps per arm, then {args.rounds} rounds x "
                    f"{args.steps} steps, arm order rotated each round; loss read every "
                    f"{args.log_interval} steps",
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"torch.set_num_threads({args.threads})",
        "load average (1/5/15 min) before / after": f"{load_before} | {load_after}",
    }
    context["same arithmetic"] = (f"largest |parameter difference| between arms after "
                                  f"training: {param_diff:.3g} (0 = identical updates)")
    if cpu_share is not None:
        context["CPU share"] = (f"{cpu_share:.2f} (process CPU time / wall time in the timed "
                                f"rounds; {args.threads}.00 would mean never waiting for a "
                                f"core)")
    return context


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds (default 40)")
    parser.add_argument("--steps", type=int, default=30, help="steps per arm per round (30)")
    parser.add_argument("--warmup", type=int, default=20, help="warmup steps per arm (20)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    parser.add_argument("--log-interval", type=int, default=10,
                        help="read/log the loss every N steps, as the Trainer's log_interval (10)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--size", choices=sorted(MODEL_SIZES), default="small",
                        help="small: the ~0.93 M-parameter benchmark model (default); tiny: "
                             "~20 k parameters, to read the overhead in microseconds")
    parser.add_argument("--startup-trials", type=int, default=3,
                        help="fresh processes per arm for first-step time and RSS (3; 0 skips)")
    parser.add_argument("--import-trials", type=int, default=5,
                        help="fresh interpreters per import command (5; 0 skips)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    parser.add_argument("--profile", choices=ARMS, default=None,
                        help="cProfile --steps steps of one arm instead of benchmarking")
    parser.add_argument("--process-rounds", type=int, default=8,
                        help="rounds of the Hugging Face whole-process arms (8; 0 skips)")
    parser.add_argument("--process-steps", type=int, default=60,
                        help="timed steps per whole-process run (60)")
    parser.add_argument("--process-warmup", type=int, default=20,
                        help="untimed steps at the start of each whole-process run (20)")
    parser.add_argument("--process-only", action="store_true",
                        help="run only the whole-process arms")
    parser.add_argument("--child", choices=ARMS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--process-child", choices=PROCESS_ARMS, default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "threads", "log_interval", "process_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("warmup", "startup_trials", "import_trials", "process_rounds",
                 "process_warmup"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be at least 0")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.process_child is not None:
        print(json.dumps(process_child(args.process_child, args.threads, args.process_warmup,
                                       args.process_steps, args.seed)))
        return 0
    if args.child is not None:
        print(json.dumps(child_startup(args.child, args.threads, args.warmup, args.seed,
                                       args.log_interval, args.size)))
        return 0
    if _REPO not in sys.path:
        sys.path.insert(0, _REPO)
    if args.profile is not None:
        profile_arm(args)
        return 0

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    if args.process_only:
        load_before = _loadavg()
        runs = process_rounds(args, log)
        print(process_report(args, runs))
        print(f"\nload average (1/5/15 min) before / after: {load_before} | {_loadavg()}")
        return 0
    load_before = _loadavg()
    imports = import_time(args.import_trials)
    results, param_diff = steady_state(args, log)
    cpu_share = (sum(sum(r.cpu) for r in results.values())
                 / sum(sum(r.wall) for r in results.values()))
    startup(args, results, log)
    runs = process_rounds(args, log) if args.process_rounds else None
    load_after = _loadavg()
    print(report(args, results, imports, _context(args, argv, load_before, load_after, cpu_share,
                                                       param_diff)))
    if runs is not None:
        print("\n" + process_report(args, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
