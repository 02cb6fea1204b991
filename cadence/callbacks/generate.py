"""``Generate``: every so often, generate text from a few fixed prompts and log it as a table.

Source: the API of Composer's ``composer.callbacks.Generate`` (names, arguments, the
``generations`` table with ``prompt`` and ``generation`` columns); implemented anew.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Optional, Union

from cadence.registry import callbacks
from cadence.core import Callback, Event, Time
from cadence.utils.misc import create_interval_scheduler

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["Generate"]

log = logging.getLogger(__name__)


@callbacks.register("generate")
class Generate(Callback):
    """Logs generations from ``prompts`` every ``interval`` and at the end of training.

    The model must have a ``generate(input_ids, attention_mask=..., **kwargs)`` method and a
    ``tokenizer`` (a :class:`~cadence.models.HuggingFaceModel` has both). The prompts are
    tokenized together, left-padded, and generated in batches of ``batch_size``, in eval mode
    and under the run's precision (a tokenizer without a pad token pads with its eos token);
    the model's mode and the tokenizer's padding side and pad token are restored afterwards.
    Every rank runs the generation (with ``synced_gpus`` on several ranks, so a sharded
    model's collectives line up); rank zero logs the table
    ``generations`` with columns ``prompt`` and ``generation`` (the new text only).

    Args:
        prompts: the prompts, a non-empty list of strings.
        interval: how often, as :func:`~cadence.utils.create_interval_scheduler` reads it
            (``"100ba"``, ``"1ep"``, an int = epochs); it fires on the checkpoint events
            (``BATCH_CHECKPOINT`` / ``EPOCH_CHECKPOINT``), after the batch's other callbacks.
        batch_size: prompts per ``generate`` call; default all of them.
        kwargs: passed to ``generate`` (``max_new_tokens=``, ``do_sample=``, ``top_p=``...).

    Raises:
        ValueError: ``prompts`` is not a list of strings; ``batch_size`` < 1; (at
            ``FIT_START``) no prompts, an empty prompt, or one whose tokens plus ``max_new_tokens`` pass
            the model's context; (at the event) the model cannot generate or has no
            tokenizer.
    """

    def __init__(self, prompts: list[str], interval: Union[str, int, Time],
                 batch_size: Optional[int] = None, **kwargs: Any) -> None:
        # an empty list is accepted here (Composer's signature, which llm-foundry's registry
        # test builds with prompts=[]) and refused at FIT_START
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"Generate prompts must be a non-empty list of strings, got "
                             f"{prompts!r}.")
        if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
            raise ValueError(f"Generate batch_size must be an int >= 1, got {batch_size!r}.")
        self.prompts = list(prompts)
        self.generate_kwargs = kwargs
        self.batch_size = len(self.prompts) if batch_size is None else int(batch_size)
        self.check_interval = create_interval_scheduler(interval, include_end_of_training=True)
        self.last_generate_batch: Optional[Time] = None

    def fit_start(self, state: State, logger: Any) -> None:
        """Check the prompts before training: none empty, and each prompt's tokens plus the
        new tokens within the model's context (``n_positions`` / ``max_position_embeddings``).

        Raises:
            ValueError: naming the prompt (1-based), its length and the limit.
        """
        del logger
        if not self.prompts:
            raise ValueError("Generate prompts must be a non-empty list of strings, got [].")
        model = getattr(state.model, "module", state.model)
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None or not callable(getattr(model, "generate", None)):
            return  # refused, with its reason, at the first generation
        config = getattr(getattr(model, "model", model), "config", None)
        context = next((getattr(config, name) for name in
                        ("n_positions", "max_position_embeddings", "max_seq_len")
                        if isinstance(getattr(config, name, None), int)), None)
        new = self.generate_kwargs.get("max_new_tokens")
        if new is None:
            new = getattr(getattr(getattr(model, "model", model), "generation_config", None),
                          "max_new_tokens", None)
        for number, prompt in enumerate(self.prompts, start=1):
            tokens = len(tokenizer(prompt)["input_ids"])
            if tokens == 0:
                raise ValueError(f"Generate prompt {number} is empty ({prompt!r}): there is "
                                 f"nothing to continue; remove it or give it text.")
            if context is not None and tokens + int(new or 0) > context:
                raise ValueError(
                    f"Generate prompt {number} ({prompt[:40]!r}...) is {tokens} tokens; "
                    f"with + {int(new or 0)} new tokens (max_new_tokens) that is past the "
                    f"model's context of {context} tokens. Shorten the prompt or lower "
                    f"max_new_tokens (checked at FIT_START, before training).")

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.FIT_START:
            self.fit_start(state, logger)
            return
        if state.timestamp.batch == self.last_generate_batch:
            return  # once per batch, even when the batch also ends an epoch or the run
        if not self.check_interval(state, event):
            return
        started = time.perf_counter()
        self.generate(state, logger)
        log.info("Generate: %d prompts in %.2f s", len(self.prompts),
                 time.perf_counter() - started)

    def generate(self, state: State, logger: Any) -> None:
        """Generate from every prompt now and log the table (on rank zero)."""
        import torch

        from cadence.core.precision import Precision, get_precision_context
        from cadence.utils import dist

        self.last_generate_batch = state.timestamp.batch
        model = getattr(state.model, "module", state.model)
        tokenizer = getattr(model, "tokenizer", None)
        if not callable(getattr(model, "generate", None)):
            raise ValueError(f"Generate needs a model with a generate() method (such as "
                             f"HuggingFaceModel); {type(model).__name__} has none.")
        if tokenizer is None:
            raise ValueError(f"Generate needs the model's tokenizer; {type(model).__name__} "
                             f"has tokenizer=None. Pass tokenizer= to the model.")
        was_training, padding_side = model.training, tokenizer.padding_side
        pad_token = tokenizer.pad_token
        tokenizer.padding_side = "left"  # generation continues from the right end
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.eval()
        try:
            encoded = tokenizer(self.prompts, return_tensors="pt", padding=True)
            ids, mask = encoded["input_ids"], encoded["attention_mask"]
            outputs: list[torch.Tensor] = []
            with torch.no_grad(), get_precision_context(Precision(state.precision), device=state.device):
                for start in range(0, len(self.prompts), self.batch_size):
                    stop = start + self.batch_size
                    outputs.extend(model.generate(
                        input_ids=ids[start:stop].to(state.device),
                        attention_mask=mask[start:stop].to(state.device),
                        synced_gpus=dist.get_world_size() > 1, **self.generate_kwargs))
        finally:
            tokenizer.padding_side, tokenizer.pad_token = padding_side, pad_token
            model.train(was_training)
        if dist.get_global_rank() == 0:
            prompt_len = ids.shape[1]
            rows = [[prompt, tokenizer.decode(out[prompt_len:], skip_special_tokens=True)]
                    for prompt, out in zip(self.prompts, outputs)]
            logger.log_table(columns=["prompt", "generation"], rows=rows, name="generations")
