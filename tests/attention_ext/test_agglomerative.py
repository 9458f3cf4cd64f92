"""agglomerative attention against a dense brute force written here: the N x N matrix
A_ij = sum_c softmax(q_i[:m])_c softmax(k_j[:m])_c / n_c over the valid keys j, with
n_c = sum_j softmax(k_j[:m])_c, times V (attention_ext/README.md gives the adaptation)."""
import pytest
import torch

from attention_ext import AttentionConfigError, build_attention, parse_attention_spec, validate_attention

from random_inputs import random_qkv


def brute_force_agglomerative(q, k, v, lengths, classes):
    batch, heads, length, _ = q.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=q.dtype)
    for b in range(batch):
        n = int(lengths[b])
        for h in range(heads):
            query_classes = torch.exp(q[b, h, :n, :classes])
            query_classes = query_classes / query_classes.sum(-1, keepdim=True)
            key_classes = torch.exp(k[b, h, :n, :classes])
            key_classes = key_classes / key_classes.sum(-1, keepdim=True)
            weights = query_classes @ torch.diag(1 / key_classes.sum(0)) @ key_classes.T   # (n, n)
            out[b, h, :n] = weights @ v[b, h, :n]
    return out


@pytest.mark.parametrize("classes", [1, 3, 5])
@pytest.mark.parametrize("lengths", [[7, 7], [7, 3], [1, 5], [0, 7]])
def test_matches_the_dense_computation_with_padding_and_gradients(classes, lengths):
    q, k, v = random_qkv((2, 3, 7, 5), seed=sum(lengths) + classes)
    lengths = torch.tensor(lengths)
    out = build_attention("agglomerative", classes=classes)(q, k, v, lengths)
    expected = brute_force_agglomerative(q, k, v, lengths, classes)
    torch.testing.assert_close(out, expected)
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(out[b, :, n:] == 0)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad, allow_unused=True, materialize_grads=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_rows_of_the_attention_sum_to_one():
    """With all values 1 every output is 1: a convex combination of the values, like softmax."""
    q, k, _ = random_qkv((2, 2, 8, 6), seed=1)
    out = build_attention("agglomerative", classes=4)(q, k, torch.ones(2, 2, 8, 3, dtype=torch.float64),
                                                       torch.tensor([8, 5]))
    torch.testing.assert_close(out[0], torch.ones_like(out[0]))
    torch.testing.assert_close(out[1, :, :5], torch.ones_like(out[1, :, :5]))


def test_gradcheck():
    q, k, v = random_qkv((2, 2, 5, 4), seed=2)
    lengths = torch.tensor([5, 2])
    attention = build_attention("agglomerative", classes=3)
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, lengths), (q, k, v))


def test_padding_content_and_amount_do_not_matter():
    q, k, v = random_qkv((1, 2, 6, 4), seed=3)
    attention = build_attention("agglomerative", classes=4)
    alone = attention(q, k, v)
    padded = [torch.cat([x, 1e3 * torch.randn(1, 2, 5, 4, dtype=x.dtype)], dim=2) for x in (q, k, v)]
    padded[2][0, 1, 7, 2] = float("inf")     # an inf in a padded value changes nothing
    out = attention(*padded, torch.tensor([6]))
    torch.testing.assert_close(out[:, :, :6], alone)
    assert torch.all(out[:, :, 6:] == 0)


def test_one_valid_key_gives_its_value_and_no_valid_key_gives_zeros():
    q, k, v = random_qkv((3, 2, 4, 3), seed=4)
    out = build_attention("agglomerative", classes=3)(q, k, v, torch.tensor([1, 0, 1]))
    torch.testing.assert_close(out[[0, 2], :, 0], v[[0, 2], :, 0].detach())
    assert torch.all(out[1] == 0) and torch.all(out[:, :, 1:] == 0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[1] == 0)


def test_a_class_without_key_weight_gives_a_zero_summary_not_nan():
    """float32 logits 200 apart: every key's weight on class 1 underflows to 0."""
    q = torch.zeros(1, 1, 3, 2)
    k = torch.tensor([[[[200.0, 0.0]] * 3]])
    v = torch.randn(1, 1, 3, 2)
    out = build_attention("agglomerative", classes=2)(q, k, v)
    # each query: half its weight on class 0 (the mean of v), half on the empty class 1 (0)
    torch.testing.assert_close(out, 0.5 * v.mean(dim=2, keepdim=True).expand_as(v))


def test_classes_above_the_head_dim_fail_with_a_clear_message():
    assert parse_attention_spec("agglomerative-8") == ("agglomerative", {"classes": 8})
    assert validate_attention("agglomerative").options == {"classes": 8}
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(AttentionConfigError, match=r"option classes=8 exceeds the head dim 4; it must be at most"):
        build_attention("agglomerative")(q, q, q)
    with pytest.raises(AttentionConfigError, match=r"classes=5 exceeds the head dim 4.*model.head_dim >= 5"):
        parse_attention_spec("agglomerative-5").check_head_dim(4)
    parse_attention_spec("agglomerative-4").check_head_dim(4)
    with pytest.raises(AttentionConfigError, match=r"classes=0 is out of range"):
        validate_attention("agglomerative", classes=0)
