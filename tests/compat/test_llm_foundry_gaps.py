"""Composer behaviours llm-foundry 0.22.0 relies on that its end-to-end run
(``tests/compat/llm_foundry.py``) found missing in cadence, one test each."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cadence.utils import dist


def test_local_rank_zero_download_and_wait_is_a_context_manager_rank_zero_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # llm-foundry's ICL datasets: ``with dist.local_rank_zero_download_and_wait(dest): if
    # local rank 0: get_file(uri, dest)``; local rank 0 enters at once and makes the file
    monkeypatch.setenv("LOCAL_RANK", "0")
    target = tmp_path / "task.jsonl"
    with dist.local_rank_zero_download_and_wait(str(target)):
        assert not target.exists()
        target.write_text("{}\n")
    assert target.read_text() == "{}\n"


def test_local_rank_zero_download_and_wait_holds_other_ranks_until_the_file_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    target = tmp_path / "task.jsonl"
    waiting = threading.Event()
    original_sleep = dist.time.sleep

    def sleep(seconds: float) -> None:  # the first poll found no file: local rank 0 writes it
        waiting.set()
        original_sleep(seconds)

    monkeypatch.setattr(dist.time, "sleep", sleep)
    writer = threading.Thread(target=lambda: (waiting.wait(60), target.write_text("x")))
    writer.start()
    with dist.local_rank_zero_download_and_wait(str(target)):
        seen = target.read_text()
    writer.join()
    assert waiting.is_set() and seen == "x"
