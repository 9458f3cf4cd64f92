"""asr.train init_from=...: adapting a tiny trained model to a Kaldi-style folder of "your" speech.

The folder is the tiny synth corpus's ten utterances written as wav.scp and text (upper case, as a
user's transcripts may be); the source model is a tiny two-layer synth_full run, so that
adapt.freeze=encoder_lower_half freezes the front-end and layer 0 and trains layer 1 and the heads.
"""
from __future__ import annotations

import filecmp
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import yaml

from asr.core.errors import ConfigError
from asr.training.adaptation_data import (AdaptationDataError, AdaptationFolders, held_out_texts,
                                          prepare_adaptation_data, write_rehearsal_split)
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.evaluation.evaluation import EvaluateConfig, evaluate
from asr.evaluation.transcription import TranscribeConfig, transcribe
from asr.model.recognizer import SpeechRecognizer
from asr.training.adaptation import adaptation_source, check_overrides_follow_model
from asr.training.fit import train
from tiny_runs import ROOT, subprocess_environment, tiny_config

ADAPT = ["conf=adapt", "trainer.max_epochs=8", "trainer.max_steps=-1", "optim.lr=1e-2",
         "adapt.freeze=encoder_lower_half"]
FROZEN = ("encoder.frontend.", "encoder.layers.0.")


@pytest.fixture(scope="module")
def source_run(tiny_synth, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("source")
    train(tiny_config(tiny_synth, "conf=synth_full", "test=false", "model.layers=2"), run)
    return run


@pytest.fixture(scope="module")
def voice(tiny_synth, tmp_path_factory) -> Path:
    """A Kaldi-style folder (wav.scp, text; no utt2spk) of the tiny corpus's ten utterances."""
    folder = tmp_path_factory.mktemp("my_voice")
    wav, text = [], []
    for split in ("train", "dev", "test"):
        with gzip.open(tiny_synth / f"synth_cuts_{split}.jsonl.gz", "rt") as handle:
            for cut in map(json.loads, handle):
                source = Path(cut["recording"]["sources"][0]["source"])
                wav.append(f"{cut['id']} {source if source.is_absolute() else tiny_synth / source}\n")
                text.append(f"{cut['id']} {cut['supervisions'][0]['text'].upper()}\n")
    (folder / "wav.scp").write_text("".join(wav))
    (folder / "text").write_text("".join(text))
    return folder


def adapt_config(tiny_synth, source_run, voice, *overrides):
    return tiny_config(tiny_synth, *ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}", *overrides)


@pytest.fixture(scope="module")
def adapted(tiny_synth, source_run, voice, tmp_path_factory):
    """The adaptation run, and the weights its model had when fit started (step 0)."""
    at_start = {}

    def keep_start(self):
        at_start.update({name: tensor.detach().clone() for name, tensor in self.state_dict().items()})

    run = tmp_path_factory.mktemp("adapted")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SpeechRecognizer, "on_train_start", keep_start, raising=False)
        train(adapt_config(tiny_synth, source_run, voice), run)
    return run, at_start


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


def training_loss(checkpoint: Path, run: Path) -> float:
    """Mean CTC loss (all heads, eval mode, no SpecAugment) over the adaptation run's training split."""
    model = SpeechRecognizer.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    data = SpeechDataModule(DataConfig.of({**yaml.safe_load((run / "config.yaml").read_text())["data"],
                                           "specaugment": False}),
                            frame_subsampling=model.encoder.subsampling, filterbank=model.frontend)
    data.set_tokenizers(model.hparams.tokenizers)
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in data.dataloader("train", train=False):
            loss, _, _, _ = model._losses(batch)
            total, count = total + float(loss) * len(batch["ids"]), count + len(batch["ids"])
    return total / count


def test_adaptation_starts_from_the_trained_model_and_trains_only_what_is_not_frozen(source_run, adapted):
    run, at_start = adapted
    source = torch.load(source_run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    # step 0: every weight and the feature statistics are the trained model's
    assert at_start.keys() == source["state_dict"].keys()
    assert all(torch.equal(at_start[name], tensor) for name, tensor in source["state_dict"].items())
    adapted_checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert adapted_checkpoint["global_step"] > 0
    for key in ("tokenizers", "frontend", "model", "attention"):
        assert adapted_checkpoint["hyper_parameters"][key] == source["hyper_parameters"][key]
    after = adapted_checkpoint["state_dict"]
    frozen = [name for name in after if name.startswith(FROZEN)]
    trained = [name for name in after if name.startswith(("encoder.layers.1.", "heads."))]
    assert frozen and trained
    assert all(torch.equal(after[name], source["state_dict"][name]) for name in frozen)   # bit-identical
    assert all(not torch.equal(after[name], source["state_dict"][name]) for name in trained)
    assert torch.equal(after["feature_mean"], source["state_dict"]["feature_mean"])


def test_the_loss_on_the_adaptation_data_goes_down(source_run, adapted):
    run, _ = adapted
    before = training_loss(source_run / "checkpoints" / "best.ckpt", run)
    assert training_loss(run / "checkpoints" / "last.ckpt", run) < 0.9 * before


def test_the_adapted_run_folder_works_with_evaluate_and_transcribe(source_run, adapted, voice, tmp_path):
    run, _ = adapted
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["init_from"] == str((source_run / "checkpoints" / "best.ckpt").resolve())
    assert config["data"]["corpus"] == "adapt" and config["data"]["root"] == str(voice / "asr_adapt")
    report = json.loads((voice / "asr_adapt" / "adapt_report.json").read_text())
    assert {split: row["utterances"] for split, row in report["splits"].items()} == {"train": 9, "dev": 1}
    for name in ("lexicon.txt", "lm/3gram.arpa.gz"):   # the trained model's, for decoder=lexicon
        assert filecmp.cmp(run / "decoding" / name, source_run / "decoding" / name, shallow=False)
    # the default split is the held-out part: phones (from espeak-ng) and words are both scored
    held_out = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), out=str(tmp_path / "dev"),
                                       progress=False))
    assert held_out["split"] == "dev" and held_out["utterances"] == 1
    assert {"per", "wer", "cer"} <= set(held_out["error_rates"])
    folder = evaluate(EvaluateConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), data_dir=str(voice),
                                     out=str(tmp_path / "folder"), progress=False))
    assert folder["utterances"] == 10
    audio = sorted((voice / "asr_adapt" / "audio").glob("*.flac"))[:2]
    outcome = transcribe(TranscribeConfig(checkpoint=str(run / "checkpoints" / "best.ckpt"), decoder="lexicon",
                                          files=[str(path) for path in audio], progress=False),
                         print_line=lambda line: None)
    assert not outcome.failures and len(outcome.records) == 2 and "lexicon" in outcome.records[0]


def test_ckpt_path_last_resumes_the_adaptation_run_and_nothing_else(tiny_synth, source_run, adapted, voice, tmp_path):
    run, _ = adapted
    steps = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"]
    with pytest.raises(ConfigError, match="resume it with its own command"):
        train(adapt_config(tiny_synth, source_run / "checkpoints" / "last.ckpt", voice, "ckpt_path=last"), run)
    with pytest.raises(ConfigError, match="init_from starts a new run"):
        train(adapt_config(tiny_synth, source_run, voice, f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"),
              tmp_path / "new")
    train(adapt_config(tiny_synth, source_run, voice, "ckpt_path=last", "trainer.max_epochs=9"), run)
    assert torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu",
                      weights_only=True)["global_step"] > steps


def test_errors_name_the_option(tiny_synth, source_run, voice, tmp_path):
    def refused(*overrides, command_line=()):
        with pytest.raises(ConfigError) as error:
            cfg = tiny_config(tiny_synth, *overrides)
            if command_line:   # the check of what the command line gives (asr.train passes Hydra's overrides)
                adaptation_source(cfg, list(command_line))
            else:
                train(cfg, tmp_path / "run")
        return str(error.value)

    assert "give init_from=" in refused("conf=adapt")
    assert "init_from='/no/such/model': no such checkpoint" in refused(*ADAPT, "init_from=/no/such/model",
                                                                        f"adapt.data_dir={voice}")
    assert f"adapt.data_dir='{tmp_path / 'none'}'" in refused(*ADAPT, f"init_from={source_run}",
                                                               f"adapt.data_dir={tmp_path / 'none'}")
    mismatch = refused(*ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}", "data.targets=[chars]",
                       command_line=["data.targets=[chars]"])
    assert "data.targets=['chars'] does not fit" in mismatch and "its heads are ['phones', 'chars']" in mismatch
    assert "model.layers=3 does not fit" in refused(*ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}",
                                                    "model.layers=3", command_line=["model.layers=3"])
    assert "adapt.freeze='all'" in refused(*ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}",
                                           "adapt.freeze=all")
    assert "test=true" in refused(*ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}", "test=true")
    assert "applies to a run that starts from a trained model" in refused("conf=synth_full", "adapt.freeze=encoder")
    # what the run may set itself: dropout; the model's shape is the model's, whatever the preset says
    cfg = tiny_config(tiny_synth, *ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}", "model.dropout=0.3",
                      "model.layers=5")
    assert adaptation_source(cfg, ["model.dropout=0.3"]) is not None
    assert (cfg.model.dropout, cfg.model.layers, list(cfg.data.targets)) == (0.3, 2, ["phones", "chars"])


def test_a_model_key_the_checkpoint_predates_is_checked_against_the_value_its_model_had(tiny_synth, tmp_path):
    """A checkpoint written before model.norm / model.input_norm existed has no such hyper-parameter:
    its model was pre-norm without input norm, and a command line that says so passes, one that does not is refused."""
    from omegaconf import OmegaConf
    from asr.training.adaptation import AdaptationSource
    cfg = tiny_config(tiny_synth, "model.input_norm=true")
    model = {key: value for key, value in OmegaConf.to_container(cfg.model).items() if key not in ("norm", "input_norm")}
    old = AdaptationSource(tmp_path / "old.ckpt", {"hyper_parameters": {"model": model}})
    check_overrides_follow_model(cfg, ["model.norm=pre"], old)
    with pytest.raises(ConfigError, match="model.input_norm=True does not fit .* its model has model.input_norm=False"):
        check_overrides_follow_model(cfg, ["model.input_norm=true"], old)


@pytest.mark.parametrize("input_norm", [False, True])
def test_freezing_the_front_end_freezes_the_input_norm_with_it(input_norm):
    from types import SimpleNamespace
    from attention_ext import validate_attention
    from asr.model.encoder import TransformerEncoder
    from asr.training.adaptation import freeze_parameters
    encoder = TransformerEncoder(12, layers=2, heads=2, head_dim=4, ff_dim=16, dropout=0.0, subsampling=2,
                                 subsampling_channels=4, shared_qk=False, positions="sinusoidal", norm="post",
                                 input_norm=input_norm, attention=validate_attention("full"))
    for freeze, frozen_prefixes in [("frontend", ("frontend.", "input_norm.")),
                                    ("encoder_lower_half", ("frontend.", "input_norm.", "layers.0."))]:
        for parameter in encoder.parameters():
            parameter.requires_grad_(True)
        freeze_parameters(SimpleNamespace(encoder=encoder, parameters=encoder.parameters), freeze)
        frozen = {name for name, parameter in encoder.named_parameters() if not parameter.requires_grad}
        assert frozen == {name for name, _ in encoder.named_parameters() if name.startswith(frozen_prefixes)}
        assert any(name.startswith("input_norm.") for name in frozen) == input_norm


def test_the_command_line_refuses_a_setting_the_model_fixes(source_run, voice, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "asr.train", "conf=adapt", f"init_from={source_run}", f"adapt.data_dir={voice}",
         "attention=lsh", f"run_root={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, env=subprocess_environment(), timeout=120)
    assert result.returncode == 2
    assert "asr.train: error: attention: the attention is the model's ({'name': 'full'})" in result.stderr
    assert not any(tmp_path.iterdir())   # the run folder of a refused run is removed


def test_an_attention_option_added_since_the_checkpoint_compares_at_its_default():
    """A model saved before lsh had max_buckets holds {"rounds", "chunk_size"} only: that is the
    attention max_buckets' default gives, so naming it again is no change; another value is."""
    from types import SimpleNamespace
    from omegaconf import OmegaConf
    source = SimpleNamespace(hyper_parameters={"attention": {"name": "lsh", "rounds": 1, "chunk_size": 32}})
    same = OmegaConf.create({"attention": {"name": "lsh", "rounds": 1, "chunk_size": 32, "max_buckets": 256}})
    check_overrides_follow_model(same, ["attention=lsh"], source)
    other = OmegaConf.create({"attention": {"name": "lsh", "rounds": 1, "chunk_size": 32, "max_buckets": 64}})
    with pytest.raises(ConfigError, match="attention.max_buckets: the attention is the model's"):
        check_overrides_follow_model(other, ["attention.max_buckets=64"], source)


def test_the_held_out_sentences_are_seeded_whole_and_never_all():
    texts = ["a b", "a b", "c d", "e f", "g h", "i j", "k l", "m n", "o p", "q r"]
    held = held_out_texts(texts, 0.1, seed=0)
    assert held == held_out_texts(texts, 0.1, seed=0) and len(held) == 1
    assert sum(text in held for text in texts) >= 1
    assert any(held_out_texts(texts, 0.1, seed) != held for seed in range(1, 6))
    assert len(held_out_texts(["x", "y"], 0.9, seed=0)) == 1     # one sentence stays for training
    with pytest.raises(AdaptationDataError, match="two sentences or more"):
        held_out_texts(["x", "x", "x"], 0.1, seed=0)


def kaldi_folder(folder: Path, texts: dict[str, str]) -> str:
    """A Kaldi-style folder of one-second tones, one per utterance id."""
    folder.mkdir(parents=True)
    for number, utterance in enumerate(texts):
        tone = 0.1 * np.sin(2 * np.pi * (200 + 50 * number) * np.arange(16000) / 16000)
        soundfile.write(folder / f"{utterance}.wav", tone.astype(np.float32), 16000, subtype="PCM_16")
    (folder / "wav.scp").write_text("".join(f"{u} {folder / u}.wav\n" for u in texts))
    (folder / "text").write_text("".join(f"{u} {words}\n" for u, words in texts.items()))
    return str(folder)


def test_second_and_third_folders_validate_and_test_and_a_rerun_redoes_nothing(tmp_path):
    mine = kaldi_folder(tmp_path / "mine", {"u1": "One two", "u2": "three four", "u3": "Five six", "u4": "seven"})
    other = kaldi_folder(tmp_path / "other", {"u1": "eight nine", "u2": "ten"})     # the same ids as mine's
    third = kaldi_folder(tmp_path / "third", {"u1": "eleven"})
    out = tmp_path / "prepared"
    folders = AdaptationFolders(mine, dev=other, test=third)
    report = prepare_adaptation_data(folders, out, phones=False, progress=False)
    assert {split: row["utterances"] for split, row in report["splits"].items()} == {"train": 4, "dev": 2, "test": 1}
    with gzip.open(out / "adapt_cuts_dev.jsonl.gz", "rt") as handle:
        dev = {cut["id"]: cut["supervisions"][0]["text"] for cut in map(json.loads, handle)}
    assert dev == {"dev-u1": "eight nine", "dev-u2": "ten"}
    written = (out / "adapt_cuts_train.jsonl.gz").stat().st_mtime_ns
    assert prepare_adaptation_data(folders, out, phones=False, progress=False) == report
    assert (out / "adapt_cuts_train.jsonl.gz").stat().st_mtime_ns == written
    held = prepare_adaptation_data(AdaptationFolders(mine), out, phones=False, progress=False)   # settings changed
    assert {split: row["utterances"] for split, row in held["splits"].items()} == {"train": 3, "dev": 1}
    (tmp_path / "other" / "wav.scp").unlink()
    with pytest.raises(AdaptationDataError, match="adapt.dev_data_dir=.*wav.scp is missing"):
        prepare_adaptation_data(folders, out, phones=False, progress=False)


def rehearsal_manifest(path: Path, durations: list[float], phones: bool = True) -> list[dict]:
    """A training manifest of cuts with relative audio paths (the files need not exist here)."""
    cuts = [{"id": f"old-{number}", "start": 0.0, "duration": duration, "channel": 0, "type": "MonoCut",
             "supervisions": [{"id": f"old-{number}", "recording_id": f"old-{number}", "start": 0.0,
                               "duration": duration, "channel": 0, "text": "hello there",
                               "custom": {"phones": "HH AH L OW DH EH R"} if phones else {}}],
             "recording": {"id": f"old-{number}", "sources": [{"type": "file", "channels": [0],
                                                               "source": f"audio/old-{number}.flac"}],
                           "sampling_rate": 16000, "num_samples": int(duration * 16000), "duration": duration,
                           "channel_ids": [0]}} for number, duration in enumerate(durations)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        handle.writelines(json.dumps(cut) + "\n" for cut in cuts)
    return cuts


def read_manifest(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle]


def test_rehearsal_adds_the_seeded_lowest_keys_covering_its_share_in_any_manifest_order(tmp_path):
    mine = kaldi_folder(tmp_path / "mine", {"u1": "one two", "u2": "three four", "u3": "five"})   # 3 s of tones
    out = tmp_path / "prepared"
    prepare_adaptation_data(AdaptationFolders(mine, dev=kaldi_folder(tmp_path / "dev", {"d": "six"})), out,
                            phones=False, progress=False)
    durations = [0.5 + 0.25 * (number % 7) for number in range(40)]
    cuts = rehearsal_manifest(tmp_path / "old" / "old_cuts_train.jsonl.gz", durations)
    taken = write_rehearsal_split(out, tmp_path / "old" / "old_cuts_train.jsonl.gz", share=2.0, seed=3)
    written = read_manifest(out / "adapt_cuts_train_rehearsal.jsonl.gz")
    own = read_manifest(out / "adapt_cuts_train.jsonl.gz")
    assert written[:len(own)] == own   # every one of yours, as prepared
    # brute force: the cuts in the order of sha1(seed:id), taken until they cover 2 x 3 s
    by_key = sorted(cuts, key=lambda cut: hashlib.sha1(f"3:{cut['id']}".encode()).hexdigest())
    expected, seconds = [], 0.0
    for cut in by_key:
        if seconds >= 6.0:
            break
        expected.append(cut["id"])
        seconds += cut["duration"]
    sample = written[len(own):]
    assert sorted(cut["id"] for cut in sample) == sorted(f"rehearsal-{cut_id}" for cut_id in expected)
    assert taken["rehearsal_seconds"] == pytest.approx(seconds) and seconds >= 6.0
    assert taken["own_seconds"] == pytest.approx(3.0) and taken["rehearsal_utterances"] == len(expected)
    first = sample[0]
    assert first["recording"]["id"] == first["supervisions"][0]["recording_id"] == first["id"]
    assert first["recording"]["sources"][0]["source"] == str(tmp_path / "old" / f"audio/{first['id'][10:]}.flac")
    # the same sample whatever the manifest's order; another seed another sample
    rehearsal_manifest(tmp_path / "shuffled" / "old_cuts_train.jsonl.gz", durations)
    lines = (tmp_path / "shuffled" / "old_cuts_train.jsonl.gz")
    reordered = read_manifest(lines)[::-1]
    with gzip.open(lines, "wt") as handle:
        handle.writelines(json.dumps(cut) + "\n" for cut in reordered)
    write_rehearsal_split(out, lines, share=2.0, seed=3)
    assert sorted(cut["id"] for cut in read_manifest(out / "adapt_cuts_train_rehearsal.jsonl.gz")[len(own):]) \
        == sorted(cut["id"] for cut in sample)
    write_rehearsal_split(out, lines, share=2.0, seed=4)
    assert sorted(cut["id"] for cut in read_manifest(out / "adapt_cuts_train_rehearsal.jsonl.gz")[len(own):]) \
        != sorted(cut["id"] for cut in sample)
    rehearsal_manifest(tmp_path / "nophones" / "old_cuts_train.jsonl.gz", durations, phones=False)
    with pytest.raises(AdaptationDataError, match="adapt.rehearsal_cuts=.*has no phones"):
        write_rehearsal_split(out, tmp_path / "nophones" / "old_cuts_train.jsonl.gz", share=1.0, phones=True)


def test_rehearsal_trains_on_your_speech_and_the_models_own_training_data(tiny_synth, source_run, voice, tmp_path):
    cfg = adapt_config(tiny_synth, source_run, voice, "adapt.rehearsal=1", "trainer.max_epochs=1",
                       f"adapt.prepared_dir={tmp_path / 'prepared'}")
    train(cfg, tmp_path / "run")
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    # the training data the source run's config.yaml names, recorded in the new run's config
    assert stored["adapt"]["rehearsal_cuts"] == str((tiny_synth / "synth_cuts_train.jsonl.gz").resolve())
    assert stored["data"]["train_split"] == "train_rehearsal"
    written = read_manifest(tmp_path / "prepared" / "adapt_cuts_train_rehearsal.jsonl.gz")
    own = read_manifest(tmp_path / "prepared" / "adapt_cuts_train.jsonl.gz")
    rehearsed = [cut for cut in written if cut["id"].startswith("rehearsal-")]
    # the tiny corpus's train split is shorter than the voice (all ten utterances): all of it is taken
    assert written[:len(own)] == own
    assert sorted(cut["id"] for cut in rehearsed) == sorted(
        f"rehearsal-{cut['id']}" for cut in read_manifest(tiny_synth / "synth_cuts_train.jsonl.gz"))
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_rehearsal_errors_name_the_option(tiny_synth, source_run, voice, tmp_path):
    def refused(*overrides):
        with pytest.raises(ConfigError) as error:
            adaptation_source(tiny_config(tiny_synth, *overrides), [])
        return str(error.value)

    given = (*ADAPT, f"init_from={source_run}", f"adapt.data_dir={voice}")
    assert "adapt.rehearsal=-1.0 is not allowed" in refused(*given, "adapt.rehearsal=-1")
    assert "needs adapt.rehearsal > 0" in refused(*given, f"adapt.rehearsal_cuts={tmp_path}/x.jsonl.gz")
    assert f"adapt.rehearsal_cuts='{tmp_path}/x.jsonl.gz': no such file" in refused(
        *given, "adapt.rehearsal=1", f"adapt.rehearsal_cuts={tmp_path}/x.jsonl.gz")
    assert "adapt.rehearsal=1.0 needs adapt.data_dir" in refused(
        "conf=synth_full", f"init_from={source_run}", "adapt.rehearsal=1")
    lone = tmp_path / "lone.ckpt"   # a checkpoint outside its run folder: no config.yaml names its data
    lone.write_bytes((source_run / "checkpoints" / "best.ckpt").read_bytes())
    message = refused(*ADAPT, f"init_from={lone}", f"adapt.data_dir={voice}", "adapt.rehearsal=1")
    assert "is not there to name its training data; give adapt.rehearsal_cuts=" in message
