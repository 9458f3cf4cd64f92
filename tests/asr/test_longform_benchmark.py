"""python -m asr.benchmarks.longform: rows measured in child processes, scored as an independent
edit distance scores them, resumed, skipped where they would not fit."""
from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from asr.benchmarks import longform
from asr.benchmarks.longform import LongformBenchmarkConfig, Row, extrapolated, main, skip_reason
from asr.benchmarks.longform_measurement import mode_settings
from asr.core.exit_status import SUCCESS, USAGE_ERROR
from asr.evaluation.transcription import TranscribeConfig, transcribe
from recipes.longform.prepare import build_long_recordings


@pytest.fixture(scope="module")
def long_set(tiny_synth, tmp_path_factory) -> Path:
    """A 0.4-minute recording (24 s: two pieces in pieces mode) joined from the tiny corpus's test split
    (2 utterances, so it goes round)."""
    out = tmp_path_factory.mktemp("longform")
    build_long_recordings("synth", ("test",), [0.4], tiny_synth, out, progress=False)
    return out / "synth_test"


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    row = list(range(len(hypothesis) + 1))
    for i, token in enumerate(reference, start=1):
        previous, row[0] = row[0], i
        for j, other in enumerate(hypothesis, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (token != other))
    return row[-1]


def joined_manifest_phones(corpus: Path, order: list[str]) -> str:
    """The phone references of the utterances `order` names, read from the supervisions manifest."""
    with gzip.open(corpus / "synth_supervisions_test.jsonl.gz", "rt") as handle:
        phones = {row["id"]: row["custom"]["phones"] for row in map(json.loads, handle)}
    return " ".join(phones[identifier] for identifier in order)


def test_rows_match_an_independent_transcription_and_a_rerun_measures_nothing(tiny_epochs_run, tiny_synth, long_set,
                                                                             tmp_path, monkeypatch, capsys):
    checkpoint = tiny_epochs_run / "checkpoints" / "best.ckpt"
    arguments = [f"checkpoint={checkpoint}", f"recordings={long_set}", "minutes=[0.4]", "attentions=[full,lsh]",
                 "modes=[pieces,onepass]", f"out={tmp_path}", "threads=1", "progress=false"]
    assert main(arguments) == SUCCESS
    with open(tmp_path / "longform.csv", newline="") as handle:
        rows = {(r["attention"], r["mode"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {("full", "pieces"), ("full", "onepass"), ("lsh", "pieces"), ("lsh", "onepass")}
    assert rows["lsh", "onepass"]["status"].startswith("skipped: needs a model with shared query/key")
    assert (tmp_path / "longform.png").stat().st_size > 0
    audio = long_set / "0.4min" / "recording.wav"
    references = json.loads((long_set / "0.4min" / "references.json").read_text())
    reference = joined_manifest_phones(tiny_synth, [u["source_id"] for u in references["utterances"]]).split()
    for mode in ("pieces", "onepass"):
        row = rows["full", mode]
        assert row["status"] == "ok" and float(row["minutes"]) == 0.4 and "cores" in row["machine"]
        assert float(row["recording_seconds"]) == pytest.approx(references["duration"])
        assert float(row["rtf"]) == pytest.approx(float(row["wall_s"]) / references["duration"])
        assert float(row["peak_rss_mb"]) > 50 and 0 <= float(row["wer"]) and float(row["lexicon_wall_s"]) > 0
        record = transcribe(TranscribeConfig(checkpoint=str(checkpoint), attention="full", files=[str(audio)],
                                             progress=False, **mode_settings(mode, references["duration"])),
                            print_line=lambda line: None).records[0]
        hypothesis = record["phones"]["hypothesis"].split()
        assert hypothesis and hypothesis != reference       # a score the rows could not get by chance
        assert float(row["per"]) == pytest.approx(edit_distance(reference, hypothesis) / len(reference))
    assert "| 0.4 | full | onepass |" in capsys.readouterr().out

    def measured_again(*_):
        raise AssertionError("a row already in the CSV was measured again")
    monkeypatch.setattr(longform, "run_measurement", measured_again)
    assert main(arguments) == SUCCESS
    with open(tmp_path / "longform.csv", newline="") as handle:
        again = list(csv.DictReader(handle))
    assert len(again) == 4 and {(r["attention"], r["mode"]): r["per"] for r in again}[("full", "onepass")] == \
        rows["full", "onepass"]["per"]


def test_a_measurement_over_its_timeout_is_stopped_and_longer_rows_are_skipped(tiny_epochs_run, tiny_synth, tmp_path):
    build_long_recordings("synth", ("test",), [0.1, 0.2], tiny_synth, tmp_path / "sets", progress=False)
    assert main([f"checkpoint={tiny_epochs_run / 'checkpoints' / 'best.ckpt'}",
                 f"recordings={tmp_path / 'sets' / 'synth_test'}", "minutes=[0.1,0.2]", "attentions=[linear]",
                 "modes=[onepass]", "timeout=0.05", f"out={tmp_path}", "progress=false", "wer=false"]) == SUCCESS
    with open(tmp_path / "longform.csv", newline="") as handle:
        statuses = [r["status"] for r in csv.DictReader(handle)]
    assert statuses == ["timeout after 0.05 s", "skipped: the 0.1-min row timed out"]


def test_estimates_skip_what_would_not_fit():
    assert extrapolated([(1, 10.0), (2, 40.0)], 4, 1.0, (1.0, 2.0)) == pytest.approx(160.0)   # x^2 through two
    assert extrapolated([(1, 10.0), (2, 80.0)], 4, 1.0, (1.0, 2.0)) == pytest.approx(320.0)   # x^3 capped to x^2
    assert extrapolated([(10, 3.0)], 60, 1.0, (0.0, 2.0)) == pytest.approx(18.0)              # one point: linear
    config = LongformBenchmarkConfig(max_seconds=1000, max_memory_gb=4)
    measured = [{"minutes": "10", "attention": "full", "mode": "onepass", "status": "ok", "wall_s": "30",
                 "peak_rss_mb": "1024"},
                {"minutes": "10", "attention": "linear", "mode": "onepass", "status": "ok", "wall_s": "30",
                 "peak_rss_mb": "1024"}]
    # full in one pass: quadratic from one row, 30 s x 36 = 1080 s
    assert skip_reason(Row(60, "full", "onepass"), measured, config, 4) == \
        "skipped: estimated 1080 s > max_seconds=1000"
    # linear: 180 s, but 6 GB of memory
    assert skip_reason(Row(60, "linear", "onepass"), measured, config, 4) == \
        "skipped: estimated 6.0 GB > max_memory_gb=4.0"
    assert skip_reason(Row(30, "linear", "onepass"), measured, config, 4) == ""
    assert skip_reason(Row(60, "full", "pieces"), measured, config, 4) == ""      # nothing measured: run it


def test_usage_errors_exit_2_saying_what_to_do(tiny_epochs_run, tmp_path, capsys):
    checkpoint = tiny_epochs_run / "checkpoints" / "best.ckpt"
    assert main([f"checkpoint={tmp_path / 'missing.ckpt'}"]) == USAGE_ERROR
    assert main([f"checkpoint={checkpoint}", f"recordings={tmp_path / 'synth_dev'}", "minutes=[1,10]"]) == USAGE_ERROR
    assert main([f"checkpoint={checkpoint}", "modes=[twopass]"]) == USAGE_ERROR
    assert main([f"checkpoint={checkpoint}", "minutes=[1]", "attentions=[nonsense]",
                 f"recordings={tmp_path}"]) == USAGE_ERROR
    assert main(["--help"]) == SUCCESS
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0] == f"asr.benchmarks.longform: error: checkpoint={tmp_path / 'missing.ckpt'}: no such file"
    assert err[1].startswith(f"asr.benchmarks.longform: error: long test recording {tmp_path / 'synth_dev' / '1min'} "
                             "not found") and err[1].endswith(
        "build it with `python -m recipes.longform.prepare --corpus synth --split dev --minutes 1 10 "
        f"--out {tmp_path}`")
    assert err[2] == "asr.benchmarks.longform: error: modes=['twopass']: choose among pieces, onepass"
    assert "Long recordings transcribed per length x attention x mode" in captured.out
