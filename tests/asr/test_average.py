"""python -m asr.average: the mean of checkpoints, usable wherever a checkpoint is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asr import cross_matrix
from asr.average import main
from asr.evaluation.evaluation import EvaluateConfig, evaluate, load_model
from asr.core.exit_status import SUCCESS, USAGE_ERROR
from asr.model.averaging import AveragingError, average_checkpoints, write_average
from asr.transcribe import main as transcribe


@pytest.fixture
def epochs_run(tiny_epochs_run) -> Path:
    return tiny_epochs_run


def epochs(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("epoch-*.ckpt"))


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def test_the_average_is_the_mean_of_the_weights_and_runs_everywhere(epochs_run, tmp_path, capsys):
    paths = epochs(epochs_run)
    assert [p.name for p in paths] == ["epoch-000.ckpt", "epoch-001.ckpt", "epoch-002.ckpt"]
    out = epochs_run / "checkpoints" / "mean.ckpt"
    assert main([f"checkpoints={paths[0]},{paths[2]}", f"out={out}"]) == SUCCESS
    first, last, averaged = weights(paths[0]), weights(paths[2]), weights(out)
    assert averaged.keys() == first.keys()
    moved = 0
    for name, tensor in averaged.items():
        assert tensor.dtype == first[name].dtype
        assert torch.allclose(tensor, (first[name] + last[name]) / 2, atol=1e-7, rtol=1e-6), name
        moved += not torch.equal(first[name], last[name])
    assert moved > 10          # training changed the weights between the epochs: a real average
    assert torch.equal(averaged["feature_mean"], first["feature_mean"])
    # accepted by evaluate, cross_matrix and transcribe like any checkpoint
    report = evaluate(EvaluateConfig(checkpoint=str(out), split="dev", out=str(tmp_path / "eval"), progress=False))
    assert report["utterances"] == 2 and 0 <= report["error_rates"]["per"]
    assert load_model(out).frontend.options == load_model(paths[0]).frontend.options
    assert cross_matrix.main([f"mean={out}", "--specs", "full", "--out", str(tmp_path / "matrix"),
                              "--split", "dev"]) == SUCCESS
    audio = sorted((Path(report["data"]).parent / "audio" / "dev").glob("*.flac"))
    assert transcribe([f"checkpoint={out}", str(audio[0])]) == SUCCESS


def test_best_k_and_last_k_choose_among_the_runs_epochs(epochs_run):
    paths = epochs(epochs_run)
    rates = {p: torch.load(p, weights_only=True)["val_error_rates"]["per"] for p in paths}
    assert main([f"run={epochs_run}", "best_k=2"]) == SUCCESS
    out = epochs_run / "checkpoints" / "average-best2.ckpt"
    chosen = torch.load(out, weights_only=True)["averaged_from"]
    assert sorted(chosen) == sorted(str(p) for p in sorted(paths, key=rates.__getitem__)[:2])
    assert main([f"run={epochs_run}", "last_k=2"]) == SUCCESS
    assert torch.load(epochs_run / "checkpoints" / "average-last2.ckpt", weights_only=True)["averaged_from"] == [
        str(p) for p in paths[1:]]


def test_checkpoints_of_different_models_are_refused(epochs_run, tmp_path, capsys):
    good = epochs(epochs_run)[0]
    saved = torch.load(good, map_location="cpu", weights_only=True)
    tokenizers = json.loads(json.dumps(saved["hyper_parameters"]["tokenizers"]))
    tokenizers["phones"]["symbols"] = list(reversed(tokenizers["phones"]["symbols"]))   # same size, other table
    cases = {
        "tokenizers": dict(saved, hyper_parameters=dict(saved["hyper_parameters"], tokenizers=tokenizers)),
        "shape": dict(saved, state_dict={**saved["state_dict"],
                                         "heads.projections.phones.weight": torch.zeros(3, 3)}),
        "statistics": dict(saved, state_dict={**saved["state_dict"],
                                              "feature_mean": saved["state_dict"]["feature_mean"] + 1}),
    }
    says = {"tokenizers": "different tokenizers", "shape": "differ in the shape of",
            "statistics": "feature normalisation statistics"}
    for name, checkpoint in cases.items():
        if name == "shape":
            assert "heads.projections.phones.weight" in saved["state_dict"], sorted(saved["state_dict"])
        torch.save(checkpoint, tmp_path / f"{name}.ckpt")
        with pytest.raises(AveragingError, match=says[name]):
            average_checkpoints([good, tmp_path / f"{name}.ckpt"])
        assert main([f"checkpoints={good},{tmp_path / name}.ckpt", f"out={tmp_path / 'x.ckpt'}"]) == USAGE_ERROR
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("asr.average: error: checkpoints ") and says[name] in err[0]
    assert main([f"checkpoints={good}"]) == USAGE_ERROR
    assert main([f"run={tmp_path}", "best_k=2"]) == USAGE_ERROR
    assert not (tmp_path / "x.ckpt").exists()


def test_the_average_is_never_written_over_one_of_its_checkpoints(epochs_run, capsys):
    paths = epochs(epochs_run)
    before = paths[0].read_bytes()
    with pytest.raises(AveragingError, match="is one of the checkpoints to average"):
        write_average(paths[:2], paths[0])
    assert main([f"checkpoints={paths[0]},{paths[1]}", f"out={paths[1]}"]) == USAGE_ERROR
    assert capsys.readouterr().err.startswith(f"asr.average: error: out={paths[1]} is one of the checkpoints")
    assert paths[0].read_bytes() == before
