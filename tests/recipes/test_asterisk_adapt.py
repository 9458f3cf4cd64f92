"""recipes.asterisk.adapt's pieces: the dev half as a Kaldi-style folder, the asr.train command of a run
of the sweep, the choice on the held-out part and the tables (the sweep itself is the lead's measurement)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asr" / "data"))
from synthetic_corpus import make_utterances, write_corpus  # noqa: E402
from tiny_runs import compose_config  # noqa: E402

from asr.data.corpus.kaldi_dir import read_kaldi_data_dir  # noqa: E402
from recipes.asterisk import adapt  # noqa: E402


def test_the_dev_half_becomes_the_kaldi_folder_a_user_would_give(tmp_path):
    utterances = make_utterances(5, seed=1, prefix="vm-")
    for utterance in utterances:
        utterance["speaker"] = "allison"
    root = write_corpus(tmp_path / "asterisk", {"dev": utterances}, corpus="asterisk", relative_paths=True)
    assert adapt.kaldi_folder(root, "dev", tmp_path / "kaldi") == 5
    folder = read_kaldi_data_dir(tmp_path / "kaldi")
    assert not folder.problems
    assert {u.id: " ".join(u.words) for u in folder.utterances} == {u["id"]: u["text"] for u in utterances}
    assert {u.speaker for u in folder.utterances} == {"allison"}
    for recording_id, source in folder.recordings.items():   # absolute paths to the prepared audio
        assert Path(source.path).is_absolute() and Path(source.path) == (root / "audio" / f"{recording_id}.flac")


def test_a_run_of_the_sweep_is_the_adapt_preset_with_its_lr_freeze_and_step_checkpoints(tmp_path):
    run_dir = tmp_path / "runs" / adapt.run_name(3e-4, "encoder_lower_half")
    command = adapt.adaptation_command("runs/demo", tmp_path / "asterisk_dev", run_dir, 3e-4,
                                       "encoder_lower_half", [100, 400, 200], ["data.max_duration=30"])
    assert command[1:4] == ["-m", "asr.train", "conf=adapt"] and "ckpt_path=last" not in command
    cfg = compose_config(*command[3:])
    assert (cfg.init_from, cfg.adapt.data_dir, cfg.run_dir) == ("runs/demo", str(tmp_path / "asterisk_dev"),
                                                                str(run_dir))
    assert (cfg.optim.lr, cfg.adapt.freeze, cfg.trainer.max_steps) == (3e-4, "encoder_lower_half", 400)
    assert cfg.trainer.keep_checkpoints_every_n_steps == 100 and cfg.data.max_duration == 30
    assert adapt.step_checkpoint(run_dir, 200).name == "step-000200.ckpt"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert adapt.adaptation_command("runs/demo", tmp_path, run_dir, 3e-4, "none", [100], [])[-1] == "ckpt_path=last"


def test_the_choice_is_the_lowest_held_out_per_then_fewer_steps():
    rows = [{"lr": 1e-4, "freeze": "none", "steps": 200, "held_out_per": 0.30},
            {"lr": 3e-4, "freeze": "none", "steps": 400, "held_out_per": 0.25},
            {"lr": 1e-3, "freeze": "none", "steps": 100, "held_out_per": 0.25},
            {"lr": 1e-3, "freeze": "encoder", "steps": 100, "held_out_per": 0.25}]
    assert adapt.choose(rows) is rows[2]
    results = [{"model": "as trained (no adaptation)", "asterisk_test_per": 0.5874, "asterisk_test_wer": 0.9,
                "synth_test_per": 0.0462},
               {"model": "adapted", "asterisk_test_per": 0.2, "asterisk_test_wer": None, "synth_test_per": 0.06}]
    table = adapt.format_tables(rows, results).splitlines()
    assert table[0] == "| lr | freeze | steps | held-out PER |"
    assert table[4] == "| 0.001 | none | 100 | 25.0 (chosen) |" and "chosen" not in table[5]
    assert table[-2] == "| as trained (no adaptation) | 58.7 | 90.0 | 4.6 |"
    assert table[-1] == "| adapted | 20.0 | - | 6.0 |"


@pytest.mark.parametrize("arguments", [["--steps", "0"], ["--lrs", "0"]])
def test_bad_sweeps_are_refused(arguments, tmp_path):
    assert adapt.main(["--init-from", "runs/demo", "--out", str(tmp_path), *arguments]) == 2
