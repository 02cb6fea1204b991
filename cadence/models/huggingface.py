"""Wrap any ``transformers`` model as a :class:`~cadence.models.ComposerModel`.

Shapes: ``batch`` = samples, ``seq`` = token positions, ``vocab`` = vocabulary size,
``labels`` = classes of a classification head.

Source: MosaicML Composer's ``HuggingFaceModel`` (``composer/models/huggingface.py``).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torchmetrics
from torch import nn
from transformers import PreTrainedModel
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)

from cadence.models.base import ComposerModel
from cadence.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity
from cadence.utils.flops import transformer_flops_per_token

__all__ = ["HuggingFaceModel", "MetricsArg", "get_hf_config_from_composer_state_dict",
           "is_causal_lm", "is_sequence_classifier", "maybe_get_underlying_model",
           "peft_installed", "write_huggingface_pretrained_from_composer_checkpoint"]

log = logging.getLogger(__name__)

#: Whether ``peft`` is installed (Composer's flag; found without importing it).
peft_installed: bool = importlib.util.find_spec("peft") is not None

MetricsArg = Union[Sequence[torchmetrics.Metric], Mapping[str, torchmetrics.Metric], None]
"""Metrics given to :class:`HuggingFaceModel`: a list (named by class) or a name -> metric map."""


def _class_names(mapping: Mapping[str, Any]) -> frozenset[str]:
    names: set[str] = set()
    for value in mapping.values():
        names.update((value,) if isinstance(value, str) else value)
    return frozenset(names)


_CAUSAL_LM_CLASSES = _class_names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
_SEQUENCE_CLASSIFICATION_CLASSES = _class_names(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


def is_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` is a causal (next-token) language model.

    Decided by the model's class, not its ``model_type``: ``bert`` has a causal-LM class
    (``BertLMHeadModel``) but ``BertForSequenceClassification`` is not one. True when the
    class is one that ``AutoModelForCausalLM`` builds, or its name ends in ``ForCausalLM``
    or ``LMHeadModel`` (custom models following the convention).
    """
    name = type(model).__name__
    return (name in _CAUSAL_LM_CLASSES or name.endswith("ForCausalLM")
            or name.endswith("LMHeadModel"))


def is_sequence_classifier(model: nn.Module) -> bool:
    """Whether ``model`` is a sequence classifier (logits ``[batch, labels]``).

    True when the class is one that ``AutoModelForSequenceClassification`` builds, or its
    name ends in ``ForSequenceClassification``.
    """
    name = type(model).__name__
    return name in _SEQUENCE_CLASSIFICATION_CLASSES or name.endswith("ForSequenceClassification")


def _field(outputs: Any, name: str) -> Any:
    """``outputs[name]`` for a dict or ``ModelOutput`` (absent or ``None``: ``None``)."""
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return getattr(outputs, name, None)


def _metric_dict(metrics: MetricsArg, arg_name: str) -> dict[str, torchmetrics.Metric]:
    if metrics is None:
        return {}
    if isinstance(metrics, torchmetrics.Metric):
        metrics = [metrics]
    items = (list(metrics.items()) if isinstance(metrics, Mapping)
             else [(type(m).__name__, m) for m in metrics])
    out: dict[str, torchmetrics.Metric] = {}
    for name, metric in items:
        if not isinstance(metric, torchmetrics.Metric):
            raise TypeError(
                f"HuggingFaceModel({arg_name}=...): {name!r} is a {type(metric).__name__}, not a "
                "torchmetrics.Metric. Pass a list of metrics or a {name: metric} dict."
            )
        if name in out:
            raise ValueError(
                f"HuggingFaceModel({arg_name}=...): two metrics are named {name!r}. Pass a "
                "{name: metric} dict to give them distinct names."
            )
        out[name] = metric
    return out


class HuggingFaceModel(ComposerModel):
    """A ``transformers.PreTrainedModel`` (and optional tokenizer) as a ComposerModel.

    Batches are dicts of tensors as a ``transformers`` tokenizer or collator makes them:
    ``input_ids [batch, seq]``, ``attention_mask [batch, seq]``, ``labels`` (``[batch, seq]``
    token ids with ``-100`` at ignored positions for a language model, ``[batch]`` class ids
    for a classifier), plus whatever else the wrapped model's ``forward`` takes.

    Default metrics, chosen from the model's class (see :func:`is_causal_lm`):

    - causal LM: eval ``LanguageCrossEntropy`` and ``LanguagePerplexity``; no train metrics.
    - sequence classifier: eval ``MulticlassAccuracy`` (``num_classes=config.num_labels``,
      ``average="micro"``); no train metrics.
    - anything else: none.

    Args:
        model: the wrapped model; kept as ``self.model``.
        tokenizer: its tokenizer, kept as ``self.tokenizer`` (for checkpoints and callbacks).
        metrics: train metrics, a list (each named by its class) or a ``{name: metric}``
            dict. As in Composer, when given and ``eval_metrics`` is ``None``, copies of
            them are also the eval metrics (replacing the defaults).
        eval_metrics: eval metrics, same forms; ``None`` for the defaults above (or the
            copies of ``metrics``).
        shift_labels: whether metric updates compare ``logits[:, :-1]`` with
            ``labels[:, 1:]`` (next-token prediction). ``None``: ``True`` for causal LMs,
            else ``False``. The training loss is the wrapped model's own, which shifts
            internally for causal LMs; this flag only affects metrics.
        allow_embedding_resizing: if the tokenizer has more tokens than the model's input
            embedding, grow the embedding to ``len(tokenizer)``. Default ``False``: raise.
        use_logits: Composer's flag. cadence's :meth:`eval_forward` returns the logits in
            either case (its metric updates need them; Composer's ``False`` passes the whole
            output to metrics, which its language metrics then unpack). With ``True``,
            single-label logits ``[batch, 1]`` (regression heads) are squeezed to ``[batch]``
            for the metrics, as in Composer. Default ``False``.
        peft_config: a ``peft.PeftConfig`` (``peft.LoraConfig(r=8, lora_alpha=16,
            target_modules=[...])``; LoRA, DoRA or IA3), or the same as a mapping with
            ``peft_type``: the model is wrapped with ``peft.get_peft_model``, its base
            weights frozen and only the adapters trained (:mod:`cadence.models.peft`). Needs
            ``pip install 'cadence[peft]'``. Default ``None``: no adapters.
        should_save_peft_only: with ``peft_config`` (Composer's flag, default ``True``),
            checkpoints hold only the trainable parameters and their optimizer state; the
            frozen base is rebuilt from where it came from, whose name or path and weights'
            CRC32C the checkpoint records (:attr:`peft_base`), so a resume onto other base
            weights is refused. Ignored without ``peft_config``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or a metric is not a torchmetrics Metric.
        ValueError: ``len(tokenizer)`` exceeds the embedding size and
            ``allow_embedding_resizing`` is ``False``; or two list metrics share a class name.

    Source: Composer ``composer/models/huggingface.py`` (``HuggingFaceModel``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Optional[Any] = None,
        use_logits: bool = False,
        metrics: MetricsArg = None,
        eval_metrics: MetricsArg = None,
        shift_labels: Optional[bool] = None,
        allow_embedding_resizing: bool = False,
        peft_config: Optional[Any] = None,
        should_save_peft_only: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"HuggingFaceModel wraps a transformers PreTrainedModel, got "
                f"{type(model).__name__}. For a plain nn.Module subclass ComposerModel instead."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.config = getattr(model, "config", None)
        self._is_causal_lm = is_causal_lm(model)
        self._is_classifier = is_sequence_classifier(model)
        self.shift_labels = self._is_causal_lm if shift_labels is None else bool(shift_labels)
        self.use_logits = bool(use_logits)

        if tokenizer is not None:
            self._check_vocab(tokenizer, allow_embedding_resizing)

        # Keys the wrapped forward takes by name; inspected once. A forward that only has
        # **kwargs takes everything (``None`` marks that).
        params = inspect.signature(model.forward).parameters.values()
        named = {p.name for p in params
                 if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
        self._forward_keys: Optional[frozenset[str]] = frozenset(named) if named else None
        # Hugging Face's num_items_in_batch reaches a causal LM's loss when its forward names
        # it or takes **kwargs (the loss kwargs), unless the class says otherwise
        # (``accepts_loss_kwargs``): transformers' Trainer decides the same way
        takes_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
        self._accepts_num_items = self._is_causal_lm and bool(getattr(
            model, "accepts_loss_kwargs", takes_kwargs or "num_items_in_batch" in named))

        self._train_metrics = _metric_dict(metrics, "metrics")
        if eval_metrics is not None:
            self._eval_metrics = _metric_dict(eval_metrics, "eval_metrics")
        elif metrics is not None:
            self._eval_metrics = copy.deepcopy(self._train_metrics)
        else:
            self._eval_metrics = self._default_eval_metrics()

        self.peft_base: Optional[dict[str, Any]] = None
        self.should_save_peft_only = bool(should_save_peft_only)
        if peft_config is not None:
            from cadence.models.peft import base_identity, wrap_with_peft

            if self.should_save_peft_only:
                self.peft_base = base_identity(model)
            self.model = wrap_with_peft(model, peft_config)
        self._layer_classes = self._find_layer_classes()

    @property
    def uses_peft(self) -> bool:
        """Whether the wrapped model is a ``peft.PeftModel`` (adapters on a frozen base)."""
        peft = sys.modules.get("peft")
        return peft is not None and isinstance(self.model, peft.PeftModel)

    @property
    def saves_adapters_only(self) -> bool:
        """Whether checkpoints hold only the trainable parameters (``peft_config`` with
        ``should_save_peft_only``); read by :mod:`cadence.checkpoint.checkpoint`."""
        return self.uses_peft and self.should_save_peft_only

    # ----------------------------------------------------------------- construction

    def _check_vocab(self, tokenizer: Any, allow_embedding_resizing: bool) -> None:
        try:
            embedding = self.model.get_input_embeddings()
        except (AttributeError, NotImplementedError):
            return
        if not isinstance(embedding, nn.Embedding):
            return
        n_tokens, n_embeddings = len(tokenizer), embedding.num_embeddings
        if n_tokens <= n_embeddings:
            # Fewer tokens than embedding rows is normal (vocab padded to a multiple of 64).
            return
        if not allow_embedding_resizing:
            raise ValueError(
                f"The tokenizer has {n_tokens} tokens but the model's input embedding has only "
                f"{n_embeddings} rows, so some token ids would index out of range. Build the "
                f"model with vocab_size >= {n_tokens}, or pass allow_embedding_resizing=True to "
                "grow the embedding (new rows are freshly initialised)."
            )
        log.info("Resizing token embeddings from %d to %d.", n_embeddings, n_tokens)
        self.model.resize_token_embeddings(n_tokens)

    def _default_eval_metrics(self) -> dict[str, torchmetrics.Metric]:
        if self._is_causal_lm:
            return {"LanguageCrossEntropy": LanguageCrossEntropy(),
                    "LanguagePerplexity": LanguagePerplexity()}
        if self._is_classifier and self.config is not None:
            from torchmetrics.classification import MulticlassAccuracy

            return {"MulticlassAccuracy": MulticlassAccuracy(
                num_classes=int(self.config.num_labels), average="micro")}
        return {}

    def _find_layer_classes(self) -> frozenset[type[nn.Module]]:
        names = set(getattr(self.model, "_no_split_modules", None) or ())
        return frozenset(type(m) for m in self.model.modules() if type(m).__name__ in names)

    # ----------------------------------------------------------------- ComposerModel

    def forward(self, batch: Mapping[str, Any]) -> Any:
        """Run the wrapped model on ``batch``.

        Only the keys that the wrapped model's ``forward`` names as parameters are passed
        (e.g. ``input_ids``, ``attention_mask``, ``labels``); every other key is ignored,
        so a batch may carry extra fields (sample ids, raw text) for callbacks. Mind the
        spelling: a misspelled key (``attention_maks``) is ignored too.

        Args:
            batch: dict of tensors, e.g. ``input_ids [batch, seq]``.

        Returns:
            The wrapped model's output (a ``transformers`` ``ModelOutput``: ``loss`` when
            the batch has ``labels``, ``logits`` ``[batch, seq, vocab]`` or
            ``[batch, labels]``).

        Raises:
            TypeError: ``batch`` is not a mapping.
        """
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"HuggingFaceModel.forward expects a dict batch (input_ids, attention_mask, "
                f"labels, ...), got {type(batch).__name__}. Use a collator that returns dicts."
            )
        if self._forward_keys is None:
            return self.model(**batch)
        kwargs = {k: v for k, v in batch.items() if k in self._forward_keys}
        if self._accepts_num_items and "num_items_in_batch" in batch:  # token-weighted steps
            kwargs["num_items_in_batch"] = batch["num_items_in_batch"]
        return self.model(**kwargs)

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        """The wrapped model's own loss (``outputs["loss"]``), a scalar mean over tokens
        (causal LM: next-token cross entropy over labels not equal to ``-100``) or samples.

        Raises:
            ValueError: the model returned no loss, which happens when ``batch`` has no
                ``labels``; the message says how to add them.
        """
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        if isinstance(labels, torch.Tensor) and labels.is_floating_point():
            return self._soft_label_loss(outputs, batch, labels)  # e.g. LabelSmoothing's
        loss = _field(outputs, "loss")
        if loss is None:
            keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(
                f"The wrapped {type(self.model).__name__} returned no loss: the batch must hold "
                f"'labels' (batch keys: {keys}). For a causal LM set labels = input_ids with "
                "padding positions set to -100 (e.g. transformers.DataCollatorForLanguageModeling"
                "(tokenizer, mlm=False)); for a classifier, labels = class ids [batch]."
            )
        return loss

    def _soft_label_loss(self, outputs: Any, batch: Mapping[str, Any],
                         labels: torch.Tensor) -> torch.Tensor:
        """Cross entropy against class probabilities ``labels`` of the logits' shape
        (``[batch, seq, vocab]`` or ``[batch, labels]``; all-zero rows are ignored), shifted
        one token for a causal LM as the model's own loss shifts index labels; the mean over
        counted rows, or their sum over ``num_items_in_batch`` when the batch carries it."""
        logits = self._logits(outputs)
        if labels.shape != logits.shape:
            raise ValueError(f"Probability labels must have the logits' shape {tuple(logits.shape)}, "
                             f"got {tuple(labels.shape)}.")
        if self.shift_labels and logits.dim() == 3:
            logits, labels = logits[:, :-1], labels[:, 1:]
        per_row = -(labels * torch.log_softmax(logits.float(), dim=-1)).sum(dim=-1)
        count = batch.get("num_items_in_batch")
        if count is None:
            count = labels.sum().clamp(min=1)  # rows of probabilities sum to 1 each
        return per_row.sum() / count

    def eval_forward(self, batch: Mapping[str, Any], outputs: Optional[Any] = None) -> torch.Tensor:
        """Logits for metric updates: ``[batch, seq, vocab]`` (LM) or ``[batch, labels]``
        (classifier). Reuses ``outputs`` of :meth:`forward` when given."""
        if outputs is None:
            outputs = self.forward(batch)
        logits = self._logits(outputs)
        if self.use_logits and logits.ndim == 2 and logits.shape[1] == 1:
            logits = logits.squeeze(dim=1)  # [batch, 1] -> [batch], as Composer
        return logits

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Generate tokens with the wrapped model's ``generate`` (Composer's
        ``HuggingFaceModel.generate``), e.g. ``max_new_tokens=``, ``do_sample=``.

        ``pad_token_id`` defaults to the tokenizer's pad token, else its eos token. On several
        ranks with a sharded model, pass ``synced_gpus=True`` so every rank keeps running the
        forward (which gathers the shards) until the longest generation ends.

        Args:
            input_ids: prompts ``[batch, prompt_len]`` (left-padded for a batch).
            kwargs: passed to ``transformers``' ``generate``.

        Returns:
            ``[batch, prompt_len + new_tokens]`` token ids.
        """
        tokenizer = self.tokenizer
        if "pad_token_id" not in kwargs and tokenizer is not None:
            pad = tokenizer.pad_token_id
            kwargs["pad_token_id"] = tokenizer.eos_token_id if pad is None else pad
        # Under FSDP2 this wrapper is the root unit, and generate() calls the wrapped model,
        # not this module's forward, so the root's own shards (embeddings, final norm) would
        # stay sharded: gather them for the whole generation (the blocks gather their own in
        # their forward hooks), then free them.
        unshard, reshard = getattr(self, "unshard", None), getattr(self, "reshard", None)
        if callable(unshard) and callable(reshard):
            unshard()
            try:
                return self.model.generate(input_ids=input_ids, **kwargs)
            finally:
                reshard()
        return self.model.generate(input_ids=input_ids, **kwargs)

    def get_metrics(self, is_train: bool = False) -> dict[str, torchmetrics.Metric]:
        """Fresh (deep-copied) ``{name: metric}`` for training (``is_train``) or eval."""
        return copy.deepcopy(self._train_metrics if is_train else self._eval_metrics)

    def update_metric(self, batch: Mapping[str, Any], outputs: Any,
                      metric: torchmetrics.Metric) -> Optional[dict]:
        """Update ``metric`` with one batch's logits and ``batch["labels"]``.

        A metric with ``needs_batch = True`` (llm-foundry's in-context-learning metrics) is
        called as Composer calls it: ``metric.update(batch=batch, outputs=logits,
        labels=labels)`` with the full ``[batch, seq, vocab]`` logits and, for a causal LM
        or an ICL batch (``batch["mode"] == "icl_task"``), the labels shifted one token left
        (``labels[:, i]`` is the token after position ``i``; the last is ``-100``). What it
        returns (per-example results) comes back with ``metric_name`` added, one per row;
        other metrics return ``None``.

        With ``shift_labels`` (causal LMs by default) token-level logits are aligned to
        the next token first: ``logits[:, :-1]`` ``[batch, seq-1, vocab]`` against
        ``labels[:, 1:]`` ``[batch, seq-1]``. Otherwise ``metric.update(logits, labels)``
        (a classifier's ``[batch, labels]`` logits and ``[batch]`` class ids; torchmetrics
        classification metrics take logits and argmax them).

        Raises:
            ValueError: ``batch`` has no ``labels``; or ``shift_labels`` is set but the
                logits are not ``[batch, seq, vocab]``.
        """
        logits = self._logits(outputs)
        if not isinstance(batch, Mapping) or "labels" not in batch:
            keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(
                f"HuggingFaceModel.update_metric needs batch['labels'] (batch keys: {keys}). "
                "Add labels to the eval batches (for a causal LM: input_ids with padding "
                "set to -100)."
            )
        labels = batch["labels"]
        if getattr(metric, "needs_batch", False):
            if self.shift_labels or batch.get("mode") == "icl_task":
                labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
            result = metric.update(batch=batch, outputs=logits, labels=labels)
            if result is None:
                return None
            return {**result, "metric_name": [type(metric).__name__] * len(labels)}
        if self.shift_labels:
            if logits.dim() != 3:
                raise ValueError(
                    f"shift_labels=True needs token logits [batch, seq, vocab], got "
                    f"{tuple(logits.shape)} from {type(self.model).__name__}. Pass "
                    "shift_labels=False for models that are not causal language models."
                )
            logits, labels = logits[:, :-1], labels[:, 1:]
        metric.update(logits, labels)
        return None

    def num_tokens(self, batch: Any) -> int:
        """Real (non-padding) tokens in ``batch``: the ones in ``attention_mask`` if present,
        else in ``token_mask`` (packed rows of :mod:`cadence.data.instruction`, which carry no
        ``attention_mask``), else the element count of ``input_ids``, else 0."""
        if isinstance(batch, Mapping):
            for mask in ("attention_mask", "token_mask"):
                if batch.get(mask) is not None:
                    return int(batch[mask].sum().item())
            if batch.get("input_ids") is not None:
                return int(batch["input_ids"].numel())
        return 0

    def num_loss_tokens(self, batch: Any) -> torch.Tensor:
        """Tokens of ``batch`` that carry a loss: labels not equal to ``-100``; with
        ``shift_labels`` (causal LMs) ``labels[:, 1:]``, as the wrapped model's loss shifts
        them. Read by ``accumulate_train_batch_on_tokens``
        (:mod:`cadence.trainer.loss_weighting`); Composer's
        ``get_num_tokens_in_batch(token_type='loss_generating')``, Hugging Face's
        ``num_items_in_batch``.

        Returns:
            A 0-dim int64 tensor on the labels' device (no host sync); 0 without labels.
        """
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        if labels is None:
            return torch.zeros((), dtype=torch.int64)
        if self.shift_labels and labels.dim() > 1:
            labels = labels[..., 1:]
        return labels.ne(-100).sum()

    @property
    def accepts_num_items_in_batch(self) -> bool:
        """Whether the wrapped model's loss takes Hugging Face's ``num_items_in_batch``
        (a causal LM whose ``forward`` names it or takes ``**kwargs``): with
        ``accumulate_train_batch_on_tokens`` the Trainer then adds the global batch's
        loss-token count to each microbatch under that key, and the loss is the sum over
        the microbatch's tokens divided by it."""
        return self._accepts_num_items

    # ----------------------------------------------------------------- parallelism hooks

    def transformer_layer_classes(self) -> set[type[nn.Module]]:
        """Module classes named in the wrapped model's ``_no_split_modules`` (its transformer
        blocks, e.g. ``{GPT2Block}``; for BERT ``{BertLayer, BertEmbeddings}``) that occur
        in the model. Empty if the model declares none. Used for FSDP units and activation
        checkpointing."""
        return set(self._layer_classes)

    def fsdp_wrap_fn(self, module: nn.Module) -> bool:
        """True for modules of :meth:`transformer_layer_classes` (each becomes an FSDP unit)."""
        return isinstance(module, tuple(self._layer_classes))

    def activation_checkpointing_fn(self, module: nn.Module) -> bool:
        """True for modules of :meth:`transformer_layer_classes` (each is checkpointed)."""
        return isinstance(module, tuple(self._layer_classes))

    def param_init_fn(self, module: nn.Module) -> None:
        """Composer's per-module init hook: ``module``'s random initialisation by the
        transformers model that owns it (its nearest ``PreTrainedModel``, so a composite
        model's sub-models use their own ``_init_weights``), as ``post_init`` applies it.
        Called children first (``nn.Module.apply``'s order) it gives the model's normal
        init (GPT-2: normal(0, ``initializer_range``) weights, zero biases, unit norms, and
        the residual projections scaled by ``1 / sqrt(2 n_layer)``). Modules outside the
        wrapped model (this wrapper itself) are left alone.

        :func:`cadence.parallel.param_init.materialize_and_init` calls :meth:`init_weights`
        (which also streams pretrained weights) when a model has both; this is the
        per-module form for Composer-style callers.
        """
        owners = self.__dict__.get("_init_owners")
        if owners is None or id(module) not in owners:
            owners = {}

            def walk(node: nn.Module, owner: Optional[nn.Module]) -> None:
                owner = node if isinstance(node, PreTrainedModel) else owner
                owners[id(node)] = owner
                for child in node.children():
                    walk(child, owner)

            walk(self.model, None)
            self.__dict__["_init_owners"] = owners
        owner = owners.get(id(module))
        init = getattr(owner, "_init_weights", None)
        if callable(init):
            init(module)

    # ----------------------------------------------------------------- pretrained, streamed

    def stream_pretrained_from(self, path: Union[str, os.PathLike[str]]) -> None:
        """Read the weights from ``path`` in :meth:`load_pretrained_weights` (which
        :meth:`init_weights` calls after sharding) instead of now.

        :func:`~cadence.models.gpt.hf_pretrained` calls this for ``init_device="meta"``: the
        model is built with its parameters on the meta device and its buffers on the CPU
        (they are small, and non-persistent ones such as ``position_ids`` or rotary
        ``inv_freq`` are not in the checkpoint); the buffers are kept here so that they
        survive ``to_empty``.

        Args:
            path: a ``save_pretrained`` directory (safetensors, sharded or not, or ``.bin``).
        """
        self.__dict__["_pretrained_path"] = str(path)
        self.__dict__["_pretrained_buffers"] = {
            name: buffer for name, buffer in self.model.named_buffers() if not buffer.is_meta}

    @property
    def pretrained_path(self) -> Optional[str]:
        """The directory :meth:`load_pretrained_weights` reads, or ``None`` (weights loaded
        at construction, or a model trained from scratch)."""
        return self.__dict__.get("_pretrained_path")

    def load_pretrained_weights(self) -> Any:
        """Fill the materialised (possibly sharded) model from :attr:`pretrained_path`, each
        rank reading only its own shards' slices of the safetensors files
        (:func:`cadence.parallel.hf_weights.load_hf_weights`; ``.bin`` checkpoints: rank 0
        reads and broadcasts). Buffers get their construction-time values back first;
        weights the checkpoint lacks outside the base model (a new task head) are
        initialised by the wrapped model's ``_init_weights``, as ``from_pretrained`` does.

        Returns:
            This rank's :class:`~cadence.parallel.hf_weights.LoadReport`.

        Raises:
            ValueError: no :attr:`pretrained_path`, or parameters still on the meta device.
            cadence.parallel.hf_weights.CheckpointKeyError: the checkpoint does not fit.
        """
        from cadence.parallel.hf_weights import load_hf_weights

        path = self.pretrained_path
        if path is None:
            raise ValueError("load_pretrained_weights: this model was not built to stream its "
                             "weights; build it with hf_pretrained(..., init_device='meta').")
        saved: dict[str, torch.Tensor] = self.__dict__.get("_pretrained_buffers", {})
        self._retie_weights()
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                kept = saved.get(name)
                if kept is not None and kept is not buffer and not buffer.is_meta:
                    buffer.copy_(kept)
            report = load_hf_weights(self.model, path)
            if report.missing_keys:
                self._init_missing_weights(report.missing_keys)
        return report

    def _retie_weights(self) -> None:
        """Tie the weights again where ``to_empty`` untied them: on a module that is not
        sharded it gives each module its own new parameter (GPT-2's ``lm_head.weight`` and
        ``transformer.wte.weight`` become two); FSDP2 and DTensor parameters keep theirs."""
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        for target, source in dict(tied).items():
            try:
                a, b = self.model.get_parameter(target), self.model.get_parameter(source)
            except AttributeError:
                continue
            if a is not b and type(a) is nn.Parameter and type(b) is nn.Parameter:
                self.model.tie_weights()
                return

    def _init_missing_weights(self, names: Sequence[str]) -> None:
        """``from_pretrained``'s treatment of weights the checkpoint lacks: the random
        init (:meth:`param_init_fn`) of each module that owns one."""
        log.warning("Weights of %s not in the checkpoint, newly initialised: %s",
                    type(self.model).__name__, ", ".join(names))
        owners = {name.rsplit(".", 1)[0] if "." in name else "" for name in names}
        for owner in sorted(owners):
            self.param_init_fn(self.model.get_submodule(owner))

    def init_weights(self) -> None:
        """Initialise the model after the parallelize plan materialised it (``to_empty``)
        from the meta device: stream the pretrained weights when built by
        ``hf_pretrained(init_device="meta")`` (:meth:`load_pretrained_weights`), else the
        wrapped model's own random initialisation (:meth:`param_init_fn` on every module,
        children first)."""
        if self.pretrained_path is not None:
            self.load_pretrained_weights()
            return
        with torch.no_grad():
            for module in _children_first(self.model):
                self.param_init_fn(module)

    # ----------------------------------------------------------------- throughput

    def num_params(self) -> int:
        """Number of distinct parameters (tied weights counted once; the global count for
        sharded DTensor parameters)."""
        return sum(p.numel() for p in self.model.parameters())

    def flops_per_batch(self, batch: Mapping[str, Any]) -> float:
        """Model FLOPs of one training step (forward + backward) on ``batch``, for MFU.

        ``B * T * (6 N + 12 L H Q T)`` for ``input_ids [B, T]`` (Chowdhery et al. 2022,
        "PaLM", Appendix B; :func:`cadence.utils.flops.transformer_flops_per_token`):

        - ``N``: parameters that take part in matmuls: all of them but the embedding
          look-up tables (``nn.Embedding`` weights, e.g. GPT-2's position embedding), except
          a table tied to the output projection, which counts once as that projection.
        - ``L H Q``: ``config.num_hidden_layers``, ``num_attention_heads`` and ``head_dim``
          (default ``hidden_size / num_attention_heads``); a model whose config lacks them
          gets the ``6 N`` term only.
        - ``T``: the sequence length of ``input_ids``; padding positions count (they cost
          compute). A batch without ``input_ids`` counts :meth:`num_tokens` tokens and no
          attention term.

        For GPT-2 small (124 M parameters, 123.65 M in matmuls) at ``T = 1024``: 855.2 M
        FLOPs per token, 13 % of them the attention term.
        """
        n_params, attention = self._flops_terms()
        if isinstance(batch, Mapping) and batch.get("input_ids") is not None:
            input_ids = batch["input_ids"]
            seq_len = int(input_ids.shape[-1])
            return float(input_ids.numel()) * (6.0 * n_params + attention * seq_len)
        return 6.0 * n_params * self.num_tokens(batch)

    def _flops_terms(self) -> tuple[int, float]:
        """``(N, 12 L H Q)`` of :meth:`flops_per_batch`, counted once (a walk over the
        modules takes about 0.5 ms for GPT-2 124M) and again if the vocabulary is resized."""
        embedding = self.model.get_input_embeddings() if hasattr(
            self.model, "get_input_embeddings") else None
        key = (id(embedding), getattr(embedding, "num_embeddings", None))
        cached = self.__dict__.get("_flops_cache")
        if cached is None or cached[0] != key:
            cached = (key, self._count_flops_terms())
            self.__dict__["_flops_cache"] = cached
        return cached[1]

    def _count_flops_terms(self) -> tuple[int, float]:
        output = self.model.get_output_embeddings() if hasattr(
            self.model, "get_output_embeddings") else None
        tied = getattr(output, "weight", None)
        seen: set[int] = set()
        lookups = 0
        for module in self.model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, nn.Embedding) and weight is not tied and id(weight) not in seen:
                seen.add(id(weight))
                lookups += weight.numel()
        config = self.config
        layers = getattr(config, "num_hidden_layers", None)
        heads = getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "head_dim", None)
        if head_dim is None and heads and getattr(config, "hidden_size", None):
            head_dim = int(config.hidden_size) // int(heads)
        attention = 0.0
        if layers and heads and head_dim:
            attention = transformer_flops_per_token(0, int(layers), int(heads), int(head_dim), 1)
        return self.num_params() - lookups, attention

    # ----------------------------------------------------------------- helpers

    @staticmethod
    def hf_from_composer_checkpoint(
        checkpoint_path: str,
        model_instantiation_class: Any = None,
        model_config_kwargs: Optional[dict] = None,
        local_checkpoint_save_location: Optional[Union[str, os.PathLike[str]]] = None,
        trust_remote_code: bool = False,
    ) -> tuple[Any, Any]:
        """The ``transformers`` model and tokenizer saved in a checkpoint of a
        ``HuggingFaceModel`` (Composer's ``HuggingFaceModel.hf_from_composer_checkpoint``):
        a ``full`` checkpoint cadence or Composer 0.32 wrote, or a cadence ``sharded`` one.

        Args:
            checkpoint_path: a local path or an fsspec URL (downloaded first).
            model_instantiation_class: the class to build (a ``transformers`` class or its
                name; an ``AutoModelFor...`` class builds through ``from_config``); default
                the class the checkpoint names.
            model_config_kwargs: config fields to override.
            local_checkpoint_save_location: keep the downloaded checkpoint there.
            trust_remote_code: passed to an ``AutoModel`` class's ``from_config``.

        Returns:
            ``(model, tokenizer)``; the tokenizer is None when the run had none. To write
            them out: ``model.save_pretrained(dir)``, ``tokenizer.save_pretrained(dir)``
            (or ``cadence convert CHECKPOINT --to hf DIR``).

        Unlike Composer's (which returns a freshly initialised model), the weights are
        loaded: with another class than the checkpoint's (a new head on a pretrained body),
        every weight that fits loads and one ``UserWarning`` names the model's keys the
        checkpoint lacks and the checkpoint's keys the model does not use.

        Raises:
            CheckpointError: the checkpoint is not a ``HuggingFaceModel``'s, cannot be read,
                or a weight has another shape in the class (naming it and both shapes).
        """
        from cadence.checkpoint.export import hf_from_checkpoint_path

        return hf_from_checkpoint_path(
            str(checkpoint_path), model_instantiation_class, model_config_kwargs,
            None if local_checkpoint_save_location is None
            else str(local_checkpoint_save_location), trust_remote_code)

    @staticmethod
    def _logits(outputs: Any) -> torch.Tensor:
        if isinstance(outputs, torch.Tensor):
            return outputs
        logits = _field(outputs, "logits")
        if logits is None:
            raise ValueError(
                f"Expected model outputs with 'logits', got {type(outputs).__name__}. "
                "HuggingFaceModel supports models whose output has a logits field."
            )
        return logits


def _children_first(module: nn.Module) -> list[nn.Module]:
    """``module``'s submodules, each after its children (``nn.Module.apply``'s order)."""
    order: list[nn.Module] = []

    def visit(node: nn.Module) -> None:
        for child in node.children():
            visit(child)
        order.append(node)

    visit(module)
    return order


def write_huggingface_pretrained_from_composer_checkpoint(
    checkpoint_path: Union[str, os.PathLike[str]],
    output_folder: Union[str, os.PathLike[str]],
    local_checkpoint_save_location: Optional[Union[str, os.PathLike[str]]] = None,
) -> None:
    """Write the ``transformers`` model of a ``HuggingFaceModel`` checkpoint to
    ``output_folder`` so ``from_pretrained(output_folder)`` loads it (Composer's function):
    ``config.json``, the weights as ``model.safetensors`` (Composer writes a pickled
    ``pytorch_model.bin``; safetensors cannot run code when loaded) and, when the run had
    one, the tokenizer's files. Call on one process.

    Args:
        checkpoint_path: a ``full`` checkpoint cadence or Composer 0.32 wrote, or a cadence
            ``sharded`` one; a local path or an fsspec URL.
        output_folder: created if missing.
        local_checkpoint_save_location: keep the downloaded checkpoint there.

    Raises:
        CheckpointError: as :meth:`HuggingFaceModel.hf_from_composer_checkpoint`.
    """
    model, tokenizer = HuggingFaceModel.hf_from_composer_checkpoint(
        str(checkpoint_path), local_checkpoint_save_location=local_checkpoint_save_location)
    os.makedirs(output_folder, exist_ok=True)
    model.save_pretrained(output_folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_folder)


def maybe_get_underlying_model(model: nn.Module) -> nn.Module:
    """The ``transformers`` model inside a ``peft`` ``PeftModel`` (``model.base_model.model``);
    any other model as it is (Composer's function)."""
    if peft_installed and "peft" in sys.modules:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            return model.base_model.model
    return model


def get_hf_config_from_composer_state_dict(state_dict: dict[str, Any],
                                           config_overrides: Optional[dict[str, Any]] = None
                                           ) -> Any:
    """The ``transformers`` config of the model a ``HuggingFaceModel`` checkpoint holds, with
    ``config_overrides`` applied (Composer's function).

    Args:
        state_dict: a ``full`` checkpoint file's dict, as
            :func:`cadence.utils.checkpoint.safe_torch_load` returns it (written by cadence
            or by Composer 0.32).
        config_overrides: config keys to set (default none).

    Returns:
        a ``transformers.PretrainedConfig`` (``AutoConfig.for_model`` of the saved
        ``model_type``; ``id2label`` keys back to ints).

    Raises:
        CheckpointError: the checkpoint was not written from a ``HuggingFaceModel``.
    """
    import transformers

    from cadence.checkpoint.export import _hf_description

    config = dict(_hf_description(state_dict.get("state", state_dict), Path("<state_dict>"))
                  ["config"])
    config.update(config_overrides or {})
    if "id2label" in config:
        config["id2label"] = {int(k): v for k, v in config["id2label"].items()}
    return transformers.AutoConfig.for_model(**config)
