"""The step benchmark's plain model is the toolkit's architecture: same parameters, same shapes, and
with the toolkit model's weights the same outputs and gradients (full attention). Not timed."""
import pytest
import torch

from asr.model.ctc import ctc_loss
from asr.benchmarks.step.breakdown import ATTENTION, STAGES, instrument, profiled_step
from asr.benchmarks.step.plain_model import PlainRecognizer, plain_state_dict
from asr.benchmarks.step.workloads import MODELS, PLAIN, WORKLOADS, Workload, build_model, make_batch, parameter_count
from asr.benchmarks.step.workloads import toolkit_recognizer

SMALL = dict(layers=2, heads=2, head_dim=8, ff_dim=24, dropout=0.1, subsampling_channels=4)


def small_workload(monkeypatch, subsampling: int, feature_dim: int = 12) -> Workload:
    monkeypatch.setitem(MODELS, f"test-{subsampling}", dict(SMALL, subsampling=subsampling))
    return Workload(f"test-{subsampling}", "a test", f"test-{subsampling}", feature_dim, ("phones", "chars"), 3, 0.4,
                    {"phones": 10.0, "chars": 12.0})


def padded_features(lengths: list[int], feature_dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    features = torch.randn(len(lengths), int(lengths.max()), feature_dim, generator=generator, dtype=torch.float64)
    features *= (torch.arange(features.shape[1])[None, :] < lengths[:, None])[..., None]
    return features, lengths


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_parameter_count_matches_the_toolkit_model(workload):
    w = WORKLOADS[workload]
    toolkit = toolkit_recognizer(w, "full")
    plain = build_model(w, PLAIN).module
    assert parameter_count(plain) == parameter_count(toolkit)
    # one tensor per toolkit tensor, the query/key/value projections packed into one
    layers = MODELS[w.model]["layers"]
    assert len(list(plain.parameters())) == len(list(toolkit.parameters())) - 4 * layers


@pytest.mark.parametrize("subsampling", [1, 2, 4])
def test_weights_of_the_toolkit_model_give_the_same_outputs_and_gradients(monkeypatch, subsampling):
    workload = small_workload(monkeypatch, subsampling)
    torch.manual_seed(3)
    toolkit = toolkit_recognizer(workload, "full").double().eval()
    plain = PlainRecognizer(workload.feature_dim, {k: p.out_features for k, p in toolkit.heads.projections.items()},
                            **MODELS[workload.model]).double().eval()
    with torch.no_grad():   # statistics other than the defaults, so the normalisation is compared too
        toolkit.feature_mean.uniform_(-1, 1)
        toolkit.feature_std.uniform_(0.5, 2)
    plain.load_state_dict(plain_state_dict(toolkit.state_dict()))

    features, lengths = padded_features([37, 20, 5, 1], workload.feature_dim)
    expected, expected_lengths = toolkit(features, lengths)
    got, got_lengths = plain(features, lengths)
    assert torch.equal(got_lengths, expected_lengths)
    valid = torch.arange(expected["phones"].shape[1])[None, :] < expected_lengths[:, None]
    for kind in expected:
        assert got[kind].shape == expected[kind].shape
        torch.testing.assert_close(got[kind][valid], expected[kind][valid], rtol=1e-10, atol=1e-10)

    # the same CTC loss, and the same gradient for every weight (the packed projection's in thirds)
    targets = torch.randint(1, 10, (4, 2))
    target_lengths = torch.tensor([2, 2, 1, 1])
    for model, log_probs, out_lengths in ((toolkit, expected, expected_lengths), (plain, got, got_lengths)):
        ctc_loss(log_probs["phones"], out_lengths, targets, target_lengths).backward()
    plain_gradients = {name: p.grad for name, p in plain.named_parameters()}
    toolkit_gradients = plain_state_dict({name: p.grad for name, p in toolkit.named_parameters()})
    assert plain_gradients.keys() == toolkit_gradients.keys()
    for name, gradient in toolkit_gradients.items():
        torch.testing.assert_close(plain_gradients[name], gradient, rtol=1e-9, atol=1e-12, msg=name)


def test_a_sequence_gives_the_same_output_alone_and_in_a_padded_batch(monkeypatch):
    workload = small_workload(monkeypatch, 2)
    torch.manual_seed(0)
    plain = PlainRecognizer(workload.feature_dim, {"phones": 7}, **MODELS[workload.model]).double().eval()
    features, lengths = padded_features([30, 11], workload.feature_dim)
    batched, batched_lengths = plain(features, lengths)
    alone, alone_lengths = plain(features[1:, :11], lengths[1:])
    n = int(alone_lengths[0])
    torch.testing.assert_close(batched["phones"][1, :n], alone["phones"][0, :n], rtol=1e-12, atol=1e-12)


def test_plain_state_dict_refuses_a_shared_qk_model(monkeypatch):
    workload = small_workload(monkeypatch, 1)
    shared = toolkit_recognizer(workload, "lsh-1")   # lsh needs shared query/key projections
    with pytest.raises(ValueError, match="shared-QK"):
        plain_state_dict(shared.state_dict())


def test_batches_have_the_workloads_shapes():
    for workload in WORKLOADS.values():
        batch = make_batch(workload, seed=0)
        assert batch.features.shape[0] == workload.utterances
        assert batch.features.shape[2] == workload.feature_dim
        assert abs(batch.audio_seconds / workload.batch_seconds - 1) < 0.05
        for kind, counts in batch.target_lengths.items():
            assert batch.targets[kind].shape == (workload.utterances, int(counts.max()))
        outside = torch.arange(batch.features.shape[1])[None, :] >= batch.lengths[:, None]
        assert not batch.features[outside].any()


@pytest.mark.parametrize("label", ["i-clustered-100", PLAIN])
def test_breakdown_accounts_for_the_whole_step(monkeypatch, label):
    workload = small_workload(monkeypatch, 2)
    workload = Workload(workload.name, workload.what, workload.model, workload.feature_dim, workload.heads, 3, 2.0,
                        workload.targets_per_second)
    torch.manual_seed(0)
    model = build_model(workload, label)
    instrument(model)
    breakdown = profiled_step(model, make_batch(workload, 0))
    assert set(breakdown.stages) <= set(STAGES)
    total = sum(sum(sides) for sides in breakdown.stages.values())
    assert total == pytest.approx(breakdown.step_ms, rel=0.02)
    attention_forward, attention_backward = breakdown.stages[ATTENTION]
    assert attention_forward > 0 and attention_backward > 0
    # the attention's operators hold its backward (each node under the operator that made it)
    assert sum(b for _, b in breakdown.attention_operators.values()) == pytest.approx(attention_backward)


def test_breakdown_console_has_no_profiler_notices(tmp_path):
    """Kineto writes 'USDT: ... profiler_start/stop' to file descriptor 2 per profiled step; the
    breakdown closes that descriptor around the profiler, while Python's own stderr still prints."""
    import os
    import subprocess
    import sys
    from tiny_runs import ROOT
    code = ("import sys, torch\n"
            "from torch.profiler import ProfilerActivity, profile\n"
            "from asr.benchmarks.step.breakdown import profiler_notices_silenced\n"
            "with profiler_notices_silenced():\n"
            "    print('from python', file=sys.stderr)\n"
            "    with profile(activities=[ProfilerActivity.CPU]):\n"
            "        torch.ones(3) + 1\n"
            "print('after', file=sys.stderr)\n"
            "with profile(activities=[ProfilerActivity.CPU]):\n"
            "    torch.ones(3) + 1\n")
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert finished.returncode == 0, finished.stderr
    # nothing came between the two Python lines (an unsilenced profile, the last one, may print)
    assert finished.stderr.splitlines()[:2] == ["from python", "after"]
