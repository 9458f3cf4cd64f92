"""recipes.synth.sharpening on a tiny run that kept two checkpoints: the gaps against the cross-matrix
cells, the entropy against an unpadded computation written here, the cache, the PNG, the errors and
the long run's config."""
import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr"))
from tiny_runs import compose_config, tiny_config  # noqa: E402

from asr.evaluation import attention_matrix  # noqa: E402
from asr.config.schema import validate_config  # noqa: E402
from asr.evaluation.evaluation import load_model
from asr.evaluation.evaluation_data import evaluation_data
from asr.training.fit import ensure_corpus, train  # noqa: E402
from recipes.synth import sharpening  # noqa: E402

ROWS = ["full", "clustered-3", "i-clustered-3", "oracle-top-4"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny synth_full run of 4 steps that kept the checkpoints of steps 2 and 4."""
    root = tmp_path_factory.mktemp("synth")
    ensure_corpus(compose_config(f"data.root={root}", "synth_corpus.train_utterances=6",
                                 "synth_corpus.dev_utterances=2", "synth_corpus.test_utterances=2",
                                 "synth_corpus.jobs=1"))
    run = tmp_path_factory.mktemp("run")
    results = train(tiny_config(root, "conf=synth_full", "test=false", "trainer.max_epochs=-1", "trainer.max_steps=4",
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
    assert sharpening.main(["--run", str(tiny_run), "--rows", *ROWS]) == 0
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
        assert point["mean_entropy"] == pytest.approx(sum(point["entropy_per_layer"]) / len(point["entropy_per_layer"]))
    for index, step in enumerate((2, 4)):
        expected = unpadded_entropy(tiny_run / "checkpoints" / f"step-{step:06d}.ckpt", 0)
        assert 0 < expected < 1
        assert result["points"][index]["entropy_per_layer"][0] == pytest.approx(expected, rel=1e-5)
    assert (out / "sharpening.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| step | mean entropy | full PER | clustered-3 gap |" in capsys.readouterr().out
    # started again, it evaluates and measures nothing
    monkeypatch.setattr(attention_matrix, "decode_split", lambda *a, **k: pytest.fail("an evaluation was recomputed"))
    monkeypatch.setattr(sharpening, "checkpoint_entropy", lambda *a, **k: pytest.fail("an entropy was recomputed"))
    assert sharpening.main(["--run", str(tiny_run), "--rows", *ROWS, "--publish", str(tiny_run / "published")]) == 0
    assert json.loads((out / "sharpening.json").read_text()) == result
    assert json.loads((tiny_run / "published" / f"sharpening_{tiny_run.name}.json").read_text()) == result
    assert (tiny_run / "published" / f"sharpening_{tiny_run.name}.png").is_file()


def test_published_names_say_sharpening_once():
    assert sharpening.published_stem(Path("runs/sharpening_full")) == "sharpening_full"
    assert sharpening.published_stem(Path("runs/wsj")) == "sharpening_wsj"


def test_usage_errors_exit_2_naming_the_problem(tiny_run, tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    for argv, says in ((["--run", str(tmp_path)], "holds no checkpoints of fixed steps (step-NNNNNN.ckpt); train with "
                                                  "trainer.keep_checkpoints_every_n_steps=N"),
                       (["--run", str(tiny_run), "--rows", "clustered-3"], "the gaps are to full; add it to --rows"),
                       (["--run", str(tiny_run), "--rows", "full", "clusterd-3"], "unknown attention spec 'clusterd-3'"),
                       (["--run", str(tiny_run), "--train", "0"], "--train=0 must be >= 1")):
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
