"""asr.model.dropout.Dropout: the CPU mask drawn four elements per 64-bit random integer, checked
against the integers it was drawn from, its rate and scale, its gradient, and where it is torch's."""
import math

import pytest
import torch
from torch.nn import functional as F

from asr.model.dropout import Dropout, keep_mask


def test_the_mask_is_the_random_words_fifteen_bits_at_a_time_against_the_threshold():
    shape = torch.Size([3, 5, 7])   # 105 elements: the last word's last 15-bit number is not used
    torch.manual_seed(11)
    keep, dropped = keep_mask(shape, 0.1)
    torch.manual_seed(11)
    words = torch.empty(27, dtype=torch.int64).random_()
    numbers = []
    for word in words.tolist():   # little-endian int16 pieces, each without its top bit
        numbers += [(word >> (16 * piece)) & 0x7FFF for piece in range(4)]
    threshold = round(0.1 * 2 ** 15)
    assert dropped == threshold / 2 ** 15 and threshold == 3277
    assert keep.shape == shape and keep.dtype == torch.bool
    assert keep.flatten().tolist() == [number >= threshold for number in numbers[:105]]


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_the_rate_is_p_and_the_kept_elements_are_scaled_so_the_mean_is_the_input(p):
    torch.manual_seed(0)
    x = torch.rand(400, 1000) + 0.5
    y = Dropout(p).train()(x)
    dropped = round(p * 2 ** 15) / 2 ** 15
    kept = y != 0
    # 400,000 draws: the share dropped is within 5 standard deviations of the rounded p
    assert abs((1 - kept.float().mean().item()) - dropped) < 5 * math.sqrt(p * (1 - p) / x.numel())
    torch.testing.assert_close(y[kept], x[kept] / (1 - dropped))
    # every element of the input is kept at some share near 1 - p: no bit of the numbers is stuck
    pieces = kept.flatten()[: 4 * (x.numel() // 4)].view(-1, 4).float().mean(0)
    assert torch.all((pieces - (1 - dropped)).abs() < 0.01)


def test_the_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(6, 50, 64, dtype=torch.float64, requires_grad=True)
    module = Dropout(0.25).train()
    y = module(x)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    kept = (y != 0).to(torch.float64)
    torch.testing.assert_close(x.grad, upstream * kept / (1 - 0.25))


def test_the_same_seed_draws_the_same_mask_and_another_seed_another():
    x = torch.ones(1000)
    masks = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        masks.append(Dropout(0.1).train()(x))
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])


def test_evaluation_p_zero_and_p_one_are_the_identity_and_torchs():
    x = torch.randn(10, 20)
    assert Dropout(0.5).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        Dropout(1.5)


def test_compiled_code_takes_torchs_dropout(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append(p) or x)
    Dropout(0.1).train()(torch.randn(4, 4))
    assert calls == []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    Dropout(0.1).train()(torch.randn(4, 4))
    assert calls == [0.1]


def test_the_state_dict_is_nn_dropouts():
    assert Dropout(0.1).state_dict() == torch.nn.Dropout(0.1).state_dict() == {}
    assert repr(Dropout(0.1)) == "Dropout(p=0.1)"
