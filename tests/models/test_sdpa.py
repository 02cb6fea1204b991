"""The ``gpt2`` builder's ``attn_implementation="sdpa"`` really runs
``torch.nn.functional.scaled_dot_product_attention``, and computes what ``"eager"`` does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.models.gpt import gpt2

N_LAYER, VOCAB, SEQ = 3, 64, 12


def build(attn_implementation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return gpt2(n_layer=N_LAYER, n_head=2, n_embd=16, vocab_size=VOCAB, max_seq_len=SEQ,
                attn_implementation=attn_implementation)


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "labels": ids.clone()}


def count_sdpa_calls(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> int:
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)  # query [batch, heads, seq, head_dim]
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    model(batch())
    monkeypatch.undo()
    return len(calls)


def test_default_is_sdpa_and_calls_it_once_per_layer(monkeypatch):
    model = gpt2(n_layer=N_LAYER, n_head=2, n_embd=16, vocab_size=VOCAB, max_seq_len=SEQ)
    assert model.model.config._attn_implementation == "sdpa"
    assert count_sdpa_calls(model, monkeypatch) == N_LAYER


def test_eager_does_not_call_sdpa(monkeypatch):
    model = build("eager")
    assert model.model.config._attn_implementation == "eager"
    assert count_sdpa_calls(model, monkeypatch) == 0


def test_sdpa_and_eager_agree():
    sdpa, eager = build("sdpa"), build("eager")
    eager.load_state_dict(sdpa.state_dict())
    out_sdpa, out_eager = sdpa(batch()), eager(batch())
    torch.testing.assert_close(out_sdpa.logits, out_eager.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_sdpa.loss, out_eager.loss, rtol=1e-5, atol=1e-6)
