"""asr.train's closing real-speech line (data.real_speech_test): the test split of a corpus prepared
beside the training corpus, scored as asr.evaluate scores it, printed as the third line."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tiny_runs import TINY

from asr.evaluation.evaluation import EvaluateConfig, evaluate

sys.path.insert(0, str(Path(__file__).parent / "data"))
from synthetic_corpus import make_utterances, write_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_train_ends_with_the_real_speech_line_that_asr_evaluate_gives(tiny_synth, tmp_path):
    corpus = tmp_path / "synth"
    corpus.symlink_to(tiny_synth, target_is_directory=True)
    # the "real" set beside the training corpus: {data.root}/../toyreal, a test split only
    utterances = make_utterances(3, 11, "rs")
    for u in utterances:
        u["text"] = "the cat sat"
    write_corpus(tmp_path / "toyreal", {"test": utterances}, corpus="toyreal")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "asr.train", "conf=synth_full", *TINY, f"data.root={corpus}",
                             f"run_dir={tmp_path / 'run'}", "data.real_speech_test=toyreal"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    real = json.loads((tmp_path / "run" / "results.json").read_text())["real_speech"]
    report = evaluate(EvaluateConfig(checkpoint=str(tmp_path / "run" / "checkpoints" / "best.ckpt"),
                                     split="test", data={"corpus": "toyreal", "root": str(tmp_path / "toyreal")},
                                     decoder="lexicon", out=str(tmp_path / "again"), progress=False))
    assert real["per"] == report["error_rates"]["per"]
    assert real["wer_lexicon"] == report["error_rates"]["wer_lexicon"]
    assert real["oov_lm"] == report["out_of_vocabulary"]["lm"]
    lines = result.stdout.rstrip().splitlines()
    assert lines[-3].startswith("test: PER ") and lines[-2].startswith("      lexicon + LM: WER")
    assert lines[-1] == (f"real speech (toyreal test): PER {100 * real['per']:.2f}%  lexicon + LM: WER "
                         f"{100 * real['wer_lexicon']:.2f}%  (words outside the LM {100 * real['oov_lm']:.2f}%)")
