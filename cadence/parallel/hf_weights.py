"""Stream a Hugging Face checkpoint's weights into a (sharded) model: each rank reads only
the slices of its own shards.

A ``save_pretrained`` directory holds ``model.safetensors``, or several files listed by
``model.safetensors.index.json``; older ones hold ``pytorch_model.bin`` (or its
``.bin.index.json`` shards). :func:`load_hf_weights` fills a model whose parameters are
plain tensors or DTensors (FSDP2 shards, tensor-parallel shards, both) with those weights:

- **safetensors** (sliced): for each parameter it takes the rank's local shard
  (``compute_local_shape_and_global_offset`` of the DTensor's placements: a rectangle of
  the full tensor) and reads only that rectangle, ``safe_open(file).get_slice(key)[...]``,
  into the shard in place (cast to the parameter's dtype). Files are opened lazily, one
  at a time, each when its first needed key comes up, and closed after its last; no rank
  ever holds a full state dict, the largest temporary is one slice. Bytes read by a rank
  are its shards' bytes (in the checkpoint's dtype), plus the replicated tensors.
- **.bin** (pickles cannot be sliced): the fallback is rank-0 broadcast. Rank 0 opens each
  ``.bin`` file (``torch.load(mmap=True)``, so it maps rather than reads the whole file),
  and sends one full tensor at a time to every rank, which keeps its slice: rank 0 holds
  the model on CPU only, and every rank's temporary peak is the largest tensor.

Key names are matched as ``from_pretrained`` matches them: a checkpoint written from the
base model (``BertModel``: ``embeddings...``) loads into a model with a head
(``bert.embeddings...``) and the reverse; a tied weight (GPT-2's ``lm_head.weight`` =
``transformer.wte.weight``) is loaded once, through whichever name the checkpoint holds;
checkpoint keys the model ignores on load (``_keys_to_ignore_on_load_unexpected``, stale
``position_ids`` / ``rotary_emb.inv_freq`` buffers) are skipped. Missing or extra keys of
the base model are an error (:class:`CheckpointKeyError`); keys missing outside it (a new
task head) are reported back for the caller to initialise, as ``from_pretrained`` does.

Runs on every rank of the default process group, collectively for ``.bin`` (each rank
must call it), independently for safetensors; works without a process group (one rank).

Source: safetensors' ``safe_open``/``get_slice``; PyTorch DCP's
``HuggingFaceStorageReader`` (``torch/distributed/checkpoint/hf_storage.py``), which reads
the same slices through a collective load plan; transformers' ``from_pretrained`` key rules.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch import nn

from cadence.utils.dtensor import local_chunk

__all__ = ["CheckpointFiles", "CheckpointKeyError", "LoadReport", "WeightFileError",
           "find_checkpoint_files", "load_hf_weights", "safe_open"]

log = logging.getLogger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"
BIN_INDEX = "pytorch_model.bin.index.json"
BIN_FILE = "pytorch_model.bin"

# Stale checkpoint keys transformers itself skips on load (it moved these buffers, or made
# them non-persistent), on top of each model's ``_keys_to_ignore_on_load_unexpected``.
_ALWAYS_IGNORED_UNEXPECTED = (r"rotary_emb\.inv_freq", r"(^|\.)position_ids$")


def safe_open(path: str, framework: str = "pt", device: str = "cpu") -> object:
    """``safetensors.safe_open``; the one place this module opens a file (tests count the
    bytes each rank reads by wrapping it)."""
    from safetensors import safe_open as _safe_open

    return _safe_open(path, framework=framework, device=device)


class CheckpointKeyError(KeyError):
    """The checkpoint's keys do not match the model's (missing or extra base-model keys,
    or a shape mismatch); the message names the keys and the fix."""

    def __str__(self) -> str:  # KeyError quotes its message; print it as written
        return str(self.args[0]) if self.args else ""


class WeightFileError(ValueError):
    """A weight file or index of a ``save_pretrained`` folder cannot be used: outside the
    folder, damaged, or not what its index says; the message names the file (or index
    entry) and what is wrong."""


_INTEGER_DTYPES = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})


def _inside(folder: str, name: str, what: str) -> str:
    """``folder/name``, resolved, refusing anything outside ``folder`` (``..``, an absolute
    path, a symlink out of it)."""
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(folder, name))
    if os.path.commonpath([root, path]) != root:
        raise WeightFileError(
            f"{what} {name!r} resolves to {path}, outside the model folder {root}; weight "
            f"files must be inside the folder (copy them in, or fix the entry).")
    return path


def _read_index(path: str) -> dict[str, str]:
    """An index's ``weight_map``, refusing what is not JSON, lacks it, or lists a key twice."""
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    try:
        with open(path, encoding="utf-8") as file:
            index = json.load(file, object_pairs_hook=pairs)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightFileError(f"{path} is not JSON ({exc}); rewrite it with "
                              f"save_pretrained.") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise WeightFileError(f"{path} has no 'weight_map' of tensor name -> file name; an "
                              f"index written by save_pretrained has one.")
    if duplicates:
        raise WeightFileError(f"{path} lists {_few(sorted(set(duplicates)))} twice; which file "
                              f"holds it is ambiguous: keep one entry.")
    return dict(weight_map)


@dataclass(frozen=True)
class CheckpointFiles:
    """Where a ``save_pretrained`` directory keeps its weights.

    Attributes:
        folder: the directory.
        format: ``"safetensors"`` (sliceable) or ``"bin"`` (rank-0 broadcast).
        weight_map: checkpoint key -> file name inside ``folder``; ``None`` for a single
            file whose keys are read from it when needed.
        files: the weight files, in the order they are read.
    """

    folder: str
    format: str
    files: tuple[str, ...]
    weight_map: Optional[dict[str, str]] = None

    def path(self, name: str) -> str:
        """The full path of one weight file."""
        return os.path.join(self.folder, name)


def find_checkpoint_files(folder: str | os.PathLike[str]) -> CheckpointFiles:
    """The weight files of a ``save_pretrained`` directory, safetensors first.

    Args:
        folder: a local directory.

    Returns:
        Its :class:`CheckpointFiles`: ``model.safetensors.index.json`` (sharded),
        ``model.safetensors``, ``pytorch_model.bin.index.json`` or ``pytorch_model.bin``,
        in that order of preference (``from_pretrained``'s).

    Raises:
        FileNotFoundError: none of those files is in ``folder``; the message lists what is.
    """
    folder = os.fspath(folder)
    for index_name, fmt in ((SAFETENSORS_INDEX, "safetensors"), (BIN_INDEX, "bin")):
        index_path = os.path.join(folder, index_name)
        if os.path.lexists(index_path):
            _inside(folder, index_name, "the index")
            weight_map = _read_index(index_path)
            files = tuple(sorted(set(weight_map.values())))
            for name in files:
                key = next(k for k, v in weight_map.items() if v == name)
                path = _inside(folder, name, f"{index_path}: the entry of {key!r},")
                if not os.path.isfile(path):
                    raise WeightFileError(f"{index_path} names {name!r} (for {key!r}), which "
                                          f"does not exist in {folder}.")
            return CheckpointFiles(folder, fmt, files, weight_map)
        single = SAFETENSORS_FILE if fmt == "safetensors" else BIN_FILE
        if os.path.lexists(os.path.join(folder, single)):
            _inside(folder, single, "the weight file")
            return CheckpointFiles(folder, fmt, (single,))
    present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    raise FileNotFoundError(
        f"No weights in {folder!r}: expected {SAFETENSORS_INDEX}, {SAFETENSORS_FILE}, "
        f"{BIN_INDEX} or {BIN_FILE} (a save_pretrained directory); found {present[:20]}."
    )


@dataclass
class LoadReport:
    """What :func:`load_hf_weights` did on this rank.

    Attributes:
        format: ``"safetensors"`` or ``"bin"``.
        loaded: model names (of the unique tensors) filled from the checkpoint.
        missing_keys: model names the checkpoint may lack and does (a new task head
            outside the base model, ``_keys_to_ignore_on_load_missing``): left as they
            were, for the caller to initialise.
        ignored_keys: checkpoint keys skipped (another task's head, stale buffers).
        bytes_read: bytes this rank read from safetensors slices (checkpoint dtype) or
            received by broadcast.
        files_opened: weight files this rank opened, in order.
    """

    format: str
    loaded: list[str] = field(default_factory=list)
    missing_keys: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)
    bytes_read: int = 0
    files_opened: list[str] = field(default_factory=list)


@dataclass
class _Target:
    names: list[str]            # every model name of this tensor (tied aliases)
    tensor: torch.Tensor        # the parameter or persistent buffer (plain or DTensor)
    key: Optional[str] = None   # the checkpoint key it is read from


def _targets(model: nn.Module) -> list[_Target]:
    """The model's parameters and persistent buffers, one entry per distinct tensor."""
    by_id: dict[int, _Target] = {}
    non_persistent = {f"{prefix}.{name}" if prefix else name
                      for prefix, module in model.named_modules()
                      for name in getattr(module, "_non_persistent_buffers_set", ())}
    named = [*model.named_parameters(remove_duplicate=False),
             *((n, b) for n, b in model.named_buffers(remove_duplicate=False)
               if n not in non_persistent)]
    for name, tensor in named:
        target = by_id.setdefault(id(tensor), _Target([], tensor))
        target.names.append(name)
    return list(by_id.values())


def _tied_sources(model: nn.Module) -> dict[str, str]:
    """transformers' tied keys, ``{tied name: source name}`` (``lm_head.weight`` ->
    ``transformer.wte.weight``), for checkpoints read into an untied copy."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        return {str(k): str(v) for k, v in tied.items()}
    return {}


def _candidates(name: str, prefix: str) -> Iterator[str]:
    """Checkpoint keys that may hold model name ``name`` (``from_pretrained``'s prefix
    rules: the same name; without the base-model prefix; with it)."""
    yield name
    if prefix and name.startswith(prefix + "."):
        yield name[len(prefix) + 1:]
    if prefix:
        yield f"{prefix}.{name}"


def _plan_keys(model: nn.Module, checkpoint_keys: set[str],
               report: LoadReport, where: str) -> list[_Target]:
    """Give every target its checkpoint key; raise on base-model keys missing or extra.

    A model name outside the base model (``lm_head.*``, ``score.*`` beside
    ``transformer.*``) or matching ``_keys_to_ignore_on_load_missing`` may be missing (a new
    head: ``report.missing_keys``). A checkpoint key outside the base model (another task's
    head) or matching the ignore patterns may be extra (``report.ignored_keys``).
    """
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    has_base = bool(prefix) and hasattr(model, prefix)
    tied = _tied_sources(model)
    targets = _targets(model)
    used: set[str] = set()
    may_miss = _regex(getattr(model, "_keys_to_ignore_on_load_missing", None) or ())
    missing_body: list[str] = []
    for target in targets:
        names = target.names + [tied[n] for n in target.names if n in tied]
        for name in names:
            key = next((k for k in _candidates(name, prefix) if k in checkpoint_keys), None)
            if key is not None:
                target.key = key
                used.add(key)
                break
        if target.key is None:
            name = target.names[0]
            head = has_base and not name.startswith(prefix + ".")
            if head or (may_miss is not None and may_miss.search(name)):
                report.missing_keys.append(name)
            else:
                missing_body.append(name)
    may_be_extra = _regex([*(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()),
                           *_ALWAYS_IGNORED_UNEXPECTED])
    prefixed = bool(prefix) and any(k.startswith(prefix + ".") for k in checkpoint_keys)
    extra_body: list[str] = []
    for key in sorted(checkpoint_keys - used):
        body = key.startswith(prefix + ".") if prefixed else True
        if not body or (may_be_extra is not None and may_be_extra.search(key)):
            report.ignored_keys.append(key)
        else:
            extra_body.append(key)
    if missing_body or extra_body:
        parts = []
        if missing_body:
            parts.append(f"missing from the checkpoint: {_few(missing_body)}")
        if extra_body:
            parts.append(f"in the checkpoint but not in the model: {_few(extra_body)}")
        raise CheckpointKeyError(
            f"The weights in {where} do not fit {type(model).__name__}: "
            f"{'; '.join(parts)}. Check that the directory's config.json matches its weights "
            "(the same architecture and sizes), or load it with init_device=None "
            "(transformers' from_pretrained, which initialises missing weights at random)."
        )
    if report.ignored_keys:
        log.info("Checkpoint keys not used by %s: %s", type(model).__name__,
                 _few(report.ignored_keys))
    return [t for t in targets if t.key is not None]


def _regex(patterns: object) -> Optional[re.Pattern[str]]:
    patterns = [str(p) for p in patterns]  # type: ignore[attr-defined]
    return re.compile("|".join(f"({p})" for p in patterns)) if patterns else None


def _few(keys: list[str], n: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:n])
    return f"{shown} (+{len(keys) - n} more)" if len(keys) > n else shown


def _check_shape(target: _Target, shape: tuple[int, ...], where: str) -> None:
    if tuple(shape) != tuple(target.tensor.shape):
        raise CheckpointKeyError(
            f"{target.key!r} in {where} has shape {tuple(shape)}, but the model's "
            f"{target.names[0]!r} has {tuple(target.tensor.shape)}; the directory's "
            "config.json does not match its weights."
        )


# ----------------------------------------------------------------------------- loading
def load_hf_weights(model: nn.Module, folder: str | os.PathLike[str]) -> LoadReport:
    """Fill ``model``'s parameters and persistent buffers from a ``save_pretrained``
    directory, each rank reading only its own shards (see the module docstring).

    Args:
        model: a ``transformers`` model (or any module whose state-dict names are the
            checkpoint's), materialised (no meta tensors), plain or sharded.
        folder: the directory.

    Returns:
        This rank's :class:`LoadReport` (``missing_keys`` are left for the caller).

    Raises:
        FileNotFoundError: no weights in ``folder``.
        CheckpointKeyError: a base-model key missing from the checkpoint or extra in it,
            or a shape that differs.
        ValueError: a meta tensor in ``model`` (call ``to_empty`` first), or a layout that
            cannot be sliced.
    """
    files = find_checkpoint_files(folder)
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise ValueError(f"load_hf_weights: {_few(meta)} are on the meta device; materialise "
                         "the model first (model.to_empty(device=...)).")
    report = LoadReport(files.format)
    with torch.no_grad():
        if files.format == "safetensors":
            _load_safetensors(model, files, report)
        else:
            _load_bin_from_rank0(model, files, report)
    return report


def _load_safetensors(model: nn.Module, files: CheckpointFiles, report: LoadReport) -> None:
    weight_map = files.weight_map
    if weight_map is None:  # one file: its keys are in its header
        with _open_checked(files.path(files.files[0])) as handle:
            weight_map = {key: files.files[0] for key in handle.keys()}
    targets = _plan_keys(model, set(weight_map), report, files.folder)
    per_file: dict[str, list[_Target]] = {}
    for target in targets:
        assert target.key is not None
        per_file.setdefault(weight_map[target.key], []).append(target)
    for name in files.files:
        if name not in per_file:
            continue
        report.files_opened.append(name)
        with _open_checked(files.path(name)) as handle:
            held = set(handle.keys())
            for target in per_file[name]:  # the file's entries checked before it is read
                _check_entry(handle, held, target, files.path(name))
            for target in per_file[name]:
                part = handle.get_slice(target.key)
                local, offsets = local_chunk(target.tensor)
                if local.numel() == 0:
                    continue
                data = part[tuple(slice(o, o + n) for o, n in zip(offsets, local.shape))]
                report.bytes_read += data.numel() * data.element_size()
                local.copy_(data.reshape(local.shape))
                report.loaded.append(target.names[0])


def _open_checked(path: str) -> Any:
    """:func:`safe_open`, a damaged file's error naming it (safetensors' own names none)."""
    try:
        return safe_open(path)
    except Exception as exc:  # SafetensorError, OSError: the header or size is wrong
        raise WeightFileError(f"{path} is not a readable safetensors file ({exc}); it may be "
                              f"truncated or damaged: download or save it again.") from None


def _check_entry(handle: Any, held: set[str], target: _Target, path: str) -> None:
    """The tensor ``target`` reads from ``path``: there, of the model's shape, and not
    integers for a floating-point parameter (a relabelled header)."""
    assert target.key is not None
    if target.key not in held:
        raise WeightFileError(f"{path} does not hold {target.key!r}, which its index names it "
                              f"for.")
    try:
        part = handle.get_slice(target.key)
        shape, dtype = tuple(part.get_shape()), str(part.get_dtype())
    except Exception as exc:
        raise WeightFileError(f"{path}: {target.key!r} cannot be read ({exc}).") from None
    _check_shape(target, shape, path)
    if dtype.upper() in _INTEGER_DTYPES and target.tensor.is_floating_point():
        raise WeightFileError(
            f"{path}: {target.key!r} is stored as {dtype.upper()}, an integer type, for the "
            f"floating-point {target.names[0]!r} ({target.tensor.dtype}); the header does not "
            f"describe these weights.")


def _load_bin_from_rank0(model: nn.Module, files: CheckpointFiles,
                         report: LoadReport) -> None:
    """Rank 0 reads the ``.bin`` files; every tensor is broadcast whole, one at a time, and
    each rank keeps its slice."""
    import torch.distributed as torch_dist

    distributed = torch_dist.is_available() and torch_dist.is_initialized()
    rank = torch_dist.get_rank() if distributed else 0
    keys: list[str] = []
    if rank == 0:
        keys = sorted(files.weight_map) if files.weight_map is not None else sorted(
            _torch_load(files.path(files.files[0])))
    if distributed:
        box: list[object] = [keys]
        torch_dist.broadcast_object_list(box, src=0)
        keys = list(box[0])  # type: ignore[arg-type]
    targets = _plan_keys(model, set(keys), report, files.folder)
    by_file: dict[str, list[_Target]] = {}
    for target in targets:
        assert target.key is not None
        name = files.weight_map[target.key] if files.weight_map is not None else files.files[0]
        by_file.setdefault(name, []).append(target)
    for name in files.files:
        if name not in by_file:
            continue
        state = _torch_load(files.path(name)) if rank == 0 else {}
        problem: Optional[str] = None
        if rank == 0:
            report.files_opened.append(name)
            try:
                for target in by_file[name]:
                    _check_shape(target, tuple(state[target.key].shape), files.path(name))
            except CheckpointKeyError as error:
                problem = str(error)
        if distributed:  # every rank raises together, none waits in a broadcast
            box = [problem]
            torch_dist.broadcast_object_list(box, src=0)
            problem = box[0]  # type: ignore[assignment]
        if problem is not None:
            raise CheckpointKeyError(problem)
        for target in by_file[name]:
            local, offsets = local_chunk(target.tensor)
            if rank == 0:
                full = state[target.key].to(device=local.device, dtype=target.tensor.dtype)
            else:
                full = torch.empty(target.tensor.shape, dtype=target.tensor.dtype,
                                   device=local.device)
            if distributed:
                torch_dist.broadcast(full, src=0)
            if rank != 0:
                report.bytes_read += full.numel() * full.element_size()
            if local.numel():
                local.copy_(full[tuple(slice(o, o + n) for o, n in zip(offsets, local.shape))])
            report.loaded.append(target.names[0])
            del full
        del state


def _torch_load(path: str) -> dict[str, torch.Tensor]:
    """A ``.bin`` state dict, memory-mapped, without running code from the pickle.

    Raises:
        CheckpointError: the file holds objects a weights file must not hold, or is not a
            ``torch.save`` file (the message names it; nothing in it ran).
    """
    from cadence.checkpoint.checkpoint import safe_torch_load

    return safe_torch_load(path, mmap=True)
