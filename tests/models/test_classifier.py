"""ComposerClassifier, soft_cross_entropy and the CrossEntropy / LossMetric / MaskedAccuracy
metrics, checked against Composer's documented API and hand computation."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from cadence import Trainer
from cadence.loss import loss_registry, soft_cross_entropy
from cadence.models import ComposerClassifier, CrossEntropy, LossMetric, MaskedAccuracy
from cadence.loggers import InMemoryLogger
from tests.common.models import make_dataloader


def test_soft_cross_entropy_signature_matches_composer() -> None:
    params = inspect.signature(soft_cross_entropy).parameters
    assert list(params) == ["input", "target", "weight", "size_average", "ignore_index",
                            "reduce", "reduction"]
    assert params["ignore_index"].default == -100 and params["reduction"].default == "mean"
    assert loss_registry["soft_cross_entropy"] is soft_cross_entropy


def test_soft_cross_entropy_indices_is_torch_cross_entropy() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    target = torch.tensor([0, -100])
    assert torch.equal(soft_cross_entropy(logits, target), F.cross_entropy(logits, target))


def test_soft_cross_entropy_dense_targets_by_hand() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    probs = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.5, 0.5]])
    log_p = logits.log_softmax(dim=1)
    per_sample = [-(0.9 * log_p[0, 0] + 0.1 * log_p[0, 1]),
                  -(0.5 * log_p[1, 1] + 0.5 * log_p[1, 2])]
    assert soft_cross_entropy(logits, probs).item() == pytest.approx(
        float(sum(per_sample)) / 2, rel=1e-6)
    assert soft_cross_entropy(logits, probs, reduction="sum").item() == pytest.approx(
        float(sum(per_sample)), rel=1e-6)
    none = soft_cross_entropy(logits, probs, reduction="none")
    assert none.tolist() == pytest.approx([float(v) for v in per_sample], rel=1e-6)
    # one-hot targets equal class indices
    one_hot = F.one_hot(torch.tensor([0, 2]), 3).float()
    assert soft_cross_entropy(logits, one_hot).item() == pytest.approx(
        F.cross_entropy(logits, torch.tensor([0, 2])).item(), rel=1e-6)
    # class weights multiply each class's term (unnormalised, as Composer)
    weight = torch.tensor([2.0, 1.0, 1.0])
    expected = (-(0.9 * 2 * log_p[0, 0] + 0.1 * log_p[0, 1]) + per_sample[1]) / 2
    assert soft_cross_entropy(logits, probs, weight=weight).item() == pytest.approx(
        float(expected), rel=1e-6)


def test_soft_cross_entropy_rows_of_zeros_are_ignored_in_the_mean() -> None:
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    probs = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    with pytest.warns(UserWarning, match="less than 1"):
        loss = soft_cross_entropy(logits, probs)
    assert loss.item() == pytest.approx(-logits.log_softmax(1)[0, 0].item(), rel=1e-6)
    with pytest.raises(ValueError, match="no target has nonzero probability"):
        soft_cross_entropy(logits, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="Cannot tell the target type"):
        soft_cross_entropy(logits, torch.zeros(2, 2, 2))


def test_cross_entropy_metric_is_the_mean_of_batch_means() -> None:
    metric = CrossEntropy()
    a_logits, a_target = torch.tensor([[3.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 1, 0])
    b_logits, b_target = torch.tensor([[0.0, 2.0]]), torch.tensor([0])
    metric.update(a_logits, a_target)
    metric.update(b_logits, b_target)
    expected = (F.cross_entropy(a_logits, a_target) + F.cross_entropy(b_logits, b_target)) / 2
    assert metric.compute().item() == pytest.approx(expected.item(), rel=1e-6)


def test_loss_metric_wraps_any_loss() -> None:
    metric = LossMetric(torch.nn.MSELoss())
    metric.update(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))  # mse 2.5
    metric.update(torch.tensor([1.0]), torch.tensor([1.0]))            # mse 0
    assert metric.compute().item() == pytest.approx(1.25)
    with pytest.raises(TypeError, match="callable"):
        LossMetric("mse")  # type: ignore[arg-type]


def test_masked_accuracy_skips_ignore_index() -> None:
    metric = MaskedAccuracy()
    assert metric.ignore_index == -100
    preds = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]])   # argmax [0, 1, 0]
    target = torch.tensor([[0, 0, -100]])
    metric.update(preds, target)
    assert metric.compute().item() == pytest.approx(0.5)
    metric.update(torch.tensor([[0.1, 0.9]]), torch.tensor([1]))
    assert metric.compute().item() == pytest.approx(2 / 3)


class _Net(torch.nn.Module):
    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, num_classes)
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_classifier_signature_and_default_metrics() -> None:
    params = inspect.signature(ComposerClassifier).parameters
    assert list(params) == ["module", "num_classes", "train_metrics", "val_metrics", "loss_fn"]
    assert params["loss_fn"].default is soft_cross_entropy
    model = ComposerClassifier(torch.nn.Linear(8, 3), num_classes=3)
    assert set(model.get_metrics(is_train=True)) == {"MulticlassAccuracy"}
    assert set(model.get_metrics(is_train=False)) == {"CrossEntropy", "MulticlassAccuracy"}
    assert isinstance(model.val_metrics, MetricCollection)


def test_classifier_num_classes_from_the_module_and_errors() -> None:
    with pytest.warns(UserWarning, match="does not match"):
        model = ComposerClassifier(_Net(3), num_classes=5)
    assert model.num_classes == 3
    with pytest.raises(ValueError, match="number of classes"):
        ComposerClassifier(torch.nn.Linear(8, 3))
    metric = MulticlassAccuracy(num_classes=3)
    model = ComposerClassifier(torch.nn.Linear(8, 3), train_metrics=metric, val_metrics=metric)
    assert model.num_classes is None


def test_classifier_forward_loss_and_training() -> None:
    torch.manual_seed(0)
    model = ComposerClassifier(_Net(3))
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    outputs = model((x, y))
    assert outputs.shape == (4, 3)
    assert model.loss(outputs, (x, y)).item() == pytest.approx(
        F.cross_entropy(outputs, y).item(), rel=1e-6)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      eval_dataloader=make_dataloader(num_batches=1, seed=1), max_duration="1ep",
                      loggers=[memory], progress_bar=False, seed=0, log_interval=1)
    trainer.fit()
    trainer.close()
    values = memory.most_recent_values
    assert 0.0 <= values["metrics/eval/MulticlassAccuracy"] <= 1.0
    assert math.isfinite(values["metrics/eval/CrossEntropy"])
    assert "metrics/train/MulticlassAccuracy" in values


def test_composer_model_logger_is_the_runs_logger() -> None:
    class Logs(ComposerClassifier):
        def loss(self, outputs, batch, *args, **kwargs):  # type: ignore[override]
            loss = super().loss(outputs, batch)
            if self.logger is not None:
                self.logger.log_metrics({"model/extra": 1.0})
            return loss

    model = Logs(torch.nn.Linear(8, 3), num_classes=3)
    assert model.logger is None
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", loggers=[memory], progress_bar=False, seed=0)
    assert model.logger is trainer.logger
    trainer.fit()
    trainer.close()
    assert len(memory.data["model/extra"]) == 2


def test_huggingface_use_logits_squeezes_single_label_logits() -> None:
    import inspect

    from transformers import BertConfig, BertForSequenceClassification

    from cadence.models import HuggingFaceModel

    assert inspect.signature(HuggingFaceModel).parameters["use_logits"].default is False
    config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, num_labels=1)
    torch.manual_seed(0)
    net = BertForSequenceClassification(config)
    batch = {"input_ids": torch.randint(0, 32, (4, 5)), "labels": torch.randn(4)}
    mse = [LossMetric(torch.nn.functional.mse_loss)]  # a regression head: no accuracy
    plain = HuggingFaceModel(net, eval_metrics=mse)
    squeezing = HuggingFaceModel(net, eval_metrics=mse, use_logits=True)
    assert squeezing.use_logits is True
    plain.eval()
    with torch.no_grad():
        assert plain.eval_forward(batch).shape == (4, 1)
        logits = squeezing.eval_forward(batch)
    assert logits.shape == (4,)
    metric = LossMetric(torch.nn.functional.mse_loss)
    squeezing.update_metric(batch, logits, metric)
    assert metric.compute().item() == pytest.approx(
        torch.nn.functional.mse_loss(logits, batch["labels"]).item(), rel=1e-6)
