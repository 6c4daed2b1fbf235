from __future__ import annotations

import dataclasses

import pytest
import torch

from pgt.model import VARIANTS, FastDropout, ModelConfig, build_model, positions_from_end


@pytest.mark.parametrize("variant", VARIANTS)
def test_probabilities_sum_to_one(tiny_batch, tiny_config, variant):
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(tiny_config, variant=variant)).eval()
    out = model(*tiny_batch.inputs())
    assert out.log_probs.shape == (3, 10)
    assert torch.allclose(out.log_probs.exp().sum(dim=1), torch.ones(3), atol=1e-5)
    assert ((out.gate > 0) & (out.gate < 1)).all() if variant in ("pgt", "lstm-pg") else True


def test_gate_is_fixed_in_one_sided_variants(tiny_batch, tiny_config):
    torch.manual_seed(0)
    mhsa = build_model(dataclasses.replace(tiny_config, variant="mhsa")).eval()
    pointer = build_model(dataclasses.replace(tiny_config, variant="pointer")).eval()
    assert (mhsa(*tiny_batch.inputs()).gate == 0).all()
    out = pointer(*tiny_batch.inputs())
    assert (out.gate == 1).all()
    # pointer only: all mass on history locations, a repeated location accumulates its attention
    probs = out.log_probs.exp()
    a = out.attention
    assert torch.allclose(probs[0, 5], a[0, 0] + a[0, 2], atol=1e-6)
    assert torch.allclose(probs[0, 3], a[0, 1], atol=1e-6) and torch.allclose(probs[0, 7], a[0, 3], atol=1e-6)
    outside = torch.ones(10, dtype=torch.bool)
    outside[[5, 3, 7]] = False
    assert probs[0, outside].max() < 1e-8
    assert torch.allclose(probs[2, 9], torch.tensor(1.0), atol=1e-6)  # a one-visit history


@pytest.mark.parametrize("variant", ["pgt", "lstm-pg"])
def test_padding_gets_no_attention_and_does_not_matter(tiny_batch, tiny_config, variant):
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(tiny_config, variant=variant)).eval()
    out = model(*tiny_batch.inputs())
    assert (out.attention[1, 2:] == 0).all() and (out.attention[2, 1:] == 0).all()
    assert torch.allclose(out.attention.sum(dim=1), torch.ones(3))
    # the same histories with more padding give the same output
    padded = [torch.nn.functional.pad(t, (0, 3)) if t.dim() == 2 else t for t in tiny_batch.inputs()]
    assert torch.allclose(model(*padded).log_probs, out.log_probs, atol=1e-5)


def test_gate_mixes_the_two_distributions(tiny_batch, tiny_config):
    torch.manual_seed(0)
    model = build_model(tiny_config).eval()
    out = model(*tiny_batch.inputs())
    # location 8 is in no history: its probability comes from the generator alone, scaled by 1 - g
    model.cfg.variant = "mhsa"
    gen_only = model(*tiny_batch.inputs()).log_probs.exp()
    assert torch.allclose(out.log_probs.exp()[:, 8], (1 - out.gate) * gen_only[:, 8], atol=1e-6)


def test_positions_from_end():
    lengths, pos = positions_from_end(torch.tensor([[4, 5, 6], [7, 0, 0]]))
    assert lengths.tolist() == [3, 1] and pos.tolist() == [[3, 2, 1], [1, 0, 0]]


def test_config_checks():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(num_locations=10, num_users=3, d_model=30, nhead=4)
    with pytest.raises(ValueError, match="variant"):
        ModelConfig(num_locations=10, num_users=3, variant="gpt")


def test_fast_dropout_keeps_the_expected_share():
    torch.manual_seed(0)
    d = FastDropout(0.15)
    y = d(torch.ones(200, 1000))
    assert abs((y == 0).float().mean().item() - 0.15) < 0.005
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.85))
    assert torch.equal(d.eval()(torch.ones(3)), torch.ones(3))
