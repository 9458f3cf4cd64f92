"""python -m asr.evaluate and python -m asr.cross_matrix on tiny trained models."""
from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from asr import cross_matrix
from asr.evaluation import attention_matrix
from asr.evaluate import main, parse_arguments
from asr.evaluation.evaluation import EvaluateConfig, default_out_dir, evaluate, load_model
from asr.core.errors import EvaluationError
from asr.evaluation.split_decoding import decode_split
from asr.evaluation.evaluation_data import evaluation_data
from asr.data.features.features import FilterBank
from asr.core.exit_status import USAGE_ERROR
from asr.model.checkpoint import CHECKPOINT_FORMAT, FORMAT_KEY, CheckpointError, read_checkpoint
from asr.training.fit import train
from attention_ext import AttentionConfigError, validate_attention
from tiny_runs import ROOT, tiny_config


@pytest.fixture(scope="module")
def trained(tiny_synth, tmp_path_factory) -> dict[str, Path]:
    """Two tiny models trained for one epoch: full attention (separate Q/K) and shared_full."""
    runs = {}
    for preset in ("synth_full", "synth_shared_full"):
        run = tmp_path_factory.mktemp(preset)
        train(tiny_config(tiny_synth, f"conf={preset}", "test=false"), run)
        runs[preset] = run
    return runs


def tiny_synth_manifests(trained) -> list[Path]:
    """The manifests of the corpus the tiny models were trained on."""
    import yaml
    root = Path(yaml.safe_load((trained["synth_full"] / "config.yaml").read_text())["data"]["root"])
    return sorted(root.glob("synth_*.jsonl.gz"))


def best(run: Path) -> Path:
    return run / "checkpoints" / "best.ckpt"


def test_evaluating_with_the_training_attention_reproduces_the_logged_validation_error(trained, tmp_path):
    run = trained["synth_full"]
    logged = json.loads((run / "results.json").read_text())["val"]      # one epoch: best = last validation
    report = evaluate(EvaluateConfig(checkpoint=str(best(run)), split="dev", out=str(tmp_path), progress=False))
    assert report["same_as_training"] and report["split"] == "dev"
    for metric in ("per", "wer", "cer"):
        assert report["error_rates"][metric] == pytest.approx(logged[metric], abs=1e-12)
    assert report["utterances"] == 2 and report["forward_ms_per_utterance"] > 0
    lines = (tmp_path / "hypotheses.jsonl").read_text().splitlines()
    assert len(lines) == 2 and set(json.loads(lines[0])) == {"id", "phones", "chars"}
    assert len((tmp_path / "hyp_chars.txt").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "results.json").read_text())["error_rates"] == report["error_rates"]


def test_swapping_attention_changes_no_weight(trained):
    checkpoint = best(trained["synth_full"])
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    model = load_model(checkpoint)
    model.set_attention(validate_attention("iclustered", clusters=3, topk=4))
    data = evaluation_data(model, checkpoint, "test", progress=False)
    result = decode_split(model, data, progress=False)
    assert result.rates["per"] >= 0
    after = model.state_dict()
    assert after.keys() == saved.keys()
    assert all(torch.equal(after[name], saved[name]) for name in saved)
    assert type(model.encoder.layers[0].attention).__name__ == "ImprovedClusteredAttention"


def test_an_attention_that_needs_shared_qk_is_refused_with_the_reason(trained, tmp_path):
    checkpoint = str(best(trained["synth_full"]))
    for spec in ("lsh-4", "shared-full"):
        with pytest.raises(AttentionConfigError, match="shared query/key projections"):
            evaluate(EvaluateConfig(checkpoint=checkpoint, attention=spec, out=str(tmp_path), progress=False))
    # a shared-QK model runs clustered with keys = queries
    report = evaluate(EvaluateConfig(checkpoint=str(best(trained["synth_shared_full"])), attention="clustered-2",
                                     out=str(tmp_path / "c"), progress=False))
    assert report["evaluated_with"] == {"name": "clustered", "clusters": 2, "bits": 63, "iterations": 10}


def write_kaldi_dir(corpus: Path, split: str, folder: Path) -> int:
    """A Kaldi data directory (no utt2spk) with the audio and words of one split of the corpus."""
    folder.mkdir(parents=True)
    with gzip.open(corpus / f"synth_cuts_{split}.jsonl.gz", "rt") as handle:
        cuts = [json.loads(line) for line in handle]
    wav, text = [], []
    for cut in cuts:
        source = cut["recording"]["sources"][0]["source"]
        path = Path(source) if Path(source).is_absolute() else corpus / source
        wav.append(f"{cut['id']} {path}\n")
        text.append(f"{cut['id']} {cut['supervisions'][0]['text'].upper()}\n")   # normalised on reading
    (folder / "wav.scp").write_text("".join(wav))
    (folder / "text").write_text("".join(text))
    return len(cuts)


def test_a_kaldi_data_directory_scores_like_the_same_utterances_from_the_manifest(trained, tiny_synth, tmp_path):
    checkpoint = str(best(trained["synth_full"]))
    count = write_kaldi_dir(tiny_synth, "test", tmp_path / "kaldi")
    from_dir = evaluate(EvaluateConfig(checkpoint=checkpoint, data_dir=str(tmp_path / "kaldi"),
                                       out=str(tmp_path / "a"), progress=False))
    from_split = evaluate(EvaluateConfig(checkpoint=checkpoint, split="test", out=str(tmp_path / "b"),
                                         progress=False))
    assert from_dir["utterances"] == count and from_dir["scored_heads"] == ["chars"]
    assert "per" not in from_dir["error_rates"]                     # no phone transcripts in a Kaldi dir
    assert from_dir["error_rates"]["wer"] == pytest.approx(from_split["error_rates"]["wer"], abs=1e-12)
    assert from_dir["error_rates"]["cer"] == pytest.approx(from_split["error_rates"]["cer"], abs=1e-12)
    assert (tmp_path / "kaldi" / "asr_manifests" / "kaldi_cuts_eval.jsonl.gz").is_file()
    hypotheses = [json.loads(line) for line in (tmp_path / "a" / "hypotheses.jsonl").read_text().splitlines()]
    assert "reference" not in hypotheses[0]["phones"] and "reference" in hypotheses[0]["chars"]


def test_arguments_and_their_errors(trained, tmp_path, capsys):
    config, options = parse_arguments(["checkpoint=x.ckpt", "attention=iclustered", "attention.clusters=5",
                                       "data.root=/d", "decoder=beam", "beam_size=4"])
    assert (config.attention, options, config.data, config.beam_size) == ("iclustered", {"clusters": "5"},
                                                                          {"root": "/d"}, 4)
    for argv, message in ((["attention=full"], "checkpoint=PATH"), (["checkpoint=a", "colour=red"], "colour"),
                          (["checkpoint=a", "decoder=viterbi"], "greedy"), (["checkpoint"], "key=value")):
        with pytest.raises(EvaluationError, match=message):
            parse_arguments(argv)
    assert main([f"checkpoint={tmp_path}/missing.ckpt"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([f"checkpoint={best(trained['synth_full'])}", "device=gpu"]) == 2
    assert "device='gpu' is not a device" in capsys.readouterr().err
    (tmp_path / "not_kaldi").mkdir()
    (tmp_path / "a_file").write_text("")
    for folder, says in (("not_kaldi", "is not a Kaldi data directory: wav.scp is missing"),
                         ("a_file", "is a file, not a Kaldi data directory")):
        assert main([f"checkpoint={best(trained['synth_full'])}", f"data_dir={tmp_path / folder}"]) == 2
        error = capsys.readouterr().err
        assert len(error.strip().splitlines()) == 1 and f"{tmp_path / folder} {says}" in error
    assert main([f"checkpoint={best(trained['synth_full'])}", "attention=clustered", "attention.clusters=0"]) == 2
    assert "clusters" in capsys.readouterr().err
    # a folder of manifests written under another corpus name (the model was trained on 'synth')
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for manifest in tiny_synth_manifests(trained):
        (renamed / manifest.name.replace("synth_", "mytimit_", 1)).write_bytes(manifest.read_bytes())
    (renamed / "audio").symlink_to(manifest.parent / "audio")   # the manifests' relative audio paths
    assert main([f"checkpoint={best(trained['synth_full'])}", f"data.root={renamed}", f"out={tmp_path}/e",
                 "progress=false"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "holds manifests of corpus 'mytimit' for split 'test'" in error[0]
    assert error[0].endswith("add data.corpus=mytimit")
    assert main([f"checkpoint={best(trained['synth_full'])}", f"data.root={renamed}", "data.corpus=mytimit",
                 f"out={tmp_path}/e", "progress=false", "limit=1"]) == 0
    capsys.readouterr()


def test_cli_prints_the_error_rates_and_the_forward_time(trained, tmp_path, capsys):
    code = main([f"checkpoint={best(trained['synth_full'])}", "attention=i-clustered-3", "decoder=beam",
                 "beam_size=2", f"out={tmp_path}", "progress=false"])
    printed = capsys.readouterr().out
    assert code == 0 and "PER" in printed and "ms per utterance" in printed
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["decoder"] == "beam (size 2)" and report["evaluated_with"]["clusters"] == 3


def test_cross_matrix_shape_invalid_cells_marks_and_cache(trained, tmp_path, monkeypatch, capsys):
    columns = [f"full={best(trained['synth_full'])}", f"shared={best(trained['synth_shared_full'])}"]
    # the tiny models have head_dim 8: agglomerative-16 does not fit them
    specs = ["full", "shared-full", "clustered-2", "linear", "agglomerative-16"]
    argv = [*columns, "--specs", *specs, "--out", str(tmp_path)]
    assert cross_matrix.main(argv) == 0
    matrix = json.loads((tmp_path / "matrix.json").read_text())
    assert [row["evaluate_with"] for row in matrix["rows"]] == specs
    assert [column["label"] for column in matrix["columns"]] == ["full", "shared"]
    cells = {(row["evaluate_with"], label): cell for row in matrix["rows"] for label, cell in row["cells"].items()}
    assert not cells["shared-full", "full"]["valid"]                # separate Q/K: shared_full is not defined
    assert not cells["agglomerative-16", "full"]["valid"] and not cells["agglomerative-16", "shared"]["valid"]
    assert "classes=16 exceeds the head dim 8" in cells["agglomerative-16", "full"]["reason"]
    assert all(cell["valid"] for key, cell in cells.items()
               if key != ("shared-full", "full") and key[0] != "agglomerative-16")
    assert [key for key, cell in cells.items() if cell["same_as_training"]] == [("full", "full"),
                                                                                  ("shared-full", "shared")]
    with open(tmp_path / "matrix.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 10
    table = (tmp_path / "matrix.md").read_text()
    assert "| shared-full | - |" in table and "***" in table
    assert (tmp_path / "matrix_heatmap.png").stat().st_size > 0 and (tmp_path / "speed_accuracy.png").is_file()
    # a second run computes nothing: every cell is reused
    capsys.readouterr()
    monkeypatch.setattr(attention_matrix, "decode_split", lambda *a, **k: pytest.fail("a cached cell was recomputed"))
    assert cross_matrix.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count(": cached") == 10
    # stderr is no terminal here (no bar): the counter still counts the cells
    counters = [line.split("]")[0] for line in printed.splitlines() if line.startswith("[cross_matrix ")]
    assert counters == [f"[cross_matrix {n}/10" for n in range(1, 11)]
    assert json.loads((tmp_path / "matrix.json").read_text())["rows"] == matrix["rows"]


# ---- checkpoints that cannot be used: one line naming the file, exit status 2 -----------------------
def bad_checkpoints(good: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """Broken variants of a good checkpoint: name -> (file, what the error says about it)."""
    folder.mkdir(exist_ok=True)
    saved = torch.load(good, map_location="cpu", weights_only=True)
    cases = {"text": (folder / "notes.ckpt", "is not a PyTorch checkpoint"),
             "truncated": (folder / "truncated.ckpt", "is not a PyTorch checkpoint"),
             "newer": (folder / "newer.ckpt", "written by a newer version of this toolkit"),
             "older": (folder / "older.ckpt", "checkpoint format 0, older than this version reads"),
             "unknown_attention": (folder / "unknown_attention.ckpt",
                                   "trained with attention 'fancy', which this build of attention_ext does not have"),
             "another_model": (folder / "another_model.ckpt", "its hyper_parameters lack tokenizers"),
             "folder": (folder, "is a folder")}
    cases["text"][0].write_text("epoch 3 looked good\n")
    cases["truncated"][0].write_bytes(good.read_bytes()[:good.stat().st_size // 2])
    torch.save({**saved, FORMAT_KEY: CHECKPOINT_FORMAT + 1}, cases["newer"][0])
    torch.save({**saved, FORMAT_KEY: 0}, cases["older"][0])
    torch.save({**saved, "hyper_parameters": {**saved["hyper_parameters"], "attention": {"name": "fancy"}}},
               cases["unknown_attention"][0])
    hyper_parameters = {key: value for key, value in saved["hyper_parameters"].items() if key != "tokenizers"}
    torch.save({**saved, "hyper_parameters": hyper_parameters}, cases["another_model"][0])
    return cases


def one_error_line(stderr: str, command: str, path: Path, says: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"{command}: error: checkpoint {path}") and says in lines[0], lines[0]


def test_a_checkpoint_carries_its_format_and_one_without_it_is_format_1(trained, tmp_path):
    good = best(trained["synth_full"])
    saved = torch.load(good, map_location="cpu", weights_only=True)
    assert saved[FORMAT_KEY] == CHECKPOINT_FORMAT == 2
    del saved[FORMAT_KEY]                     # as written before the number existed (format 1) ...
    del saved["hyper_parameters"]["frontend"]   # ... when the front-end was implied
    torch.save(saved, tmp_path / "before_formats.ckpt")
    assert FORMAT_KEY not in read_checkpoint(tmp_path / "before_formats.ckpt")
    model = load_model(tmp_path / "before_formats.ckpt")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in saved["state_dict"].items())
    # format 1 implied Kaldi fbank with FilterBank's defaults, which is what the run computed
    assert model.frontend.options == FilterBank(40).options == load_model(good).frontend.options


def test_the_checkpoint_carries_the_feature_front_end(trained, tmp_path):
    good = best(trained["synth_full"])
    saved = torch.load(good, map_location="cpu", weights_only=True)
    stored = saved["hyper_parameters"]["frontend"]
    assert stored == {"type": "kaldi_fbank", "num_mel_bins": 40, "sampling_rate": 16000, "frame_length_ms": 25.0,
                      "frame_shift_ms": 10.0, "low_freq": 20.0, "high_freq": 0.0, "preemphasis": 0.97,
                      "dither": 0.0, "snip_edges": True, "input_scale": 32768.0}
    # the evaluation's data module computes features with the checkpoint's front-end
    model = load_model(good)
    assert evaluation_data(model, good, "test", progress=False).datamodule.filterbank.options == stored
    for key, value, says in (("dither", 1.0, "dither=1.0 is not supported"),
                             ("num_mel_bins", 80, "80 mel bins, but the model takes feature_dim=40"),
                             ("window", "hann", "not those of a FilterBank")):
        changed = dict(saved, hyper_parameters=dict(saved["hyper_parameters"], frontend={**stored, key: value}))
        torch.save(changed, tmp_path / f"{key}.ckpt")
        with pytest.raises(CheckpointError, match=says):
            read_checkpoint(tmp_path / f"{key}.ckpt")
    without = dict(saved, hyper_parameters={k: v for k, v in saved["hyper_parameters"].items() if k != "frontend"})
    torch.save(without, tmp_path / "format2_without.ckpt")     # format 2 must carry it
    with pytest.raises(CheckpointError, match="lack frontend"):
        read_checkpoint(tmp_path / "format2_without.ckpt")


def test_bad_checkpoints_are_one_line_naming_the_file_in_evaluate_and_cross_matrix(trained, tmp_path, capsys):
    for name, (path, says) in bad_checkpoints(best(trained["synth_full"]), tmp_path / "bad").items():
        with pytest.raises(CheckpointError, match=says):
            read_checkpoint(path)
        assert main([f"checkpoint={path}"]) == USAGE_ERROR, name
        one_error_line(capsys.readouterr().err, "asr.evaluate", path, says)
        assert cross_matrix.main([f"good={best(trained['synth_full'])}", f"bad={path}", "--specs", "full",
                                  "--out", str(tmp_path / "matrix")]) == USAGE_ERROR, name
        one_error_line(capsys.readouterr().err, "asr.cross_matrix", path, says)
    assert not (tmp_path / "matrix" / "cells").exists()      # a bad column stops the matrix before any cell
    assert main([f"checkpoint={tmp_path}/missing.ckpt"]) == USAGE_ERROR
    one_error_line(capsys.readouterr().err, "asr.evaluate", tmp_path / "missing.ckpt", "no such file")


def test_the_command_exits_2_with_one_line_for_a_file_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "asr.evaluate", f"checkpoint={tmp_path}/passwd"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    one_error_line(done.stderr, "asr.evaluate", tmp_path / "passwd", "is not a PyTorch checkpoint")


# ---- where results go, and what the command line decides -------------------------------------------------
def test_evaluations_that_can_differ_get_their_own_folders(trained):
    checkpoint = str(best(trained["synth_full"]))
    first = evaluate(EvaluateConfig(checkpoint=checkpoint, attention="clustered-2", seed=0, progress=False))
    second = evaluate(EvaluateConfig(checkpoint=checkpoint, attention="clustered-2", seed=1, progress=False))
    evaluations = trained["synth_full"] / "evaluations"
    assert Path(first["out"]) == evaluations / "test_clustered_bits63_clusters2_iterations10_greedy_seed0_cpu"
    assert Path(second["out"]) == evaluations / "test_clustered_bits63_clusters2_iterations10_greedy_seed1_cpu"
    assert json.loads((Path(first["out"]) / "results.json").read_text())["seed"] == 0   # not overwritten
    assert json.loads((Path(second["out"]) / "results.json").read_text())["seed"] == 1

    def name(**options) -> str:
        return default_out_dir(EvaluateConfig(checkpoint=checkpoint, **options), "dev", "full").name
    assert name() == "dev_full_greedy_seed0_cpu"
    assert name(decoder="beam", beam_size=4, limit=3, device="cuda:1") == "dev_full_beam4_seed0_cuda1_limit3"
    data = name(data={"root": "/corpora/a"})
    assert data.startswith("dev_full_greedy_seed0_cpu_data") and data != name(data={"root": "/corpora/b"})
    assert name(data={"progress": False, "num_workers": 2}) == name()      # these change no number
    assert name(data_dir="/audio/a") != name(data_dir="/audio/b")


def test_the_command_line_wins_over_the_stored_run_config(trained, tiny_synth, tmp_path, capfd):
    """progress=false hides the feature bar although the run folder stored data.progress: true."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(best(trained["synth_full"]), run / "checkpoints" / "best.ckpt")
    stored = yaml.safe_load((trained["synth_full"] / "config.yaml").read_text())
    corpus = tmp_path / "corpus"                 # the corpus without its feature cache: features get computed
    shutil.copytree(tiny_synth, corpus, ignore=shutil.ignore_patterns("features"))
    stored["data"].update(progress=True, root=str(corpus))
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    checkpoint = str(run / "checkpoints" / "best.ckpt")
    capfd.readouterr()
    evaluate(EvaluateConfig(checkpoint=checkpoint, split="dev", progress=False, out=str(tmp_path / "a")))
    assert "fbank" not in capfd.readouterr().err
    evaluate(EvaluateConfig(checkpoint=checkpoint, split="test", out=str(tmp_path / "b")))
    assert "fbank test" in capfd.readouterr().err           # progress left at its default: the bar shows
    model = load_model(checkpoint)
    for data, message in (({"roots": "x"}, "data.roots is not a data option"),
                          ({"num_mel_bins": 80}, "data.num_mel_bins=80 cannot be changed for an evaluation"),
                          ({"max_duration": -1}, "data.max_duration=-1 must be a positive number")):
        with pytest.raises(EvaluationError, match=message):
            evaluation_data(model, checkpoint, data_overrides=data, progress=False)


def test_what_shaped_the_training_set_is_not_applied_to_an_evaluation(trained, tiny_synth, tmp_path):
    """A model trained with speed-perturbed copies and a cap on the training utterances (an adapted model
    has speed copies by default) scores a split named as the training split, or a data_dir, as it is:
    every utterance once. Asking for either at evaluation is refused."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(best(trained["synth_full"]), run / "checkpoints" / "best.ckpt")
    stored = yaml.safe_load((trained["synth_full"] / "config.yaml").read_text())
    stored["data"].update(root=str(tiny_synth), max_train_utterances=2,
                          augment={**stored["data"].get("augment", {}), "speed": [0.9, 1.0, 1.1]})
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    checkpoint = str(run / "checkpoints" / "best.ckpt")
    model = load_model(checkpoint)
    with gzip.open(tiny_synth / "synth_cuts_train.jsonl.gz", "rt") as handle:
        ids = sorted(json.loads(line)["id"] for line in handle)
    data = evaluation_data(model, checkpoint, "train", progress=False)
    assert sorted(cut.id for cut in data.datamodule.split("train", features=False).cuts) == ids
    for key, value in (("augment", {"speed": [0.9, 1.0, 1.1]}), ("max_train_utterances", 2)):
        with pytest.raises(EvaluationError, match=f"data.{key} shapes the training set only"):
            evaluation_data(model, checkpoint, data_overrides={key: value}, progress=False)


# ---- shared-QK models in the key form they were trained with (issue 31) ------------------------------
def dev_batch_log_probs(model, checkpoint: Path, attention: str, shared_qk_keys: str) -> dict:
    """The model's log-probs on the dev split's first batch, in float64, under `attention`."""
    from asr.evaluation.attention_choice import set_evaluation_attention
    from attention_ext import parse_attention_spec
    key_form = set_evaluation_attention(model, parse_attention_spec(attention), shared_qk_keys)
    data = evaluation_data(model, checkpoint, "dev", progress=False)
    batch = next(iter(data.datamodule.dataloader("dev")))
    torch.manual_seed(0)
    with torch.no_grad():
        log_probs, _ = model(batch["features"].double(), batch["feature_lengths"])
    return {"key_form": key_form, **log_probs}


def test_a_shared_qk_model_runs_full_and_clustered_in_its_trained_key_form(trained):
    """Trained with shared_full: full, and clustered with a cluster per position, are shared_full exactly;
    shared_qk_keys=raw gives the raw queries as keys (another attention: other numbers)."""
    checkpoint = best(trained["synth_shared_full"])
    model = load_model(checkpoint).double()
    reference = dev_batch_log_probs(model, checkpoint, "shared-full", "trained")
    for spec in ("full", "clustered-100000", "i-clustered-100000:topk=4", "oracle-top-100000"):
        got = dev_batch_log_probs(model, checkpoint, spec, "trained")
        assert got["key_form"] == "reformer", spec
        for kind in ("phones", "chars"):
            torch.testing.assert_close(got[kind], reference[kind], rtol=1e-10, atol=1e-10)
    raw = dev_batch_log_probs(model, checkpoint, "full", "raw")
    assert raw["key_form"] == "queries"
    assert (raw["phones"] - reference["phones"]).abs().max() > 1e-3
    # the raw form is what a plain swap of the attention gives (every evaluation before the option)
    model.set_attention(validate_attention("full"))
    data = evaluation_data(model, checkpoint, "dev", progress=False)
    batch = next(iter(data.datamodule.dataloader("dev")))
    with torch.no_grad():
        plain, _ = model(batch["features"].double(), batch["feature_lengths"])
    torch.testing.assert_close(raw["phones"], plain["phones"], rtol=0, atol=0)


def test_the_key_form_in_results_folders_and_the_option_errors(trained, tmp_path, capsys):
    shared = str(best(trained["synth_shared_full"]))
    trained_form = evaluate(EvaluateConfig(checkpoint=shared, attention="clustered-2", progress=False))
    raw_form = evaluate(EvaluateConfig(checkpoint=shared, attention="clustered-2", shared_qk_keys="raw",
                                       progress=False))
    assert (trained_form["key_form"], raw_form["key_form"]) == ("reformer", "queries")
    assert Path(trained_form["out"]).name == "test_clustered_bits63_clusters2_iterations10_reformer-keys_greedy_seed0_cpu"
    assert Path(raw_form["out"]).name == "test_clustered_bits63_clusters2_iterations10_greedy_seed0_cpu"
    separate = evaluate(EvaluateConfig(checkpoint=str(best(trained["synth_full"])), attention="clustered-2",
                                       out=str(tmp_path / "s"), progress=False))
    assert separate["key_form"] == "separate"
    assert main([f"checkpoint={shared}", "attention=full", f"out={tmp_path / 'f'}", "progress=false"]) == 0
    assert "keys: unit-normalised queries, no attention to self (Reformer) (shared_qk_keys=trained)" in capsys.readouterr().out
    assert main([f"checkpoint={shared}", "shared_qk_keys=unit"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "shared_qk_keys='unit' is not a key form; choose trained" in error[0]
    with pytest.raises(SystemExit) as exit_info:   # argparse refuses the choice, exit status 2
        cross_matrix.main([shared, "--shared-qk-keys", "unit", "--out", str(tmp_path / "m")])
    assert exit_info.value.code == USAGE_ERROR and "--shared-qk-keys: invalid choice: 'unit'" in capsys.readouterr().err


def test_cross_matrix_cells_follow_the_key_form_and_recompute_only_when_it_changes(trained, tmp_path, capsys):
    columns = [f"full={best(trained['synth_full'])}", f"shared={best(trained['synth_shared_full'])}"]
    argv = [*columns, "--specs", "full", "shared-full", "clustered-2", "--out", str(tmp_path), "--split", "dev"]

    def cells() -> dict:
        matrix = json.loads((tmp_path / "matrix.json").read_text())
        return {(row["evaluate_with"], label): cell for row in matrix["rows"] for label, cell in row["cells"].items()}

    assert cross_matrix.main(argv) == 0
    first = cells()
    assert {key: cell["key_form"] for key, cell in first.items()} == {
        ("full", "full"): "separate", ("shared-full", "full"): "separate", ("clustered-2", "full"): "separate",
        ("full", "shared"): "reformer", ("shared-full", "shared"): "reformer", ("clustered-2", "shared"): "reformer"}
    assert first["full", "shared"]["per"] == first["shared-full", "shared"]["per"]
    assert "ran in the key form each model was trained with" in (tmp_path / "matrix.md").read_text()
    stored = json.loads((tmp_path / "cells" / "shared__full.json").read_text())
    assert not stored["forward_time_comparable"]
    rows = {row["evaluate_with"]: row for row in json.loads((tmp_path / "matrix.json").read_text())["rows"]}
    assert rows["full"]["forward_ms_per_utterance"] == first["full", "full"]["forward_ms_per_utterance"]
    capsys.readouterr()
    assert cross_matrix.main([*argv, "--shared-qk-keys", "raw"]) == 0
    printed = capsys.readouterr().out
    # only the shared column's separate-key rows change form; the rest is reused
    assert printed.count(": cached") == 4 and "shared x full: cached" not in printed
    raw = cells()
    assert raw["full", "shared"]["key_form"] == raw["clustered-2", "shared"]["key_form"] == "queries"
    # a cell written before key forms were recorded has the raw form: still valid for a raw run
    path = tmp_path / "cells" / "shared__clustered-2.json"
    cell = json.loads(path.read_text())
    del cell["key_form"]
    path.write_text(json.dumps(cell))
    assert cross_matrix.main([*argv, "--shared-qk-keys", "raw"]) == 0
    assert capsys.readouterr().out.count(": cached") == 6
