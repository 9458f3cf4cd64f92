"""Every attention under mixed precision (torch.autocast, what Lightning's bf16-mixed uses).

The attentions with C++ kernels (clustered, iclustered, lsh) compute in float32 whatever autocast
would do to their matrix products: under autocast their bfloat16 output is exactly their float32
output on the same (bfloat16-valued) inputs, rounded to bfloat16. The pure-torch ones (full,
shared_full, oracle_top) follow autocast and compute in bfloat16: close to float32, not equal
(oracle_top may even pick other keys where scores tie in bfloat16).
"""
from __future__ import annotations

import math

import pytest
import torch

from attention_ext import available_attentions, build_attention

KERNEL_ATTENTIONS = {"clustered": dict(clusters=4, bits=16, iterations=3),
                     "iclustered": dict(clusters=4, bits=16, iterations=3, topk=5),
                     "lsh": dict(rounds=2, chunk_size=8)}
TORCH_ATTENTIONS = {"full": {}, "shared_full": {}, "oracle_top": dict(topk=5)}
SHARED_QK = {name for name, entry in available_attentions().items() if entry.needs_shared_qk}


def bfloat16_inputs(name: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, 24, 8, generator=generator).to(torch.bfloat16) for _ in range(3))
    return (q, q if name in SHARED_QK else k, v), torch.tensor([24, 17])


def float32_reference(attention, q, k, v, lengths, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    q32 = q.float()
    return attention(q32, q32 if k is q else k.float(), v.float(), lengths)


@pytest.mark.parametrize("name", sorted(KERNEL_ATTENTIONS))
def test_kernel_attentions_compute_in_float32_under_autocast(name):
    attention = build_attention(name, **KERNEL_ATTENTIONS[name])
    (q, k, v), lengths = bfloat16_inputs(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(5)
        out = attention(q, k, v, lengths)
    assert out.dtype == torch.bfloat16
    expected = float32_reference(attention, q, k, v, lengths, seed=5)
    assert torch.equal(out, expected.to(torch.bfloat16))


@pytest.mark.parametrize("name", sorted(KERNEL_ATTENTIONS) + sorted(TORCH_ATTENTIONS))
def test_every_attention_trains_under_autocast(name):
    options = {**KERNEL_ATTENTIONS, **TORCH_ATTENTIONS}[name]
    attention = build_attention(name, **options)
    (q, k, v), lengths = bfloat16_inputs(name, seed=1)
    q32, v32 = q.float().requires_grad_(), v.float().requires_grad_()
    k32 = q32 if name in SHARED_QK else k.float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # what an encoder layer does: float32 activations through a Linear come out bfloat16
        q_low, v_low = q32.to(torch.bfloat16), v32.to(torch.bfloat16)
        k_low = q_low if name in SHARED_QK else k32.to(torch.bfloat16)
        torch.manual_seed(7)
        out = attention(q_low, k_low, v_low, lengths)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.all(out[1, :, 17:] == 0)                      # padded queries stay 0
    out.float().square().sum().backward()
    for grad in (q32.grad, v32.grad) + (() if name in SHARED_QK else (k32.grad,)):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    if name == "oracle_top":
        return   # its top-k choice may differ where two float32 scores round to one bfloat16 value
    expected = float32_reference(attention, q, k, v, lengths, seed=7)
    # bfloat16 keeps 8 bits of mantissa: relative error ~2^-8 per rounding
    scale = expected.abs().max().item()
    assert (out.float() - expected).abs().max().item() <= 0.05 * scale + 1e-6
    assert math.isfinite(scale) and scale > 0
