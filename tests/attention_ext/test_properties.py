"""Property tests (hypothesis) of the call contract `out = attn(q, k, v, lengths)`, for every
registered attention: shapes, dtypes, finiteness, zero padded rows, invariance to padding,
gradients, and where a NaN or inf in the inputs may show up (attention_ext/README.md, "the
call contract").

The attentions come from the registry, so a newly registered one is tested without changes
here (k = q where the registry says it needs shared QK); its options are drawn from their
registered ranges. Sizes stay tiny (N <= 9) so that many cases run in little time; the cases of
the contract (several chunks and clusters, top-k below and above N, several rounds, lengths 0,
1 and N in one batch) arise at these sizes already. The kernels' vectorised paths for long rows
are left to the kernel tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_ext import available_attentions, build_attention

ATTENTIONS = sorted(available_attentions())

# Where attention_ext/README.md promises less about padding than the default this file holds
# every attention to ("appending padding to a batch leaves every sequence's output unchanged"):
# lsh only promises "the same output alone as at index 0 of a padded batch";
ALONE_VS_INDEX_0_ONLY = {"lsh"}
# clustered and iclustered promise it "exactly so in float64; in float32 a projection within
# rounding of its threshold may flip a bit when the padded length changes the blocking".
PADDING_INVARIANT_IN_FLOAT64_ONLY = {"clustered", "iclustered"}

MAX_BATCH, MAX_HEADS, MAX_LENGTH, MAX_DIM = 3, 2, 9, 5
# Options without an upper bound (clusters, topk, chunk_size, rounds, iterations) are drawn up
# to N + this, so they fall both below and above the sequence length.
OPTION_BEYOND_LENGTH = 3
# Magnitudes of the random inputs: ordinary, large enough that unstabilised softmax logits would
# overflow float32, tiny, and 0 (all-zero queries: shared-QK keys are normalised zeros).
# The ordinary case first: it is hypothesis's simplest choice, the one its first examples use.
INPUT_SCALES = (1.0, 30.0, 1e-3, 0.0)
# Relative tolerance of "unchanged" comparisons. A changed hash bucket or cluster moves an
# output by about the inputs' scale, far above these.
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}

# Every test: a fixed (derandomized) search, so CI runs the same examples every time, and no
# example database (it would write .hypothesis/ into the repository). Deadline: a whole example
# (build, forward, backward on tensors of at most 3x2x9x5) takes milliseconds, so 2 s per
# example only trips on a hang or an accidental blow-up, not on the jitter of a CPU shared with
# training jobs. max_examples is set per test (by its cost per example) so that the whole file
# (8 attentions x 5 tests) stays well under 2 minutes on 2 shared cores.
COMMON = dict(derandomize=True, database=None, deadline=timedelta(seconds=2))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tensors are tiny, so a second OpenMP thread only adds barrier waits; on a 2-core
    CPU shared with a training job they made this file 4x slower (155 s against 38 s). With one
    worker every (batch, head) task also runs after the previous one on the same scratch
    buffers, which is how a value could leak from one sequence into the next. Several threads
    are tested in test_threads.py and test_bad_input_threads.py."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@dataclass
class Case:
    """One drawn call: the attention, its options and every input of the call."""
    name: str
    options: dict
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor | None
    scale: float
    seed: int  # torch.manual_seed before the call: the attention's randomness

    @property
    def shared_qk(self) -> bool:
        return available_attentions()[self.name].needs_shared_qk

    @property
    def valid_lengths(self) -> list[int]:
        batch, _, length, _ = self.q.shape
        return [length] * batch if self.lengths is None else self.lengths.tolist()

    def valid_mask(self) -> torch.Tensor:
        """(B, 1, N, 1) bool: True at the valid positions of each sequence."""
        positions = torch.arange(self.q.shape[2])
        return (positions < torch.tensor(self.valid_lengths, dtype=torch.long)[:, None])[:, None, :, None]


def rarely(one_in: int):
    """True in about one draw of `one_in`. hypothesis draws the ends of an integer range far
    more often than its middle (a st.booleans() or `== last` would come out True too often or
    too rarely), so the True case is a value in the middle."""
    return st.integers(0, one_in - 1).map(lambda value: value == one_in // 2)


@st.composite
def option_values(draw, name: str, length: int, dim: int) -> dict:
    """Each registered option of `name` within its registered range; unbounded ones up to
    N + OPTION_BEYOND_LENGTH (chunk sizes that do not divide N, clusters and top-k above N, LSH's
    bucket cap below and above its natural count), those declared at_most_head_dim (agglomerative's
    classes) up to the head dim E; multiples of the option's multiple_of."""
    values = {}
    for option in available_attentions()[name].options:
        upper = option.maximum
        if upper is None:
            upper = max(option.minimum, length) + OPTION_BEYOND_LENGTH
        if option.at_most_head_dim:
            upper = min(upper, dim)
        step = option.multiple_of
        values[option.name] = draw(st.integers(-(-option.minimum // step), upper // step)) * step
    return values


def random_rows(generator, shape, dtype, scale):
    return (torch.randn(*shape, dtype=torch.float64, generator=generator) * scale).to(dtype)


@st.composite
def cases(draw, name: str, min_batch: int = 0, min_length: int = 0, with_lengths: bool = False,
          dtypes=(torch.float32, torch.float64)) -> Case:
    """A call of attention `name` on random inputs; padded positions hold random values too
    (the contract says they do not matter)."""
    # Left alone, hypothesis makes a quarter of the batches empty and most calls lengths=None.
    empty = min_batch == 0 and draw(rarely(8))
    batch = 0 if empty else draw(st.integers(max(1, min_batch), MAX_BATCH))
    heads = draw(st.integers(1, MAX_HEADS))
    length = draw(st.integers(min_length, MAX_LENGTH))
    dim = draw(st.integers(1, MAX_DIM))
    lengths = None
    if with_lengths or not draw(rarely(4)):
        lengths = draw(st.lists(st.integers(0, length), min_size=batch, max_size=batch))
        # hypothesis rarely puts 0, 1 and N into one batch by itself: do it in most batches
        # (in a drawn order); the other sequences keep their drawn lengths.
        if not draw(rarely(3)):
            boundaries = draw(st.permutations([0, min(1, length), length]))
            lengths[:min(batch, 3)] = boundaries[:batch]
    dtype = draw(st.sampled_from(dtypes))
    scale = draw(st.sampled_from(INPUT_SCALES))
    data_seed = draw(st.integers(0, 2**32 - 1))
    generator = torch.Generator().manual_seed(data_seed)
    shape = (batch, heads, length, dim)
    q, k, v = (random_rows(generator, shape, dtype, scale) for _ in range(3))
    return Case(name, draw(option_values(name, length, dim)), q, k, v,
                None if lengths is None else torch.tensor(lengths, dtype=torch.long),
                scale, draw(st.integers(0, 2**32 - 1)))


def run(case: Case, q=None, k=None, v=None, lengths="case", grad=False):
    """Calls the case's attention (on the case's inputs unless given) after
    torch.manual_seed(case.seed); k = q for the shared-QK attentions, which need it.
    With grad=True returns (out, the gradients of sum(out * w) for a fixed random w w.r.t.
    the distinct inputs: (q, v) for shared QK, else (q, k, v))."""
    q = case.q if q is None else q
    k = case.k if k is None else k
    v = case.v if v is None else v
    lengths = case.lengths if isinstance(lengths, str) else lengths
    q, k, v = (x.detach().clone().requires_grad_(grad) for x in (q, k, v))
    if case.shared_qk:
        k = q
    attention = build_attention(case.name, **case.options)
    with torch.random.fork_rng(devices=[]):  # leave the global generator as the other tests expect it
        torch.manual_seed(case.seed)
        out = attention(q, k, v, lengths)
        if not grad:
            return out
        weights = torch.randn(out.shape, dtype=torch.float64).to(out.dtype)
    inputs = (q, v) if case.shared_qk else (q, k, v)
    # An input the output does not depend on (q of shared_full when every sequence has length 1:
    # each query attends to itself, so its output is its value) has a zero gradient. The output
    # itself must be in the graph, even without any valid query, so that backward works.
    return out, torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True,
                                    materialize_grads=True)


def assert_unchanged(actual, expected, case: Case):
    tolerance = RELATIVE_TOLERANCE[case.q.dtype]
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * case.scale)


@pytest.mark.parametrize("name", ATTENTIONS)
@settings(max_examples=80, **COMMON)  # one forward pass per example: the cheapest test
@given(data=st.data())
def test_output_has_the_shape_and_dtype_of_v_is_finite_and_zero_at_padded_queries(name, data):
    case = data.draw(cases(name))
    out = run(case)
    assert out.shape == case.v.shape
    assert out.dtype == case.v.dtype
    assert torch.isfinite(out).all()
    assert (out.masked_select(~case.valid_mask()) == 0).all()


@pytest.mark.parametrize("name", ATTENTIONS)
@settings(max_examples=80, **COMMON)  # one forward and backward pass per example
@given(data=st.data())
def test_gradients_are_finite_and_zero_at_padded_positions(name, data):
    case = data.draw(cases(name))
    _, gradients = run(case, grad=True)
    padded = ~case.valid_mask()
    for gradient, inputs in zip(gradients, (case.q, case.v) if case.shared_qk else (case.q, case.k, case.v)):
        assert gradient.shape == inputs.shape and gradient.dtype == inputs.dtype
        assert torch.isfinite(gradient).all()
        assert (gradient.masked_select(padded) == 0).all()


@pytest.mark.parametrize("name", ATTENTIONS)
@settings(max_examples=60, **COMMON)  # two forward passes per example
@given(data=st.data())
def test_a_sequence_alone_gives_the_output_it_gets_at_index_0_of_a_padded_batch(name, data):
    # The weakest padding guarantee, documented for every attention.
    dtypes = (torch.float64,) if name in PADDING_INVARIANT_IN_FLOAT64_ONLY else (torch.float32, torch.float64)
    case = data.draw(cases(name, min_batch=1, dtypes=dtypes))
    valid = case.valid_lengths[0]
    alone_lengths = data.draw(st.sampled_from([None, torch.tensor([valid])]))
    batched = run(case)
    alone = run(case, case.q[:1, :, :valid], case.k[:1, :, :valid], case.v[:1, :, :valid],
                lengths=alone_lengths)
    assert_unchanged(batched[:1, :, :valid], alone, case)


@pytest.mark.parametrize("name", [name for name in ATTENTIONS if name not in ALONE_VS_INDEX_0_ONLY])
@settings(max_examples=60, **COMMON)  # two forward passes per example
@given(data=st.data())
def test_appending_padding_to_a_batch_leaves_every_sequence_unchanged(name, data):
    dtypes = (torch.float64,) if name in PADDING_INVARIANT_IN_FLOAT64_ONLY else (torch.float32, torch.float64)
    case = data.draw(cases(name, with_lengths=True, dtypes=dtypes))
    extra = data.draw(st.integers(1, 4))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
    batch, heads, _, dim = case.q.shape
    # The new padded positions hold random values, not zeros: their content must not matter.
    padded = [torch.cat([x, random_rows(generator, (batch, heads, extra, dim), x.dtype, case.scale)], dim=2)
              for x in (case.q, case.k, case.v)]
    before = run(case)
    after = run(case, *padded)
    assert_unchanged(after[:, :, :case.q.shape[2]], before, case)
    assert (after[:, :, case.q.shape[2]:] == 0).all()


@pytest.mark.parametrize("name", ATTENTIONS)
@settings(max_examples=60, **COMMON)  # two forward and backward passes per example, the costliest
@given(data=st.data())
def test_a_nan_or_inf_input_leaves_the_other_sequences_unchanged(name, data):
    # The policy of attention_ext/README.md: a non-finite value in sequence b's rows of q, k
    # or v (valid or padded) may make b's output and gradients non-finite, but b's padded
    # output rows stay 0 and no other sequence changes.
    case = data.draw(cases(name, min_batch=2, min_length=1))
    poisoned = data.draw(st.integers(0, case.q.shape[0] - 1))
    position = data.draw(st.integers(0, case.q.shape[2] - 1))  # valid or padded
    head = data.draw(st.integers(0, case.q.shape[1] - 1))
    feature = data.draw(st.integers(0, case.q.shape[3] - 1))
    tensor = data.draw(st.sampled_from("qv" if case.shared_qk else "qkv"))
    value = data.draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    inputs = {"q": case.q.clone(), "k": case.k.clone(), "v": case.v.clone()}
    inputs[tensor][poisoned, head, position, feature] = value

    clean_out, clean_gradients = run(case, grad=True)
    out, gradients = run(case, inputs["q"], inputs["k"], inputs["v"], grad=True)

    assert (out.masked_select(~case.valid_mask()) == 0).all()
    others = [b for b in range(case.q.shape[0]) if b != poisoned]
    assert torch.isfinite(out[others]).all()
    assert_unchanged(out[others], clean_out[others], case)
    for gradient, clean_gradient in zip(gradients, clean_gradients):
        assert torch.isfinite(gradient[others]).all()
        assert_unchanged(gradient[others], clean_gradient[others], case)
