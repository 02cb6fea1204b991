"""Hostile ``save_pretrained`` folders for :func:`~cadence.parallel.hf_weights.load_hf_weights`:
an index that points outside the folder (``..``, an absolute path, a symlink), a key listed
twice, a header that relabels a float tensor as integers, and damaged files (truncated,
garbage header, a header length past the end, an index that is not JSON or lacks
``weight_map``, a file without the tensor its index names). Each is refused before any
tensor loads, with a :class:`WeightFileError` naming the file (or entry) and what is wrong.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

from cadence.parallel.hf_weights import WeightFileError, load_hf_weights

INDEX = "model.safetensors.index.json"


def tiny() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11,
                                      n_positions=4)).eval()


def sharded(folder: Path) -> dict[str, Any]:
    """A two-file copy of :func:`tiny` in ``folder``; its index, as a dict."""
    state = {k: v.contiguous() for k, v in tiny().state_dict().items() if k != "lm_head.weight"}
    keys = sorted(state)
    half = len(keys) // 2
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"a.safetensors": keys[:half], "b.safetensors": keys[half:]}
    for name, names in parts.items():
        save_file({k: state[k] for k in names}, folder / name, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: n for n, ks in parts.items() for k in ks}}
    (folder / INDEX).write_text(json.dumps(index))
    return index


def header_of(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), data[8 + length:]


def write_with_header(path: Path, header: dict[str, Any], body: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def refused(folder: Path, *patterns: str) -> str:
    with pytest.raises(WeightFileError) as info:
        load_hf_weights(tiny(), folder)
    message = str(info.value)
    for pattern in patterns:
        assert pattern in message, (pattern, message)
    return message


def test_an_intact_sharded_folder_loads(tmp_path: Path) -> None:
    sharded(tmp_path / "ok")
    report = load_hf_weights(tiny(), tmp_path / "ok")
    assert report.files_opened == ["a.safetensors", "b.safetensors"]


@pytest.mark.parametrize("entry", ["../other/model.safetensors", "ABSOLUTE",
                                   "../../../../etc/passwd"])
def test_an_index_entry_outside_the_folder_is_refused(tmp_path: Path, entry: str) -> None:
    other = tmp_path / "other"
    sharded(other)
    save_file({"x": torch.zeros(1)}, other / "model.safetensors")
    index = sharded(tmp_path / "m")
    entry = str(other / "model.safetensors") if entry == "ABSOLUTE" else entry
    key = sorted(index["weight_map"])[0]
    index["weight_map"][key] = entry
    (tmp_path / "m" / INDEX).write_text(json.dumps(index))
    refused(tmp_path / "m", entry, key, "outside")


def test_a_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to("/etc/passwd")
    refused(folder, "model.safetensors", "/etc/passwd", "outside")


def test_a_key_listed_twice_is_refused(tmp_path: Path) -> None:
    index = sharded(tmp_path / "m")
    key = sorted(index["weight_map"])[0]
    raw = json.dumps(index)
    raw = raw.replace('"weight_map": {', f'"weight_map": {{"{key}": "b.safetensors", ', 1)
    (tmp_path / "m" / INDEX).write_text(raw)
    refused(tmp_path / "m", INDEX, key, "twice")


def test_an_integer_tensor_for_a_float_parameter_is_refused(tmp_path: Path) -> None:
    index = sharded(tmp_path / "m")
    key = "transformer.wte.weight"
    path = tmp_path / "m" / index["weight_map"][key]
    header, body = header_of(path)
    header[key]["dtype"] = "I32"  # same size as F32: the bytes are read as integers
    write_with_header(path, header, body)
    refused(tmp_path / "m", path.name, key, "I32")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _garbage_header(path: Path) -> None:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    path.write_bytes(data[:8] + b"\x00\xff" * (length // 2) + data[8 + length:])


def _huge_header_length(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 2 ** 62) + path.read_bytes()[8:])


def _offsets_past_the_end(path: Path) -> None:
    header, body = header_of(path)
    key = next(k for k in header if k != "__metadata__")
    header[key]["data_offsets"] = [0, len(body) + 64]
    write_with_header(path, header, body)


@pytest.mark.parametrize("damage", [_truncate, _garbage_header, _huge_header_length,
                                    _offsets_past_the_end])
def test_a_damaged_weight_file_is_named(tmp_path: Path, damage: Callable[[Path], None]) -> None:
    sharded(tmp_path / "m")
    damage(tmp_path / "m" / "b.safetensors")
    refused(tmp_path / "m", "b.safetensors", "not a readable safetensors file")


def test_a_damaged_index_is_named(tmp_path: Path) -> None:
    index = sharded(tmp_path / "m")
    (tmp_path / "m" / INDEX).write_text("{not json")
    refused(tmp_path / "m", INDEX, "not JSON")
    (tmp_path / "m" / INDEX).write_text(json.dumps({"metadata": {}}))
    refused(tmp_path / "m", INDEX, "weight_map")
    key = sorted(index["weight_map"])[-1]
    index["weight_map"][key] = "a.safetensors"  # a file that does not hold it
    (tmp_path / "m" / INDEX).write_text(json.dumps(index))
    refused(tmp_path / "m", "a.safetensors", key, "does not hold")
    index["weight_map"][key] = "c.safetensors"  # a file that does not exist
    (tmp_path / "m" / INDEX).write_text(json.dumps(index))
    refused(tmp_path / "m", "c.safetensors", "does not exist")
