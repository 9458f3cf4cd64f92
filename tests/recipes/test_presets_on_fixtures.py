"""The corpus presets ({wsj,timit,librispeech,switchboard}_<attention>, asr/config/presets.py): they compose and validate,
the WSJ ones carry the paper's numbers, the mini LibriSpeech one is small (it trains on the corpus
of test_librispeech_download.py), and one preset per corpus trains on that recipe's fixture tree
(built by the recipe tests, prepared by the recipe) - WSJ through the documented command line.

The training runs keep each preset as it is - model (9 or 12 layers), attention with its options,
optimiser, features, targets - and override only what a short CI run needs: 2 steps, one feature
process, no DataLoader workers for the in-process runs, no progress bars, and for the word-piece
corpora a vocabulary the fixtures' few transcripts can train. (The fixtures are tiny, a few
utterances of 0.3-3 s, so the 9- and 12-layer models take a second or two on a CPU.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from asr.config.schema import attention_settings, register_schema, validate_config
from asr.core.errors import ConfigError
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.corpus.manifests import ManifestError
from asr.config.presets import corpus_setups, preset_names
from asr.training.fit import train
from recipes.librispeech.prepare import MINI_OUT, prepare_librispeech
from recipes.switchboard.prepare import prepare_switchboard
from recipes.timit.prepare import prepare_timit
from recipes.wsj.prepare import prepare_wsj
# The fixture trees of the recipe tests (tests/recipes/corpus_fixtures.py writes their audio files).
from test_librispeech import build_librispeech
from test_switchboard import build_switchboard
from test_timit import build_timit
from test_wsj import LEXICON, build_ldc_discs

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
# (conf=adapt fine-tunes a trained model on a user's folder, no corpus's setup: tests/asr/test_adapt.py;
# conf=synth_longform goes on from a trained model too: tests/asr/test_train.py)
PRESETS = [name for name in preset_names() if name not in corpus_setups() and name not in ("adapt", "synth_longform")]
CORPORA = ("wsj", "timit", "librispeech", "switchboard")
SMALL_PRESETS = ("librispeech_mini_iclustered",)   # sized for a CPU or one GPU, not the paper's setups
ATTENTIONS = ("full", "shared_full", "lsh1", "lsh4", "clustered", "iclustered", "linear", "agglomerative")
# What a short CPU run needs; the preset's model, attention, optimiser and data stay as they are.
TINY = ["trainer.max_steps=2", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1",
        "data.progress=false", "data.feature_jobs=1"]


def compose_config(*overrides: str):
    register_schema()   # the schema and the presets, as `python -m asr.train` registers them
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def kaldi_frames(samples: int) -> int:
    """Frames of a 25 ms / 10 ms fbank with Kaldi's snip_edges (400 and 160 samples at 16 kHz)."""
    return 1 + (samples - 400) // 160


# ---- composition and the paper's numbers -----------------------------------------------------------
def test_there_is_a_preset_for_every_corpus_and_attention():
    assert {f"{corpus}_{attention}" for corpus in CORPORA for attention in ATTENTIONS} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_validates(preset):
    cfg = compose_config(f"conf={preset}")
    validate_config(cfg)
    corpus = preset.split("_")[0]
    assert cfg.data.corpus == corpus
    if corpus != "synth":   # real corpora train whole epochs, not for a wall-clock budget
        assert cfg.trainer.max_minutes is None and cfg.trainer.max_epochs >= 50
    if corpus != "synth" and preset not in SMALL_PRESETS:   # the paper's setups, on GPUs
        assert cfg.data.root == f"data/{corpus}"        # the recipes' default --out
        assert cfg.model.subsampling == 1                # the paper: no subsampling


def test_mini_librispeech_preset_is_sized_for_one_machine():
    """librispeech_mini_iclustered: the paper's i-clustered options on the synth presets' smaller
    encoder and optimiser, word pieces from 80 fbank, reading what `--download mini` writes."""
    cfg = compose_config("conf=librispeech_mini_iclustered")
    assert cfg.data.root == MINI_OUT == "data/librispeech_mini"
    assert attention_settings(cfg.attention) == EXPECTED_ATTENTION["iclustered"][:2]
    model = cfg.model
    assert (model.layers, model.heads, model.head_dim, model.ff_dim, model.subsampling) == (6, 4, 32, 512, 2)
    assert list(cfg.data.targets) == ["sentencepiece"] and cfg.data.num_mel_bins == 80
    assert cfg.data.max_duration >= 35.0   # LibriSpeech's longest utterances
    assert cfg.trainer.accelerator == "auto" and cfg.trainer.early_stopping_patience is not None


EXPECTED_ATTENTION = {   # preset suffix -> (name, options after the registry's defaults, shared_qk)
    "full": ("full", {}, False),
    "shared_full": ("shared_full", {}, True),
    "lsh1": ("lsh", {"rounds": 1, "chunk_size": 32, "max_buckets": 256}, True),
    "lsh4": ("lsh", {"rounds": 4, "chunk_size": 32, "max_buckets": 256}, True),
    "clustered": ("clustered", {"clusters": 100, "bits": 63, "iterations": 10}, False),
    "iclustered": ("iclustered", {"clusters": 100, "bits": 63, "iterations": 10, "topk": 32}, False),
    "linear": ("linear", {}, False),                              # not in the paper: our defaults
    "agglomerative": ("agglomerative", {"classes": 8}, False),
}


@pytest.mark.parametrize("corpus", CORPORA)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_presets_carry_the_papers_attention_settings(corpus, attention):
    """Sup. C.3.1/C.3.2: 100 clusters, 63 bits, 10 Lloyd iterations, top-32 keys; Reformer with 1 or 4
    rounds and chunks of 32, on shared query/key projections (as shared-full)."""
    cfg = compose_config(f"conf={corpus}_{attention}")
    name, options, shared_qk = EXPECTED_ATTENTION[attention]
    assert attention_settings(cfg.attention) == (name, options)
    assert cfg.model.shared_qk is shared_qk


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_wsj_presets_carry_the_papers_setup(attention):
    """Sec. 4.1 and sup. C.3.1: 40-dim filter banks, phones, no subsampling, 9 layers of 6 heads x 32 with
    feed-forward 768; RAdam lr 1e-4, gradient norm 10, weight decay 0.01, lr dropped on a plateau."""
    cfg = compose_config(f"conf=wsj_{attention}")
    model, optim, data = cfg.model, cfg.optim, cfg.data
    assert (model.layers, model.heads, model.head_dim, model.ff_dim, model.subsampling) == (9, 6, 32, 768, 1)
    assert data.num_mel_bins == 40 and data.targets[0] == "phones"
    assert (optim.lr, optim.clip_norm, optim.weight_decay) == (1e-4, 10.0, 0.01)
    assert 0 < optim.plateau_factor < 1 and optim.warmup_steps == 0
    assert data.max_duration >= 25.0   # batches by duration, at least WSJ's longest utterance


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_other_corpora_follow_the_paper(attention):
    """TIMIT and LibriSpeech use the WSJ model and recipe; Switchboard the paper's Switchboard setup
    (sup. C.3.2: 12 layers, lr 2e-4, 80-dim filter banks) with word pieces (WER picks the best model)."""
    for corpus in ("timit", "librispeech"):
        cfg = compose_config(f"conf={corpus}_{attention}")
        assert (cfg.model.layers, cfg.model.heads, cfg.model.head_dim, cfg.model.ff_dim) == (9, 6, 32, 768)
        assert (cfg.optim.lr, cfg.optim.clip_norm, cfg.optim.weight_decay) == (1e-4, 10.0, 0.01)
    assert list(compose_config(f"conf=timit_{attention}").data.targets) == ["phones"]
    librispeech = compose_config(f"conf=librispeech_{attention}").data
    assert list(librispeech.targets) == ["sentencepiece"] and librispeech.sentencepiece_vocab == 500
    swbd = compose_config(f"conf=switchboard_{attention}")
    assert (swbd.model.layers, swbd.model.heads, swbd.model.head_dim, swbd.model.ff_dim) == (12, 6, 32, 768)
    assert (swbd.optim.lr, swbd.optim.clip_norm, swbd.optim.weight_decay) == (2e-4, 10.0, 0.01)
    assert swbd.data.num_mel_bins == 80 and list(swbd.data.targets) == ["sentencepiece"]


def test_attention_options_live_only_in_the_attention_group_files():
    for path in (CONF / "conf").glob("*.yaml"):
        assert "\nattention:" not in path.read_text(), f"{path.name} sets attention options in its body"


# ---- a missing corpus says how to prepare it -------------------------------------------------------
def test_missing_data_root_names_the_recipe_command(tmp_path):
    with pytest.raises(ConfigError) as error:
        train(compose_config("conf=wsj_iclustered", f"data.root={tmp_path}/nowhere", *TINY), tmp_path / "run")
    message = str(error.value)
    assert f"data.root='{tmp_path}/nowhere' does not exist, so it holds no wsj manifests" in message
    assert f"python -m recipes.wsj.prepare --corpus-dir WSJ0_DIR WSJ1_DIR --lexicon cmudict-0.7b " \
           f"--out {tmp_path}/nowhere" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has no switchboard_cuts_<split>.jsonl.gz for split\(s\) "
                                          r"\['train', 'dev', 'test'\].*python -m recipes.switchboard.prepare"):
        train(compose_config("conf=switchboard_full", f"data.root={tmp_path}/empty", *TINY), tmp_path / "run")
    # the data module (used without asr.train, e.g. by evaluation) says the same
    datamodule = SpeechDataModule(DataConfig.of(compose_config("conf=timit_full", f"data.root={tmp_path}/empty").data))
    with pytest.raises(ManifestError, match=f"python -m recipes.timit.prepare --corpus-dir TIMIT_DIR "
                                            f"--out {tmp_path}/empty"):
        datamodule.setup("fit")


# ---- training on the fixtures ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, Path]:
    """Each corpus's fixture tree, prepared by its recipe into manifests."""
    base = tmp_path_factory.mktemp("corpora")
    out = {corpus: base / corpus / "prepared" for corpus in CORPORA}
    build_ldc_discs(base / "wsj" / "corpus")
    (base / "wsj" / "cmudict").write_text(LEXICON)
    prepare_wsj(base / "wsj" / "corpus", out["wsj"], base / "wsj" / "cmudict", jobs=1, progress=False)
    build_timit(base / "timit" / "corpus")
    prepare_timit(base / "timit" / "corpus", out["timit"], jobs=1, progress=False)
    build_librispeech(base / "librispeech" / "corpus")
    prepare_librispeech(base / "librispeech" / "corpus", out["librispeech"], jobs=1, progress=False,
                        train_subsets=("train-clean-100", "train-clean-360"))
    build_switchboard(base / "switchboard" / "corpus")
    prepare_switchboard(base / "switchboard" / "corpus" / "LDC97S62", out["switchboard"], jobs=1, progress=False,
                        transcripts_dir=base / "switchboard" / "corpus" / "swb_ms98_transcriptions",
                        dev_conversations=1, test_conversations=1)
    return out


def check_trained(run: Path, cfg, corpus: Path, test_samples: list[int]) -> dict:
    """The run took exactly 2 optimiser steps with the preset's attention and model, wrote both
    checkpoints, and tested the best one on the fixture's test split (whose frame count is known:
    no subsampling, so the encoder gives one position per 10 ms fbank frame)."""
    name, options = attention_settings(cfg.attention)
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 2
    assert (results["attention"], results["attention_options"]) == (name, options)
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    # written at a validation: Lightning may stop at max_steps=2 before validating the second epoch
    assert 1 <= checkpoint["global_step"] <= 2
    hyper = checkpoint["hyper_parameters"]
    assert hyper["attention"] == {"name": name, **options}
    assert {key: hyper["model"][key] for key in ("layers", "heads", "head_dim", "ff_dim", "subsampling")} == \
        {key: cfg.model[key] for key in ("layers", "heads", "head_dim", "ff_dim", "subsampling")}
    assert hyper["feature_dim"] == cfg.data.num_mel_bins
    assert list(hyper["tokenizers"]) == list(cfg.data.targets)
    test = results["test"]
    assert test["encoder_length"] == pytest.approx(sum(map(kaldi_frames, test_samples)) / len(test_samples))
    assert (corpus / "features").is_dir()   # the features were computed once, beside the manifests
    return test


def test_wsj_iclustered_trains_through_the_command_line(prepared, tmp_path):
    """The documented way in: python -m asr.train conf=wsj_iclustered data.root=... (DataLoader
    workers as the preset has them)."""
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    arguments = ["conf=wsj_iclustered", f"data.root={prepared['wsj']}", *TINY, f"run_dir={run}"]
    completed = subprocess.run([sys.executable, "-m", "asr.train", *arguments], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    cfg = compose_config(*arguments)
    assert (cfg.attention.name, cfg.model.layers, cfg.model.heads, cfg.model.ff_dim) == ("iclustered", 9, 6, 768)
    test = check_trained(run, cfg, prepared["wsj"], [5600])   # eval92: 440c0401
    assert set(test) >= {"per", "per_phones", "wer", "wer_chars", "cer", "primary_error"}
    assert test["primary_error"] == test["per"]            # phones first: PER picks the best checkpoint
    assert "test: PER" in completed.stdout and str(run) in completed.stdout


# preset -> (test split's utterance sample counts, the error rates its targets give)
IN_PROCESS = {
    "timit_clustered": ([4000, 5200], {"per", "per_phones", "primary_error"}),     # mdab0 si1039, sx139
    "timit_agglomerative": ([4000, 5200], {"per", "per_phones", "primary_error"}),
    "wsj_linear": ([5600], {"per", "per_phones", "wer", "wer_chars", "cer", "cer_chars",   # eval92: 440c0401
                            "primary_error"}),
    "librispeech_full": ([5600], {"wer", "cer", "wer_sentencepiece", "cer_sentencepiece", "primary_error"}),
    "switchboard_iclustered": ([16000, 16000], {"wer", "cer", "wer_sentencepiece", "cer_sentencepiece",
                                                "primary_error"}),                 # sw2005 A and B, 1 s each
}


# The most pieces sentencepiece can learn from the fixtures' training transcripts (LibriSpeech's 4: 43;
# Switchboard's 2: 29, the characters alone).
FIXTURE_VOCAB = {"librispeech": 40, "switchboard": 29}


@pytest.mark.parametrize("preset", sorted(IN_PROCESS))
def test_a_preset_of_each_other_corpus_and_attention_trains_on_its_fixture(preset, prepared, tmp_path):
    corpus = preset.split("_")[0]
    overrides = [f"conf={preset}", f"data.root={prepared[corpus]}", *TINY, "data.num_workers=0"]
    if corpus in FIXTURE_VOCAB:   # 500 word pieces cannot be learned from a handful of fixture transcripts
        overrides.append(f"data.sentencepiece_vocab={FIXTURE_VOCAB[corpus]}")
    cfg = compose_config(*overrides)
    train(cfg, tmp_path / "run")
    samples, rates = IN_PROCESS[preset]
    test = check_trained(tmp_path / "run", cfg, prepared[corpus], samples)
    assert set(test) == rates | {"encoder_length"}
    primary = "per" if corpus in ("timit", "wsj") else "wer"
    assert test["primary_error"] == test[primary] and test[primary] >= 0.0
