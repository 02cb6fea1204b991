"""ExportForInferenceCallback: the trained model is exported at FIT_END and the exported
TorchScript module gives the trained model's outputs."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from cadence import Trainer
from cadence.callbacks import ExportForInferenceCallback
from cadence.registry import registry
from tests.common.models import make_dataloader


class _Mlp(torch.nn.Module):
    """A scriptable classifier: ``x [batch, 8] -> logits [batch, 3]`` (a plain module, as
    Composer's tests export)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _jit_load(path: Path) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():  # TorchScript is deprecated in recent torch
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        return torch.jit.load(str(path))


@pytest.mark.parametrize("through_logger", [False, True])
def test_exports_torchscript_at_fit_end(tmp_path: Path, through_logger: bool) -> None:
    pytest.importorskip("cadence.utils.inference",
                        reason="cadence.utils.export_for_inference is being written (issue 20.7)")
    from cadence.loggers import RemoteUploaderDownloader
    from cadence.models import ComposerClassifier

    model = ComposerClassifier(_Mlp(), num_classes=3)
    store = tmp_path / "store"
    loggers = [RemoteUploaderDownloader(f"file://{store}")] if through_logger else []
    save_path = "exported/model.pt" if through_logger else str(tmp_path / "model.pt")
    trainer = Trainer(model=model, train_dataloader=make_dataloader(3), max_duration="3ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.5), loggers=loggers,
                      callbacks=[ExportForInferenceCallback("torchscript", save_path)],
                      progress_bar=False, device="cpu", seed=0)
    trained_before = model.module.net[0].weight.detach().clone()
    trainer.fit()
    trainer.close()
    assert not torch.equal(model.module.net[0].weight, trained_before)
    exported = _jit_load(store / save_path if through_logger else Path(save_path))
    batch = (torch.randn(5, 8), torch.zeros(5, dtype=torch.long))  # (inputs, targets)
    model.eval()
    with torch.no_grad():  # the trained weights, as they were at FIT_END
        torch.testing.assert_close(exported(batch), model(batch))


def test_arguments() -> None:
    with pytest.raises(ValueError, match="save_format.*'pickle'"):
        ExportForInferenceCallback("pickle", "/tmp/x")
    assert registry.callbacks.get("export_for_inference") is ExportForInferenceCallback


class _Unscriptable(torch.nn.Module):
    """``x [batch, 8] -> logits [batch, 3]`` through a lambda, which TorchScript cannot
    compile (as the built-in ``gpt2``'s transformers code)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (lambda t: self.net(t))(x)


def test_an_unscriptable_model_is_refused_before_training(tmp_path: Path) -> None:
    """A TorchScript export without ``sample_input`` that cannot script the model fails at
    ``FIT_START``, naming the model and the fixes, not after every batch has trained."""
    from cadence.models import ComposerClassifier

    model = ComposerClassifier(_Unscriptable(), num_classes=3)
    trainer = Trainer(model=model, train_dataloader=make_dataloader(3), max_duration="3ba",
                      callbacks=[ExportForInferenceCallback("torchscript",
                                                            str(tmp_path / "m.pt"))],
                      progress_bar=False, device="cpu", seed=0)
    with pytest.raises(ValueError, match=r"ComposerClassifier cannot be exported as "
                                         r"TorchScript.*sample_input.*onnx"):
        trainer.fit()
    assert int(trainer.state.timestamp.batch) == 0
    assert not (tmp_path / "m.pt").exists()
    trainer.close()
