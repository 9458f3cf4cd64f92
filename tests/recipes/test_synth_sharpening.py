"""recipes.synth.sharpening on a tiny run that kept two checkpoints: the gaps against the cross-matrix
cells, the entropy against an unpadded computation written here, the per-layer measures and the gap by
layer (one layer swapped at a time, the clustering the attention runs), the cache and its resumption,
the PNGs, the errors and the long run's config."""
import json
import math
import sys
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr"))
from tiny_runs import compose_config, tiny_config  # noqa: E402

from asr.evaluation import attention_matrix, split_decoding  # noqa: E402
from asr.config.schema import validate_config  # noqa: E402
from asr.evaluation.evaluation import load_model
from asr.evaluation.evaluation_data import evaluation_data
from asr.training.fit import ensure_corpus, train  # noqa: E402
from recipes.synth import sharpening  # noqa: E402

ROWS = ["full", "clustered-3", "i-clustered-3", "oracle-top-4"]
PROBE = "clustered-3"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny synth_full run (two layers) of 4 steps that kept the checkpoints of steps 2 and 4."""
    root = tmp_path_factory.mktemp("synth")
    ensure_corpus(compose_config(f"data.root={root}", "synth_corpus.train_utterances=6",
                                 "synth_corpus.dev_utterances=2", "synth_corpus.test_utterances=2",
                                 "synth_corpus.jobs=1"))
    run = tmp_path_factory.mktemp("run")
    results = train(tiny_config(root, "conf=synth_full", "model.layers=2", "test=false", "trainer.max_epochs=-1",
                                "trainer.max_steps=4",
                                "trainer.keep_checkpoints_every_n_steps=2"), run)
    assert results["steps"] == 4
    return run


def unpadded_entropy(checkpoint: Path, layer_index: int) -> float:
    """Mean over the dev utterances' heads and queries of entropy(softmax(q k^T / sqrt(E))) / log(L),
    each utterance on its own (no padding), from the layer's projections."""
    model = load_model(checkpoint)
    data = evaluation_data(model, checkpoint, "dev", progress=False)
    layer = model.encoder.layers[layer_index]
    captured = {}
    hook = layer.register_forward_pre_hook(lambda module, args: captured.update(x=args[0], lengths=args[1]))
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in data.datamodule.dataloader("dev"):
            model(batch["features"], batch["feature_lengths"])
            for x, length in zip(captured["x"], captured["lengths"].tolist()):
                h = layer.attention_norm(x[:length])
                heads = layer.heads
                q = layer.query(h).view(length, heads, -1).transpose(0, 1).double()
                k = layer.key(h).view(length, heads, -1).transpose(0, 1).double()
                p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
                entropy = -(p * p.log()).sum(-1) / math.log(length)          # (heads, L)
                total += float(entropy.sum())
                count += entropy.numel()
    hook.remove()
    return total / count


def test_the_curve_its_numbers_and_the_cache(tiny_run, monkeypatch, capsys):
    argv = ["--run", str(tiny_run), "--rows", *ROWS, "--probe", PROBE, "--by-layer", "--threads", "1"]
    assert sharpening.main(argv) == 0
    out = tiny_run / "sharpening"
    result = json.loads((out / "sharpening.json").read_text())
    assert [point["step"] for point in result["points"]] == [2, 4] and result["split"] == "dev"
    matrix = json.loads((out / "matrix" / "matrix.json").read_text())
    assert [column["label"] for column in matrix["columns"]] == ["step2", "step4"]
    cells = {(row["evaluate_with"], label): cell for row in matrix["rows"] for label, cell in row["cells"].items()}
    for point in result["points"]:
        column = f"step{point['step']}"
        assert point["per"] == {row: cells[row, column]["per"] for row in ROWS}
        for row in ROWS[1:]:
            assert point["gap_to_full"][row] == pytest.approx(cells[row, column]["per"] - cells["full", column]["per"])
            # the interval over the utterances, from the cells' hypotheses (its centre is the gap itself)
            gap, low, high = attention_matrix.phone_gap_interval(out / "matrix", column, row)
            assert gap == pytest.approx(point["gap_to_full"][row])
            assert point["gap_interval"][row] == pytest.approx([low, high]) and low <= gap <= high
        assert point["mean_entropy"] == pytest.approx(sum(point["entropy_per_layer"]) / len(point["entropy_per_layer"]))
        assert [layer["layer"] for layer in point["layers"]] == [0, 1]
        for layer in point["layers"]:
            assert set(layer) == {"layer", *sharpening.MEASURES}
            assert 0 < layer["locality5"] <= layer["locality20"] <= 1
            assert 0 < layer["cluster_spread_fraction"] < 0.5 and layer["cluster_spread"] > 1
            assert -1 < layer["query_similarity"] < 1
            assert 0 < layer["clustering_error"] < 1 and 0 < layer["clustering_output_error"]
            assert 0 < layer["clustering_layer_error"] and 0 < layer["attention_share"]
        assert point["entropy_per_layer"] == [layer["entropy"] for layer in point["layers"]]
        assert len(point["per_by_layer"]) == 2
        assert point["gap_by_layer"] == pytest.approx([per - point["per"]["full"] for per in point["per_by_layer"]])
    for index, step in enumerate((2, 4)):
        expected = unpadded_entropy(tiny_run / "checkpoints" / f"step-{step:06d}.ckpt", 0)
        assert 0 < expected < 1
        assert result["points"][index]["entropy_per_layer"][0] == pytest.approx(expected, rel=1e-5)
    for name in ("sharpening.png", "sharpening_layers.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "| step | mean entropy | full PER | clustered-3 gap |" in printed
    assert "| layer | entropy | within +-5 | within +-20 | query similarity | attention share | cluster spread (positions) |" in printed
    # started again, it evaluates and measures nothing
    monkeypatch.setattr(attention_matrix, "decode_split", lambda *a, **k: pytest.fail("an evaluation was recomputed"))
    monkeypatch.setattr(split_decoding, "decode_split", lambda *a, **k: pytest.fail("a layer was re-evaluated"))
    monkeypatch.setattr(sharpening, "checkpoint_measures", lambda *a, **k: pytest.fail("a measure was recomputed"))
    assert sharpening.main([*argv, "--publish", str(tiny_run / "published")]) == 0
    assert json.loads((out / "sharpening.json").read_text()) == result
    assert json.loads((tiny_run / "published" / f"sharpening_{tiny_run.name}.json").read_text()) == result
    assert (tiny_run / "published" / f"sharpening_{tiny_run.name}.png").is_file()
    assert (tiny_run / "published" / f"sharpening_{tiny_run.name}_layers.png").is_file()


def layer_attentions(model) -> list[str]:
    return [type(layer.attention).__name__ for layer in model.encoder.layers]


def test_the_gap_by_layer_swaps_one_layer_at_a_time_and_resumes_at_the_next(tiny_run, tmp_path, monkeypatch):
    checkpoint = tiny_run / "checkpoints" / "step-000004.ckpt"
    evaluated = []

    def spy(model, data, *args, **kwargs):          # what runs in each layer when a layer's PER is measured
        evaluated.append(layer_attentions(model))
        return SimpleNamespace(rates={"per": 0.1 * len(evaluated)})

    monkeypatch.setattr(split_decoding, "decode_split", spy)
    lines = []
    per = sharpening.cached_gap_by_layer(tmp_path, 4, checkpoint, "dev", None, PROBE, lines.append)
    assert evaluated == [["ClusteredAttention", "FullAttention"], ["FullAttention", "ClusteredAttention"]]
    assert per == pytest.approx([0.1, 0.2]) and len(lines) == 2
    # interrupted after layer 0: the next run evaluates layer 1 only
    path = tmp_path / "by_layer" / "step4.json"
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "per_by_layer": stored["per_by_layer"][:1]}))
    evaluated.clear()
    assert sharpening.cached_gap_by_layer(tmp_path, 4, checkpoint, "dev", None, PROBE, lines.append) == \
        pytest.approx([0.1, 0.1])
    assert evaluated == [["FullAttention", "ClusteredAttention"]]
    # another probe is another measurement
    evaluated.clear()
    sharpening.cached_gap_by_layer(tmp_path, 4, checkpoint, "dev", None, "clustered-2", lines.append)
    assert len(evaluated) == 2


def test_query_similarity_is_the_mean_cosine_over_pairs_of_distinct_positions():
    """Against the pairs counted one by one, padding left out; identical queries give 1, a sequence of
    one position counts for nothing."""
    from asr.model.diagnostics import query_similarity
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 7, 4, generator=generator) + torch.tensor([1.0, 0.0, 0.0, 0.0])
    q[:, :, 5:] = float("nan")                            # padding of the first two sequences
    lengths = torch.tensor([5, 1, 7])
    q[2, :, 5:] = torch.randn(2, 2, 4, generator=generator)
    total, count = query_similarity(q, lengths)
    expected = []
    for b, n in enumerate(lengths.tolist()):
        for h in range(2):
            if n < 2:
                continue
            unit = torch.nn.functional.normalize(q[b, h, :n].double(), dim=-1)
            expected.append(sum(float(unit[i] @ unit[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1)))
    assert count == 4 and total == pytest.approx(sum(expected), rel=1e-12)
    same, pairs = query_similarity(torch.ones(1, 3, 6, 4) * torch.tensor([2.0, -1.0, 0.5, 3.0]), torch.tensor([6]))
    assert pairs == 3 and same == pytest.approx(3.0)


def relative_change_by_position(before: torch.Tensor, after: torch.Tensor, lengths: torch.Tensor) -> tuple[float, int]:
    """Sum and number over the valid positions, one utterance and position at a time."""
    changes = [float((after[b, n] - before[b, n]).norm() / before[b, n].norm())
               for b, length in enumerate(lengths.tolist()) for n in range(length)]
    return sum(changes), len(changes)


def test_the_cluster_spread_measures_the_clusters_the_attention_computes(tiny_run, monkeypatch):
    """The clusters of layer 1 in the measurement are those clustered attention computes in an
    evaluation of the same batch with it in layer 1 alone; their spread is the spread of those. The
    layer error is the change of layer 1's output between that evaluation and one with full attention,
    the attention share the output projection's output over layer 1's input in the latter."""
    import attention_ext.attentions.clustered
    from asr.evaluation.attention_choice import evaluation_attention, set_evaluation_attention
    from asr.model.diagnostics import cluster_time_spread, clustering_error, layer_attention_inputs, layer_attention_measures
    from asr.model.recognizer import EVALUATION_SEED, seed_evaluation_batch
    checkpoint = tiny_run / "checkpoints" / "step-000004.ckpt"
    clusterings = []
    original = attention_ext.attentions.clustered.cluster_queries

    def recorded(q, lengths, *options):
        clusters = original(q, lengths, *options)
        clusterings.append((clusters.assignment.clone(), lengths.clone()))
        return clusters

    monkeypatch.setattr(attention_ext.attentions.clustered, "cluster_queries", recorded)
    model = sharpening.exact_model(checkpoint)
    data = evaluation_data(model, checkpoint, "dev", progress=False)
    batch = next(iter(data.datamodule.dataloader("dev")))
    layer = model.encoder.layers[1]
    seen = {}
    hooks = [layer.register_forward_hook(lambda module, args, out: seen.update(x=args[0], out=out)),
             layer.output.register_forward_hook(lambda module, args, out: seen.update(update=out))]
    set_evaluation_attention(model, evaluation_attention(model, PROBE), "trained", layers=[1])
    assert layer_attentions(model) == ["FullAttention", "ClusteredAttention"]
    seed_evaluation_batch(EVALUATION_SEED, 0)
    with torch.no_grad():
        model(batch["features"], batch["feature_lengths"])
    [(evaluated, lengths)] = clusterings
    assert int(evaluated.max()) == 2 and (evaluated >= 0).sum() == lengths.sum() * evaluated.shape[1]
    clustered_x, clustered_out = seen["x"], seen["out"]

    set_evaluation_attention(model, evaluation_attention(model, "full"), "trained")
    with torch.no_grad():
        model(batch["features"], batch["feature_lengths"])
    for hook in hooks:
        hook.remove()
    assert torch.equal(seen["x"], clustered_x)       # layer 0 is full in both: layer 1 reads the same input
    expected_layer_error = relative_change_by_position(seen["out"], clustered_out, lengths)
    expected_share = relative_change_by_position(seen["x"], seen["x"] + seen["update"], lengths)
    assert expected_layer_error[0] > 1e-3           # clustering moved the layer's output, as the test needs
    clusterings.clear()
    measures = layer_attention_measures(model, batch["features"], batch["feature_lengths"],
                                        sharpening.parse_attention_spec(PROBE).options,
                                        reseed=lambda: seed_evaluation_batch(EVALUATION_SEED, 0))
    assert len(clusterings) == 2 and torch.equal(clusterings[1][0], evaluated)
    spread, fraction, queries = cluster_time_spread(evaluated, lengths)
    assert measures[1]["cluster_spread"] == pytest.approx((spread, queries))
    assert measures[1]["cluster_spread_fraction"] == pytest.approx((fraction, queries))
    q, k, v, layer_lengths = layer_attention_inputs(model, batch["features"], batch["feature_lengths"])[1]
    error = clustering_error(q, k, v, layer_lengths, False, evaluated)
    assert measures[1]["clustering_error"] == pytest.approx(error["weights"])
    assert measures[1]["clustering_output_error"] == pytest.approx(error["output"])
    assert measures[1]["clustering_layer_error"] == pytest.approx(expected_layer_error, rel=1e-4)
    assert measures[1]["attention_share"] == pytest.approx(expected_share, rel=1e-4)


def test_published_names_say_sharpening_once():
    assert sharpening.published_stem(Path("runs/sharpening_full")) == "sharpening_full"
    assert sharpening.published_stem(Path("runs/wsj")) == "sharpening_wsj"
    assert sharpening.published_stem(Path("runs/wsj"), Path("runs/wsj/sharpening")) == "sharpening_wsj"


def test_a_second_measurement_of_a_run_publishes_under_its_own_name():
    # the stride-2 control is measured twice (README): clustered-100 and, into sharpening50, clustered-50
    run = Path("runs/paper_encoder_stride2")
    assert sharpening.published_stem(run, run / "sharpening50") == "sharpening_paper_encoder_stride2_50"
    assert sharpening.published_stem(run, Path("elsewhere/probe")) == "sharpening_paper_encoder_stride2_probe"


def test_steps_choose_kept_checkpoints(tiny_run):
    kept = sharpening.kept_checkpoints(tiny_run)
    assert list(kept) == [2, 4]
    assert sharpening.chosen_checkpoints(kept, None, tiny_run) == kept
    assert sharpening.chosen_checkpoints(kept, [4, 4], tiny_run) == {4: kept[4]}


def test_usage_errors_exit_2_naming_the_problem(tiny_run, tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    for argv, says in ((["--run", str(tmp_path)], "holds no checkpoints of fixed steps (step-NNNNNN.ckpt); train with "
                                                  "trainer.keep_checkpoints_every_n_steps=N"),
                       (["--run", str(tiny_run), "--rows", "clustered-3"], "the gaps are to full; add it to --rows"),
                       (["--run", str(tiny_run), "--rows", "full", "clusterd-3"], "unknown attention spec 'clusterd-3'"),
                       (["--run", str(tiny_run), "--train", "0"], "--train=0 must be >= 1"),
                       (["--run", str(tiny_run), "--steps", "4", "3", "5"], "--steps 3 5: " + str(tiny_run)
                        + "/checkpoints keeps no such step; it keeps 2, 4"),
                       (["--run", str(tiny_run), "--probe", "oracle-top"], "--probe oracle-top: its query clusters are "
                                                                            "measured; give a clustered or i-clustered"),
                       (["--run", str(tiny_run), "--rows", *ROWS, "--by-layer"],
                        "--by-layer compares --probe clustered-100 in one layer with it in every layer; add it to --rows")):
        assert sharpening.main(argv) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("recipes.synth.sharpening: error: ") and says in error.splitlines()[0], error


def test_the_long_run_is_the_paper_length_full_preset_with_kept_checkpoints():
    cfg = compose_config(f"conf={sharpening.PRESET}", *sharpening.training_overrides(6000, 500))
    validate_config(cfg)
    assert (cfg.trainer.max_steps, cfg.trainer.max_epochs, cfg.trainer.max_minutes) == (6000, -1, None)
    assert cfg.trainer.keep_checkpoints_every_n_steps == 500 and cfg.trainer.val_check_interval == 200
    assert (cfg.data.root, cfg.synth_corpus.utterance_scale, cfg.attention.name) == ("data/synth_x2", 2, "full")
    assert {key: cfg.model[key] for key in sharpening.ARCHITECTURES["synth"]} == sharpening.ARCHITECTURES["synth"]
    assert cfg.model.subsampling == 2


def test_the_wsj_architecture_is_the_papers_encoder_at_the_paper_length(tiny_run, capsys):
    cfg = compose_config(f"conf={sharpening.PRESET}", *sharpening.training_overrides(2000, 500, "wsj"))
    validate_config(cfg)
    # supplementary C.3: 9 layers, 6 heads x 32, feed-forward 768; the synth front end's stride 2
    assert (cfg.model.layers, cfg.model.heads, cfg.model.head_dim, cfg.model.ff_dim) == (9, 6, 32, 768)
    assert (cfg.model.subsampling, cfg.synth_corpus.utterance_scale, cfg.trainer.max_steps) == (2, 2, 2000)
    # a run folder of the synth encoder is not resumed as the WSJ one
    assert sharpening.main(["--run", str(tiny_run), "--train", "8", "--architecture", "wsj"]) == 2
    error = capsys.readouterr().err
    assert "holds another encoder than --architecture wsj (model.layers=" in error and "model.ff_dim=" in error


def test_every_row_repeats_exactly_whatever_ran_before(tiny_run):
    """An evaluation row draws its hash planes and K-Means starts from (seed, batch index) alone, so the
    same row gives the same log-probabilities after other rows and other draws, and another seed not."""
    from asr.evaluation.attention_choice import evaluation_attention, set_evaluation_attention
    from asr.evaluation.split_decoding import decode_split
    checkpoint = tiny_run / "checkpoints" / "step-000004.ckpt"
    model = sharpening.exact_model(checkpoint)
    data = evaluation_data(model, checkpoint, "dev", progress=False)
    outputs = []
    model.register_forward_hook(lambda module, inputs, output: outputs.append(output[0]["phones"].clone()))

    def evaluate(row: str, seed: int = 0) -> list[torch.Tensor]:
        outputs.clear()
        set_evaluation_attention(model, evaluation_attention(model, row), "trained")
        decode_split(model, data, "greedy", seed=seed, progress=False)
        return list(outputs)

    rows = ["clustered-3", "i-clustered-3", "oracle-top-4"]
    first = {row: evaluate(row) for row in rows}
    torch.rand(1000)                                     # draws between the evaluations change nothing
    for row in reversed(rows):
        again = evaluate(row)
        assert len(again) == len(first[row]) > 0
        assert all(torch.equal(a, b) for a, b in zip(again, first[row])), row
    other_seed = evaluate("clustered-3", seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(other_seed, first["clustered-3"]))
