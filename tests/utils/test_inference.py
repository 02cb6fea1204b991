"""export_for_inference: a ComposerClassifier scripts to TorchScript and loads back with
the eager model's outputs; a checkpoint's weights are exported; surgery and transforms run
on a copy; ONNX runs in onnxruntime (when installed); Trainer.export_for_inference; bad
input is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.models.tasks.classification import ComposerClassifier
from cadence.utils import ExportFormat, export_for_inference, export_with_logger
from tests.common.models import make_dataloader

# torch.jit.load in these tests: TorchScript is deprecated in recent torch, still the format
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def _classifier(seed: int = 0) -> ComposerClassifier:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                              torch.nn.Linear(16, 3))
    return ComposerClassifier(net, num_classes=3)


def _batch(n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def test_classifier_scripts_and_matches_eager(tmp_path: Path) -> None:
    model = _classifier()
    model.train()  # export runs in eval mode, on a copy
    path = tmp_path / "model.pt"
    export_for_inference(model, "torchscript", str(path))
    assert model.training  # the caller's model is untouched
    loaded = torch.jit.load(str(path))
    assert isinstance(loaded, torch.jit.ScriptModule) and not loaded.training
    x, y = _batch()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded((x, y)), model((x, y)), rtol=0, atol=0)
        torch.testing.assert_close(loaded((_batch(2)[0], y[:2])), model((_batch(2)[0], y[:2])))


def test_checkpoint_weights_surgery_and_transforms(tmp_path: Path) -> None:
    trained = _classifier(seed=0)
    trainer = Trainer(model=trained, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", progress_bar=False, seed=0, device="cpu",
                      save_folder=str(tmp_path / "run"), run_name="export")
    trainer.fit()
    (checkpoint,) = (tmp_path / "run").glob("ep*-ba2*.pt")
    calls: list[str] = []

    def surgery(model: torch.nn.Module) -> None:
        calls.append("surgery")

    def double(model: torch.nn.Module) -> torch.nn.Module:
        calls.append("transform")
        return _Scaled(model)

    fresh = _classifier(seed=1)  # other weights: the checkpoint's must win
    path = tmp_path / "model.pt"
    export_for_inference(fresh, ExportFormat.TORCHSCRIPT, str(path), load_path=str(checkpoint),
                         load_strict=True, surgery_algs=surgery, transforms=[double],
                         sample_input=(_batch(),))
    assert calls == ["surgery", "transform"]
    x, y = _batch()
    trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(path))((x, y)), 2 * trained((x, y)))


class _Scaled(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return 2 * self.model(batch)


class _Unscriptable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, x: Any) -> Any:
        return self.linear(x.get("x"))  # a dict input TorchScript cannot type as Any


def test_trace_fallback_and_errors(tmp_path: Path) -> None:
    model = _Unscriptable()
    with pytest.raises(RuntimeError, match="sample_input"):
        export_for_inference(model, "torchscript", str(tmp_path / "a.pt"))
    x = _batch()[0]
    export_for_inference(model, "torchscript", str(tmp_path / "b.pt"),
                         sample_input=({"x": x},))
    torch.testing.assert_close(torch.jit.load(str(tmp_path / "b.pt"))({"x": x}),
                               model({"x": x}))
    with pytest.raises(ValueError, match="save_format"):
        export_for_inference(model, "tflite", str(tmp_path / "c"))
    with pytest.raises(ValueError, match="sample_input"):
        export_for_inference(_classifier(), "onnx", str(tmp_path / "d.onnx"))
    with pytest.raises(TypeError, match="upload_object"):
        export_for_inference(_classifier(), "torchscript", "name", save_object_store=object())


class _Store:
    """An object store with Composer's upload_object, into a local folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def upload_object(self, object_name: str, filename: str, callback: Any = None) -> None:
        (self.root / object_name).write_bytes(Path(filename).read_bytes())


def test_trainer_export_through_an_object_store(tmp_path: Path) -> None:
    model = _classifier()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="1ba", progress_bar=False, seed=0, device="cpu")
    trainer.fit()
    trainer.export_for_inference("torchscript", "exported.pt",
                                 save_object_store=_Store(tmp_path))
    x, y = _batch()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "exported.pt"))((x, y)),
                                   model((x, y)))


class _Uploads:
    """A logger stand-in with an upload destination."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def has_file_upload_destination(self) -> bool:
        return True

    def upload_file(self, remote_file_name: str, file_path: str) -> None:
        self.files[remote_file_name] = Path(file_path).read_bytes()


def test_export_with_logger_uploads_through_the_logger() -> None:
    logger = _Uploads()
    export_with_logger(_classifier(), "torchscript", "runs/model.pt", logger)  # type: ignore[arg-type]
    assert list(logger.files) == ["runs/model.pt"] and logger.files["runs/model.pt"]


def test_onnx_matches_eager_in_onnxruntime(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    onnxruntime = pytest.importorskip("onnxruntime", reason="checking the export needs it")
    net = _classifier().module
    path = tmp_path / "model.onnx"
    x = _batch()[0]
    export_for_inference(net, "onnx", str(path), sample_input=(x,),
                         dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x7 = _batch(7)[0]
    (got,) = session.run(None, {"input": x7.numpy()})
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), net(x7), rtol=1e-5, atol=1e-6)


def test_trainer_onnx_defaults_to_the_last_batch(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    onnxruntime = pytest.importorskip("onnxruntime", reason="checking the export needs it")
    model = _classifier()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="1ba", progress_bar=False, seed=0, device="cpu")
    trainer.fit()
    trainer.export_for_inference("onnx", str(tmp_path / "model.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    x = _batch(4)[0]  # the training batch's shape: [4, 8] (no dynamic axes asked for)
    (got,) = session.run(None, {"input": x.numpy()})
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model((x, None)), rtol=1e-5,
                                   atol=1e-6)
