"""Composer's remaining callbacks and RemoteUploaderDownloader are nameable in a run file:
their names and arguments pass the run-file check, and a misspelt argument is named."""

from __future__ import annotations

from cadence.config.schema import check_schema

_SECTIONS = ("callbacks", "loggers")


def _problems(raw: dict) -> list[str]:
    _, problems = check_schema(raw)
    return [str(p) for p in problems if str(p).startswith(_SECTIONS)]


def test_each_is_accepted_with_its_arguments() -> None:
    assert _problems({
        "callbacks": {
            "activation_monitor": {"interval": "10ba", "ignore_module_types": ["dropout"]},
            "free_outputs": None,
            "load_checkpoint": {"load_path": "pretrained.pt", "load_weights_only": True,
                                "event": "fit_start"},
            "memory_snapshot": {"skip_batches": 2, "interval": "3ba"},
            "oom_observer": {"max_entries": 1000},
            "system_metrics_monitor": {"log_all_data": True},
            "export_for_inference": {"save_format": "torchscript", "save_path": "model.pt"},
        },
        "loggers": {"remote_uploader_downloader": {"bucket_uri": "s3://bucket/runs",
                                                   "num_concurrent_uploads": 2},
                    "console": {"log_interval": "5ba", "stream": "stdout"}},
    }) == []


def test_a_misspelt_argument_is_named() -> None:
    problems = _problems({"callbacks": {"activation_monitor": {"intervall": "10ba"}},
                          "loggers": {"remote_uploader_downloader": {"bucket": "s3://b"}}})
    assert any("intervall" in p and "Did you mean 'interval'" in p for p in problems)
    assert any("'bucket_uri'" in p for p in problems)
