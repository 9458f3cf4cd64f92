"""Processes that share a corpus folder never damage each other: two trainings on one corpus whose
feature cache is not yet built both finish with the results each gives alone; two generators of one
synthetic corpus end with one complete corpus; a shard another process reads is never deleted; and
an evaluation never generates or changes a corpus (a misspelt split is a usage error, the folder
byte-identical afterwards)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from asr.core.exit_status import USAGE_ERROR
from asr.core.corpus_lock import LOCK_FILE, writing_corpus_folder
from asr.evaluate import main as evaluate_main
from recipes.synth.prepare import main as synth_main
from tiny_runs import ROOT, TINY, subprocess_environment, synth_corpus_contents

TIMEOUT = 600


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `folder`: its size and mtime (what 'byte-identical afterwards' compares)."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*"))}


def corpus_without_features(tiny_synth: Path, to: Path) -> Path:
    shutil.copytree(tiny_synth, to, ignore=shutil.ignore_patterns("features"))
    return to


def start_training(corpus: Path, run: Path, cwd: Path) -> subprocess.Popen:
    arguments = ["conf=synth_full", *TINY, f"data.root={corpus}", f"run_dir={run}", "trainer.max_epochs=2",
                 "trainer.torch_threads=1", "seed=3"]
    return subprocess.Popen([sys.executable, "-m", "asr.train", *arguments], cwd=cwd, env=subprocess_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, output[-4000:]
    return output


def outcome(run: Path) -> dict:
    """What a run gives: its validation losses per epoch and its test error rates."""
    import csv
    results = json.loads((run / "results.json").read_text())
    with open(next((run / "logs").rglob("metrics.csv"))) as handle:
        losses = [row["val/loss"] for row in csv.DictReader(handle) if row.get("val/loss")]
    return {"val_losses": losses, "test": results["test"]}


def test_two_trainings_on_one_corpus_without_a_feature_cache_both_finish_as_each_would_alone(tiny_synth, tmp_path):
    shared = corpus_without_features(tiny_synth, tmp_path / "shared")
    first, second = (start_training(shared, tmp_path / name, tmp_path) for name in ("run_a", "run_b"))
    outputs = [finished(first), finished(second)]
    alone = corpus_without_features(tiny_synth, tmp_path / "alone")
    finished(start_training(alone, tmp_path / "run_alone", tmp_path))
    expected = outcome(tmp_path / "run_alone")
    assert expected["val_losses"] and expected["test"]
    assert outcome(tmp_path / "run_a") == expected
    assert outcome(tmp_path / "run_b") == expected
    # each split's features were computed once, by one of the two, into one set of shards
    for split in ("train", "dev", "test"):
        shards = sorted(p.stem for p in shared.glob(f"features/*/{split}/shard-*.json"))
        assert shards == sorted(p.stem for p in shared.glob(f"features/*/{split}/shard-*.lilcom")
                                ) and len(shards) == 1, (split, shards, outputs)
    assert not list(shared.rglob("*.tmp"))
    assert (shared / "features" / LOCK_FILE).read_text() == ""   # no holder left


def test_a_shard_another_process_reads_is_never_deleted(tiny_synth, tmp_path):
    """A writer that recomputes cuts (their audio changed) leaves the shards a reader's index names;
    once no one reads the split, the next writer tidies them away."""
    from asr.data.corpus.manifests import load_cuts
    from asr.data.features.feature_cache import FeatureStore, precompute_features
    from asr.data.features.features import FilterBank

    corpus = corpus_without_features(tiny_synth, tmp_path / "corpus")
    cuts = list(load_cuts(corpus, "synth", "dev", need_phones=False))
    folder, filterbank = tmp_path / "cache" / "dev", FilterBank(40)
    reader, _ = precompute_features(cuts, filterbank, folder, progress=False)
    old_shards = sorted(folder.glob("shard-*.lilcom"))
    expected = {cut.id: reader.load(cut.id) for cut in cuts}
    reader.close()
    reader = FeatureStore(folder, 40)    # a reader that has indexed the shards, opened none yet
    for cut in cuts:                     # the audio regenerated (same samples, a new mtime)
        path = Path(cut.recording.sources[0].source)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    writer, _ = precompute_features(cuts, filterbank, folder, progress=False)
    assert all(shard.is_file() for shard in old_shards)   # the reader's index names them
    for cut in cuts:
        assert (reader.load(cut.id) == expected[cut.id]).all()
        assert (writer.load(cut.id) == expected[cut.id]).all()
    reader.close()
    writer.close()
    for cut in cuts:
        path = Path(cut.recording.sources[0].source)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    precompute_features(cuts, filterbank, folder, progress=False)[0].close()
    assert not any(shard.exists() for shard in old_shards)   # no reader now: the superseded ones are gone
    assert len(list(folder.glob("shard-*.lilcom"))) == 1


def test_two_generators_into_one_folder_end_with_one_complete_corpus(tiny_synth, tmp_path):
    out = tmp_path / "synth"
    arguments = ["--out", str(out), "--train", "6", "--dev", "2", "--test", "2", "--seed", "0", "--jobs", "1",
                 "--no-progress"]
    env = dict(subprocess_environment(), OMP_NUM_THREADS="1")
    generators = [subprocess.Popen([sys.executable, "-m", "recipes.synth.prepare", *arguments], cwd=tmp_path,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for _ in range(2)]
    outputs = [generator.communicate(timeout=TIMEOUT)[0] for generator in generators]
    assert [generator.returncode for generator in generators] == [0, 0], outputs
    got, expected = synth_corpus_contents(out), synth_corpus_contents(tiny_synth)
    assert sorted(got) == sorted(expected)     # no partial file left, none missing
    for name in expected:
        assert got[name] == expected[name], name


def test_generating_over_a_complete_corpus_of_other_sizes_is_refused_and_changes_nothing(tiny_synth, tmp_path,
                                                                                       capsys):
    corpus = corpus_without_features(tiny_synth, tmp_path / "synth")
    before = listing(corpus)
    status = synth_main(["--out", str(corpus), "--train", "3000", "--dev", "200", "--test", "200", "--jobs", "1",
                         "--no-progress"])
    assert status == USAGE_ERROR
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"{corpus.resolve()} holds a complete synthetic corpus of 6/2/2 train/dev/test " \
                               "utterances; this asks for 3000/200/200" in error[0], error
    assert listing(corpus) == {**before, LOCK_FILE: listing(corpus)[LOCK_FILE]} and \
        (corpus / LOCK_FILE).read_text() == ""


def test_evaluate_with_a_misspelt_split_exits_2_naming_it_and_leaves_the_corpus_alone(tiny_epochs_run, tiny_synth,
                                                                                      capsys):
    before = listing(tiny_synth)
    status = evaluate_main([f"checkpoint={tiny_epochs_run / 'checkpoints' / 'best.ckpt'}", "split=nosuch",
                            "threads=1"])
    assert status == USAGE_ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"asr.evaluate: error: split='nosuch': corpus synth in {tiny_synth} has no such split; its "
                     "splits are dev, test, train"]
    assert listing(tiny_synth) == before


def test_evaluate_generates_no_corpus_and_prepares_an_evaluation_set_only_into_a_new_folder(tiny_epochs_run,
                                                                                           tmp_path, capsys):
    checkpoint = f"checkpoint={tiny_epochs_run / 'checkpoints' / 'best.ckpt'}"
    empty = tmp_path / "no synth here"
    assert evaluate_main([checkpoint, f"data.root={empty}", "threads=1"]) == USAGE_ERROR
    assert "python -m recipes.synth.prepare" in capsys.readouterr().err
    assert not empty.exists()
    mine = tmp_path / "my folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    before = listing(mine)
    assert evaluate_main([checkpoint, "data.corpus=asterisk", f"data.root={mine}", "threads=1"]) == USAGE_ERROR
    assert capsys.readouterr().err.strip() == (
        f"asr.evaluate: error: data.corpus=asterisk: {mine} holds no asterisk manifests but other files; "
        "asr.evaluate prepares asterisk only into a new or empty folder: give data.root=<another folder>, or "
        f"prepare them with `python -m recipes.asterisk.prepare --out {mine}` (see recipes/asterisk/README.md)")
    assert listing(mine) == before
    assert evaluate_main([checkpoint, "data.corpus=asterisk", f"data.root={tmp_path / 'new'}", "split=train",
                          "threads=1"]) == USAGE_ERROR
    assert "split='train': corpus asterisk has no such split; its splits are dev, test" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_second_writer_waits_for_the_first_and_is_told_who(tmp_path, caplog):
    code = ("import sys, time\nfrom asr.core.corpus_lock import writing_corpus_folder\n"
            f"with writing_corpus_folder({str(tmp_path)!r}, 'testing'):\n"
            "    print('holding', flush=True)\n    time.sleep(2)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "holding"
        asked = time.monotonic()
        with caplog.at_level("WARNING"), writing_corpus_folder(tmp_path, "the test"):
            assert time.monotonic() - asked > 1   # it waited for the holder to let go
            assert f"asr process {os.getpid()} " in (tmp_path / LOCK_FILE).read_text()
            with writing_corpus_folder(tmp_path, "again"):   # the holder may take it again
                pass
    finally:
        holder.kill()
        holder.wait()
    assert f"being written by another process (asr process {holder.pid} on " in caplog.text
    assert ", testing, since " in caplog.text

