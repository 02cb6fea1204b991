"""LanguageCrossEntropy / LanguagePerplexity against closed forms and torch's cross entropy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cadence.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity


@pytest.mark.parametrize("vocab", [7, 128, 4096])
def test_uniform_model_perplexity_is_vocab_size(vocab: int) -> None:
    logits = torch.full((3, 5, vocab), 0.25)          # equal logits: uniform distribution
    target = torch.randint(0, vocab, (3, 5))
    ce, ppl = LanguageCrossEntropy(), LanguagePerplexity()
    ce.update(logits, target)
    ppl.update(logits, target)
    assert ce.compute().item() == pytest.approx(math.log(vocab), abs=1e-4)
    assert ppl.compute().item() == pytest.approx(vocab, rel=1e-4)


def test_matches_torch_cross_entropy() -> None:
    torch.manual_seed(0)
    logits, target = torch.randn(2, 6, 11), torch.randint(0, 11, (2, 6))
    metric = LanguageCrossEntropy()
    metric.update(logits, target)
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1))
    assert metric.compute().item() == pytest.approx(expected.item(), abs=1e-5)


def test_ignore_index_positions_do_not_count() -> None:
    torch.manual_seed(0)
    logits, target = torch.randn(2, 6, 11), torch.randint(0, 11, (2, 6))
    target[0, :4] = -100
    target[1, 5] = -100
    metric = LanguagePerplexity()
    metric.update(logits, target)
    keep = target != -100
    expected = F.cross_entropy(logits[keep], target[keep])   # over the 7 kept tokens only
    assert int(metric.total_items) == 7
    assert metric.compute().item() == pytest.approx(math.exp(expected.item()), rel=1e-5)


def test_custom_ignore_index() -> None:
    logits = torch.zeros(1, 4, 5)
    target = torch.tensor([[0, 1, 0, 0]])
    metric = LanguageCrossEntropy(ignore_index=0)
    metric.update(logits, target)
    assert int(metric.total_items) == 1


def test_mean_is_token_weighted_across_batches() -> None:
    torch.manual_seed(0)
    a_logits, a_target = torch.randn(1, 8, 9), torch.randint(0, 9, (1, 8))
    b_logits, b_target = torch.randn(1, 2, 9), torch.randint(0, 9, (1, 2))
    metric = LanguageCrossEntropy()
    metric.update(a_logits, a_target)
    metric.update(b_logits, b_target)
    both_logits = torch.cat([a_logits, b_logits], dim=1)
    both_target = torch.cat([a_target, b_target], dim=1)
    expected = F.cross_entropy(both_logits.reshape(-1, 9), both_target.reshape(-1))
    assert metric.compute().item() == pytest.approx(expected.item(), abs=1e-5)
    metric.reset()
    assert int(metric.total_items) == 0 and float(metric.sum_loss) == 0.0


def test_accepts_mapping_with_logits_and_bf16() -> None:
    logits = torch.zeros(2, 3, 16, dtype=torch.bfloat16)
    metric = LanguagePerplexity()
    metric.update({"logits": logits}, torch.zeros(2, 3, dtype=torch.long))
    assert metric.compute().item() == pytest.approx(16.0, rel=1e-4)


def test_shape_mismatch_is_a_value_error() -> None:
    metric = LanguageCrossEntropy()
    with pytest.raises(ValueError, match=r"logits\[:, :-1\] and labels\[:, 1:\]"):
        metric.update(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="logits"):
        metric.update([1, 2], torch.zeros(2, dtype=torch.long))
