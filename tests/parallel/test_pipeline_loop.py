"""The loop under a pipeline (``parallelism_config.pp``): evaluation, ``predict``, train
metrics, the algorithms that run (EMA, label smoothing, surgery at INIT) and the refusals,
each on 2 gloo ranks against one process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from cadence.models.gpt import gpt2
from tests.algorithms.algorithm_helpers import CountingTokens
from tests.common.distributed import run_in_processes

STEPS = 3
GLOBAL_BATCH = 8
SEQ = 8
VOCAB = 64
RTOL = 1e-5  # fp32: the same kernels; only the order of sums differs
ATOL_WEIGHTS = 1e-5  # SGD: AdamW's normalised steps would amplify it on tiny gradients
PP = {"pp": {"pipeline_parallel_degree": 2}}
EVAL = "metrics/eval/LanguageCrossEntropy"
TRAIN = "metrics/train/LanguageCrossEntropy"


def counting_tokens(num_samples: int = STEPS * GLOBAL_BATCH, seed: int = 1234) -> Dataset:
    """Counting sequences ``{"input_ids", "labels"}: [SEQ]``."""
    return CountingTokens(num_samples, seed=seed, seq_len=SEQ, vocab_size=VOCAB)


def tiny_gpt2(train_metrics: bool = False, **kwargs: Any) -> Any:
    """A 4-block GPT-2 (untied embeddings: pipeline stages cannot share a weight); with
    ``train_metrics`` it also has a train ``LanguageCrossEntropy`` (and that as eval metric)."""
    from cadence.metrics.nlp import LanguageCrossEntropy
    from cadence.models.huggingface import HuggingFaceModel

    torch.manual_seed(0)
    model = gpt2(n_layer=4, n_head=2, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ,
                 tie_word_embeddings=False, **kwargs)
    if train_metrics:
        model = HuggingFaceModel(model.model, metrics=[LanguageCrossEntropy()])
    return model


def train_loader(data_parallel: int = 1) -> DataLoader:
    dataset = counting_tokens()
    return DataLoader(dataset, batch_size=GLOBAL_BATCH // data_parallel,
                      sampler=dist.get_sampler(dataset, shuffle=False))


def eval_loader() -> DataLoader:
    """10 samples in batches of 4, 4 and 2 (the last one smaller)."""
    dataset = counting_tokens(10, seed=7)
    return DataLoader(dataset, batch_size=4, sampler=dist.get_sampler(dataset, shuffle=False))


def run(parallelism_config: Optional[dict[str, Any]], train_metrics: bool = False,
        data_parallel: int = 1, **trainer_kwargs: Any) -> dict[str, Any]:
    """STEPS SGD steps with an eval after every batch, then ``eval()`` and ``predict()``
    on :func:`eval_loader`: everything rank 0's logger saw, the results, the logits and the
    model's parameters by name (this rank's stages' under a pipeline)."""
    model = tiny_gpt2(train_metrics)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=train_loader(data_parallel),
                      eval_dataloader=eval_loader(), eval_interval="1ba",
                      max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=parallelism_config, device="cpu", **trainer_kwargs)
    trainer.fit()
    standalone = trainer.eval(eval_loader())
    predicted = trainer.predict(DataLoader(counting_tokens(10, seed=7), batch_size=4))
    params = {n: p.detach().clone() for n, p in trainer.state.model.named_parameters()}
    trainer.close()
    logged = {key: [float(v) for _, v in values] for key, values in memory.data.items()
              if key.startswith(("metrics/", "loss/"))}
    return {"logged": logged, "eval": standalone,
            "logits": [p.logits for p in predicted], "params": params}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """One process: the same run, with train metrics."""
    result = run(None, train_metrics=True)
    assert len(result["logged"][EVAL]) == STEPS + 1  # after each batch, then eval()
    assert [tuple(l.shape) for l in result["logits"]] == [(4, SEQ, VOCAB)] * 2 + [(2, SEQ, VOCAB)]
    return result


def _same_run(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got["logged"].keys() == expected["logged"].keys()
    for key, values in expected["logged"].items():
        assert got["logged"][key] == pytest.approx(values, rel=RTOL), (key, got["logged"][key], values)
    assert got["eval"] == pytest.approx(expected["eval"], rel=RTOL)
    assert len(got["logits"]) == len(expected["logits"])
    for mine, theirs in zip(got["logits"], expected["logits"]):
        torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=1e-5)
    assert got["params"] and set(got["params"]) < set(expected["params"])  # its stages only
    for name, value in got["params"].items():
        torch.testing.assert_close(value, expected["params"][name], rtol=RTOL,
                                   atol=ATOL_WEIGHTS)


@pytest.mark.world_size(2)
def test_eval_predict_and_train_metrics_under_pp2_match_one_process(
        reference: dict[str, Any]) -> None:
    # fit with an eval_dataloader / eval_interval, eval() on batches of 4, 4 and 2, predict()
    # (every rank gets the last stage's logits), train metrics: 1F1B, then a V schedule
    # whose last stage is on rank 0
    _same_run(run(PP, train_metrics=True), reference)
    v = {"pp": {"pipeline_parallel_degree": 2, "schedule": "ZBVZeroBubble",
                "num_microbatches": 4}}
    _same_run(run(v, train_metrics=True), reference)
    # what needs the whole model on one rank stays refused, naming it and the reason
    from cadence.callbacks import Generate

    trainer = Trainer(model=tiny_gpt2(), train_dataloader=train_loader(), max_duration="1ba",
                      progress_bar=False, device="cpu", parallelism_config=PP)
    with pytest.raises(ValueError, match=r"Trainer.export_for_inference\(\) is not supported "
                                         r"under pipeline parallelism .*: it needs the whole "
                                         r"model on one rank"):
        trainer.export_for_inference("torchscript", "model.pt")
    trainer.close()
    with pytest.raises(ValueError, match="callback Generate: not supported under pipeline "
                                         "parallelism: it generates text autoregressively"):
        Trainer(model=tiny_gpt2(), train_dataloader=train_loader(), max_duration="1ba",
                progress_bar=False, device="cpu", parallelism_config=PP,
                callbacks=[Generate(["a"], "1ba")])


def _ema() -> Any:
    from cadence.algorithms import EMA

    return EMA(smoothing=0.5)  # a short memory: the EMA differs from the weights


def _label_smoothing() -> Any:
    from cadence.algorithms import LabelSmoothing

    return LabelSmoothing(0.1, target_key="labels")


@pytest.fixture(scope="module")
def ema_reference() -> dict[str, Any]:
    """One process with EMA and label smoothing: evaluations use the EMA weights, which are
    the model's after fit."""
    plain = run(None)
    result = run(None, algorithms=[_ema(), _label_smoothing()])
    assert result["logged"]["loss/train/total"] != pytest.approx(
        plain["logged"]["loss/train/total"], rel=1e-3)  # label smoothing changes the loss
    assert result["logged"][EVAL][1:] != pytest.approx(plain["logged"][EVAL][1:], rel=1e-3)
    return result


@pytest.mark.world_size(2)
def test_ema_and_label_smoothing_under_pp2_match_one_process(
        ema_reference: dict[str, Any]) -> None:
    # each rank averages its stages' parameters (together the whole model's EMA); label
    # smoothing runs in the schedule's loss function on the last stage
    _same_run(run(PP, algorithms=[_ema(), _label_smoothing()]), ema_reference)


def _ema_resume(folder: str) -> None:
    """PP=2 with EMA for STEPS steps, saving after step 2; then resumed on PP=2 from step 2:
    the same losses and the same EMA (the weights after fit) as the uninterrupted run."""
    whole = run(PP, algorithms=[_ema()], save_folder=f"{folder}/run", save_interval="2ba")
    dist.barrier()
    step2 = sorted(Path(folder, "run").glob("*ba2*"))
    assert len(step2) == 1
    resumed = run(PP, algorithms=[_ema()], load_path=str(step2[0]))
    losses = whole["logged"]["loss/train/total"]
    assert resumed["logged"]["loss/train/total"] == pytest.approx(losses[2:], rel=RTOL)
    assert resumed["params"].keys() == whole["params"].keys()
    for name, value in whole["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, rtol=RTOL,
                                   atol=ATOL_WEIGHTS)
    if dist.get_global_rank() == 0:
        Path(folder, "done.json").write_text(json.dumps(losses))


def test_ema_state_resumes_from_a_pipeline_checkpoint(tmp_path: Path) -> None:
    run_in_processes(2, __file__, "_ema_resume", {"folder": str(tmp_path)}, timeout=300)
    assert len(json.loads((tmp_path / "done.json").read_text())) == STEPS


# ---------------------------------------------------------------------- the contract
# Every registered algorithm and callback under PP=2: it trains (the single-process losses,
# or finite and falling where it draws random numbers per stage) or it is refused at INIT
# with a message naming it and the reason. Constructor arguments: the contract test's
# (tests/test_contracts.py), with the language model's metric for the stoppers.
AMP = {"low_precision_layernorm", "low_precision_groupnorm"}  # they act under amp_bf16 only
# finite and falling: gyro_dropout's masks come from each rank's stream, not the one
# process's; under amp_bf16 the microbatches' rounding differs from the one batch's
INEXACT = {"gyro_dropout", *AMP}
CONTRACT_OVERRIDES: dict[str, dict[str, Any]] = {
    "label_smoothing": {"target_key": "labels"},
    "early_stopper": {"monitor": "LanguageCrossEntropy", "dataloader_label": "eval"},
    "threshold_stopper": {"monitor": "LanguageCrossEntropy", "dataloader_label": "eval",
                          "threshold": -1.0},  # never reached: the run is not cut short
    "generate": {"prompts": ["a"], "interval": "1ba"},  # refused before it needs a tokenizer
    "image_visualizer": {"input_key": "input_ids", "interval": "1ba"},  # not images: a no-op
}


def _contract_kwargs(name: str) -> dict[str, Any]:
    from tests.test_contracts import REQUIRED_KWARGS

    return {**REQUIRED_KWARGS.get(name, {}), **CONTRACT_OVERRIDES.get(name, {})}


def _contract_run(parallelism_config: Optional[dict[str, Any]], **components: Any
                  ) -> list[float]:
    """STEPS SGD steps (with an eval at the end) and their logged losses."""
    names = {type(c).__name__ for c in components.get("algorithms", [])}
    model = tiny_gpt2(dropout=0.1) if "GyroDropout" in names else tiny_gpt2()
    if names & {"LowPrecisionLayerNorm", "LowPrecisionGroupNorm"}:
        components["precision"] = "amp_bf16"
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=train_loader(),
                      eval_dataloader=eval_loader(), eval_interval=f"{STEPS}ba",
                      max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=parallelism_config, device="cpu", **components)
    trainer.fit()
    trainer.close()
    return [float(v) for _, v in memory.data["loss/train/total"]]


def _algorithm(name: str) -> Any:
    import warnings

    from cadence.registry import algorithms

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return algorithms.get(name)(**_contract_kwargs(name))


def _supported(algorithm: Any) -> bool:
    from cadence.trainer.pipeline_step import _runs_under_pipeline

    return _runs_under_pipeline(algorithm) is None


@pytest.fixture(scope="module")
def contract_reference() -> dict[str, Any]:
    """One process: the plain run's losses (``""``) and each algorithm's that runs under a
    pipeline (``gyro_dropout``: on the model with dropout it needs), or the error with which
    it refuses this model (``gated_linear_units``: BERT only)."""
    from cadence.registry import algorithms

    result: dict[str, Any] = {"": _contract_run(None)}
    for name in algorithms.names():
        algorithm = _algorithm(name)
        if _supported(algorithm):
            try:
                result[name] = _contract_run(None, algorithms=[algorithm])
            except (TypeError, ValueError) as exc:  # not for this model (BERT only, ...)
                result[name] = f"{type(exc).__name__}: {exc}"
    return result


def _expect_refusal(what: str, cls: str, build: Any) -> None:
    with pytest.raises(ValueError) as info:
        build()
    assert f"{what} {cls}: not supported under pipeline parallelism: " in str(info.value), \
        str(info.value)


@pytest.mark.slow
@pytest.mark.world_size(2)
@pytest.mark.filterwarnings("ignore")
def test_every_algorithm_and_callback_runs_or_is_refused_under_pp2(
        contract_reference: dict[str, Any], tmp_path: Path) -> None:
    import os

    from cadence.registry import algorithms, callbacks
    from cadence.trainer.pipeline_step import CALLBACK_REASONS

    os.chdir(tmp_path)  # callbacks that write files write them here
    ran, refused = set(), set()
    for name in algorithms.names():
        algorithm = _algorithm(name)
        cls = type(algorithm).__name__
        if not _supported(algorithm):
            _expect_refusal("algorithm", cls, lambda: _contract_run(PP, algorithms=[algorithm]))
            refused.add(name)
            continue
        expected = contract_reference[name]
        if isinstance(expected, str):  # it refuses this model without a pipeline too
            with pytest.raises((TypeError, ValueError)) as info:
                _contract_run(PP, algorithms=[algorithm])
            assert f"{type(info.value).__name__}: {info.value}" == expected
            continue
        losses = _contract_run(PP, algorithms=[algorithm])
        assert all(map(torch.isfinite, torch.tensor(losses))), name
        if name in INEXACT:
            assert losses[-1] < losses[0], (name, losses)
        else:
            assert losses == pytest.approx(expected, rel=RTOL), name
        ran.add(name)
    assert {"gradient_clipping", "ema", "label_smoothing", "low_precision_layernorm",
            "activation_checkpointing", "gyro_dropout"} <= ran
    assert {"sam", "swa", "selective_backprop", "seq_length_warmup", "alibi", "cutmix",
            "layer_freezing"} <= refused
    # Alibi without reshaping batches is surgery at INIT only: it runs
    from cadence.algorithms import Alibi

    losses = _contract_run(PP, algorithms=[Alibi(2 * SEQ, train_sequence_length_scaling=1.0)])
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < losses[0]

    saved = None
    for name in callbacks.names():
        kwargs = _contract_kwargs(name)
        if name == "load_checkpoint":  # the weights of a PP run before this one
            if saved is None:
                saved = str(tmp_path / "saved")
                _contract_run(PP, save_folder=saved, save_interval=f"{STEPS}ba")
            kwargs = {"load_path": str(sorted(Path(saved).glob(f"*ba{STEPS}*"))[0]),
                      "load_weights_only": True}
        callback = callbacks.get(name)(**kwargs)
        cls = type(callback).__name__
        if cls in CALLBACK_REASONS:
            _expect_refusal("callback", cls, lambda: _contract_run(PP, callbacks=[callback]))
            continue
        losses = _contract_run(PP, callbacks=[callback])
        if name == "load_checkpoint":  # it starts from trained weights
            assert losses[0] < contract_reference[""][0], losses
        else:
            assert losses == pytest.approx(contract_reference[""], rel=RTOL), name


@pytest.mark.slow
@pytest.mark.world_size(4)
def test_eval_and_train_metrics_under_pp2_x_fsdp2_match_one_process(
        reference: dict[str, Any]) -> None:
    # each stage sharded over 2 data-parallel ranks: the eval set (10 samples, padded to 12
    # by the sampler, the copies left out) split over them, the metric states synced over
    # the last stage's data-parallel pair and copied along each pipeline
    config = {"pp": {"pipeline_parallel_degree": 2, "num_microbatches": 2}, "fsdp": {}}
    got = run(config, train_metrics=True, data_parallel=2)
    for key, values in reference["logged"].items():
        assert got["logged"][key] == pytest.approx(values, rel=RTOL), key
    assert got["eval"] == pytest.approx(reference["eval"], rel=RTOL)
