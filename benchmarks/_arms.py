"""The model, data and arms that ``overhead.py`` (time per step) and ``first_step.py``
(time to the first step, peak RSS) train: a plain PyTorch loop and two cadence Trainers over
the same GPT-2, batches, optimizer and seed.

Not a benchmark itself (the leading underscore). Arms:

``raw``
    a plain PyTorch loop over the ``transformers.GPT2LMHeadModel``: ``model(**batch)``,
    ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``;
    the loss is read with ``.item()`` on step 1 and every ``log_interval`` steps (the
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
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Optional

__all__ = ["MODEL_SIZES", "MODEL_KWARGS", "BATCH_SIZE", "SEQ_LEN", "LR", "NUM_BATCHES", "ARMS",
           "ARM_TITLES", "set_threads", "make_batches", "build_null_model", "build_mlp_model",
           "build_hf_model_plain", "build_cadence_model", "CyclingLoader", "RawArm",
           "TrainerArm", "build_arm", "model_description"]


# Model, data and optimizer, shared by every arm. ``small`` is the benchmark. ``tiny``
# (~20 k parameters), ``mlp`` (a two-layer MLP over the token ids as 64 features, ~17 k
# parameters, a step of ~0.4 ms) and ``null`` (one 16-element parameter, loss = sum of its
# squares: no model compute at all) shrink the step so the framework's own time per step,
# in microseconds, stands out of the noise.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "small": {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 4096, "max_seq_len": 64},
    "tiny": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "max_seq_len": 64},
    "null": {"n_layer": 0, "n_head": 0, "n_embd": 16, "vocab_size": 256, "max_seq_len": 64},
    "mlp": {"n_layer": -1, "n_head": 0, "n_embd": 128, "vocab_size": 256, "max_seq_len": 64},
}
MODEL_KWARGS = MODEL_SIZES["small"]
BATCH_SIZE = 8
SEQ_LEN = 64
LR = 1e-3
NUM_BATCHES = 16  # distinct pre-generated batches, cycled
ARMS = ("raw", "trainer", "bare")
ARM_TITLES = {
    "raw": "raw PyTorch loop",
    "trainer": "Trainer, defaults on (console, speed_monitor, lr_monitor, file)",
    "bare": "Trainer, everything optional off",
}


# ----------------------------------------------------------------------------- arms
def set_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` (and the inter-op threads, where still settable)."""
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


def build_mlp_model(seed: int, width: int, vocab_size: int) -> Any:
    """A tiny MLP: ``forward(input_ids, labels)`` reads the ``[batch, seq]`` token ids as
    ``seq`` features in [0, 1), ``Linear(seq, width)``, ReLU, ``Linear(width, seq)``, and
    returns ``loss`` = the mean squared error against the labels read the same way, as a
    ``transformers``-style output object."""
    import types

    import torch

    class TinyMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(SEQ_LEN, width), torch.nn.ReLU(),
                                           torch.nn.Linear(width, SEQ_LEN))

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
            out = self.net(input_ids.float() / vocab_size)
            target = labels.float() / vocab_size
            return types.SimpleNamespace(loss=torch.nn.functional.mse_loss(out, target))

    torch.manual_seed(seed)
    return TinyMLP()


def _build_small_model(seed: int, model_kwargs: dict[str, int]) -> Any:
    """The null model or the MLP for those sizes; None for a GPT-2 size."""
    if model_kwargs["n_layer"] == 0:
        return build_null_model(seed, model_kwargs["n_embd"])
    if model_kwargs["n_layer"] < 0:
        return build_mlp_model(seed, model_kwargs["n_embd"], model_kwargs["vocab_size"])
    return None


def build_hf_model_plain(seed: int, model_kwargs: dict[str, int] = MODEL_KWARGS) -> Any:
    """The ``transformers.GPT2LMHeadModel`` that ``cadence.models.gpt.gpt2(**MODEL_KWARGS)``
    wraps, built without importing cadence (for the raw arm's startup and memory figures)."""
    import torch

    if model_kwargs["n_layer"] <= 0:
        return _build_small_model(seed, model_kwargs)
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

    if model_kwargs["n_layer"] <= 0:
        return HuggingFaceModel(_build_small_model(seed, model_kwargs))
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


def model_description(size: str, seed: int) -> str:
    """One line for a table's header: the model of ``MODEL_SIZES[size]`` and its size."""
    model_kwargs = MODEL_SIZES[size]
    n_params = sum(p.numel() for p in build_cadence_model(seed, model_kwargs).parameters())
    if model_kwargs["n_layer"] < 0:
        return (f"tiny MLP (Linear({SEQ_LEN}, {model_kwargs['n_embd']}), ReLU, "
                f"Linear({model_kwargs['n_embd']}, {SEQ_LEN}); {n_params} parameters; "
                f"mean squared error), fp32")
    if not model_kwargs["n_layer"]:
        return (f"null model ({n_params} parameters; loss = their sum of squares; no model "
                "compute)")
    return (f"gpt2({', '.join(f'{k}={v}' for k, v in model_kwargs.items())}), "
            f"{n_params / 1e6:.2f} M parameters, fp32, sdpa attention")
