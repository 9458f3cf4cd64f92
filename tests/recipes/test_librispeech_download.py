"""`python -m recipes.librispeech.prepare --download mini`, end to end without the network: tiny
tarballs in mini LibriSpeech's real layout, built here, served by a local stand-in for OpenSLR
(archive_server.py), downloaded, interrupted, resumed, prepared, and trained on for two steps; a
server error, a wrong or damaged archive and a wrong request each give one line and leave nothing
half-written.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import soundfile

from archive_server import ArchiveServer
from corpus_fixtures import flac_samples, read_gz_jsonl, tone
from recipes.librispeech.download import PUBLISHED_MD5, archive_url
from recipes.librispeech.prepare import main

ROOT = Path(__file__).resolve().parents[2]

# part -> {utterance id: (transcript, samples)}: a few seconds of 16 kHz audio each
MINI = {
    "train-clean-5": {
        "1088-134315-0000": ("AS YOU KNOW AND AS I HAVE GIVEN YOU PROOF", 24000),
        "1088-134315-0001": ("I HAVE THE GREATEST ADMIRATION FOR YOU", 32000),
        "1737-142396-0000": ("THE BOY HAD A SINGULAR TASTE FOR READING", 20000),
        "1737-142396-0001": ("HE WENT DOWN TO THE RIVER AT DAWN", 28000),
    },
    "dev-clean-2": {
        "1272-135031-0000": ("BECAUSE YOU WERE SLEEPING INSTEAD OF CONQUERING", 16000),
        "1462-170138-0000": ("HE HAD WRITTEN A NUMBER OF BOOKS HIMSELF", 17600),
        "1673-143396-0000": ("A LAUDABLE REGARD FOR THE HONOR OF THE FIRST PROSELYTE", 19200),
        "174-50561-0000": ("FORGOTTEN TOO THE NAME OF GILLIAN THE LOVELY CAPTIVE", 20800),
        "2412-153948-0000": ("THE MOST FAMOUS OF THEM ALL WAS THE OVERTHROW OF THE ISLAND", 22400),
        "3752-4944-0000": ("HOW DO YOU DO SAID THE LITTLE GIRL", 24000),
    },
}
SEXES = {"1088": "F", "1737": "F", "1272": "M", "1462": "F", "1673": "F", "174": "M", "2412": "F", "3752": "M"}
# dev-clean-2's readers cut in two: every second one in order of (sex, reader id):
# F 1462, 1673, 2412, then M 174, 1272, 3752 -> dev takes the 1st, 3rd, 5th.
DEV_READERS, TEST_READERS = {"1462", "2412", "1272"}, {"1673", "174", "3752"}


def speakers_txt() -> str:
    header = ";ID  |SEX| SUBSET           |MINUTES| NAME\n"
    return header + "".join(f"{speaker:<5}| {sex} | dev-clean        | 25.00 | Reader {speaker}\n"
                            for speaker, sex in SEXES.items())


def tar_member(bundle: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 1_400_000_000
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        bundle.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        bundle.addfile(info, io.BytesIO(data))


def build_part_archive(part: str) -> bytes:
    """<part>.tar.gz as OpenSLR's: LibriSpeech/ with the corpus's text files and
    <part>/<reader>/<chapter>/ folders of FLAC files and a .trans.txt each."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        tar_member(bundle, "LibriSpeech", None)
        for name, text in (("SPEAKERS.TXT", speakers_txt()),
                           ("CHAPTERS.TXT", ";ID    |READER|MINUTES| SUBSET           | PROJ.|BOOK ID| CH. TITLE\n"),
                           ("BOOKS.TXT", ";ID  |TITLE\n"), ("README.TXT", "LibriSpeech (test copy)\n"),
                           ("LICENSE.TXT", "CC BY 4.0\n")):
            tar_member(bundle, f"LibriSpeech/{name}", text.encode())
        tar_member(bundle, f"LibriSpeech/{part}", None)
        chapters: dict[str, list[str]] = {}
        for number, (utterance, (text, count)) in enumerate(MINI[part].items()):
            reader, chapter, _ = utterance.split("-")
            folder = f"LibriSpeech/{part}/{reader}/{chapter}"
            if folder not in chapters:
                tar_member(bundle, f"LibriSpeech/{part}/{reader}", None)
                tar_member(bundle, folder, None)
                chapters[folder] = []
            flac = io.BytesIO()
            soundfile.write(flac, samples(utterance), 16000, format="FLAC", subtype="PCM_16")
            tar_member(bundle, f"{folder}/{utterance}.flac", flac.getvalue())
            chapters[folder].append(f"{utterance} {text}\n")
        for folder, lines in chapters.items():
            reader, chapter = folder.split("/")[-2:]
            tar_member(bundle, f"{folder}/{reader}-{chapter}.trans.txt", "".join(lines).encode())
    return buffer.getvalue()


def samples(utterance: str):
    part = next(p for p, utterances in MINI.items() if utterance in utterances)
    return tone(MINI[part][utterance][1], 150 + 20 * len(utterance) % 300, seed=int(utterance.split("-")[1]))


ARCHIVES = {part: build_part_archive(part) for part in MINI}
PATHS = {part: f"/31/{part}.tar.gz" for part in MINI}   # lhotse's URL layout: {base_url}/31/<part>.tar.gz


@pytest.fixture
def server():
    with ArchiveServer() as running:
        for part, data in ARCHIVES.items():
            running.files[PATHS[part]] = data
        yield running


def md5_file(folder: Path, archives: dict[str, bytes]) -> Path:
    path = folder / "md5sum.txt"
    path.write_text("".join(f"{hashlib.md5(data).hexdigest()}  {part}.tar.gz\n" for part, data in archives.items()))
    return path


def download_args(server, out: Path, md5: Path | None, *extra: str) -> list[str]:
    return ["--download", "mini", "--out", str(out), "--base-url", server.url, "--no-progress", "--jobs", "1",
            *(["--md5-file", str(md5)] if md5 else []), *extra]


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("recipes.librispeech.prepare: error: ")
    return lines[0]


def test_lhotse_url_layout():
    """The URLs are lhotse's download_librispeech's ({base_url}/12 or /31/<part>.tar.gz)."""
    assert archive_url("https://www.openslr.org/resources", "dev-clean-2") == \
        "https://www.openslr.org/resources/31/dev-clean-2.tar.gz"
    assert archive_url("http://mirror/resources/", "train-other-500") == \
        "http://mirror/resources/12/train-other-500.tar.gz"


def test_download_interrupted_resumed_prepared_and_trained(server, tmp_path, capsys):
    out = tmp_path / "mini"
    md5 = md5_file(tmp_path, ARCHIVES)
    size = len(ARCHIVES["train-clean-5"])
    half = size // 2
    server.cut_after(PATHS["train-clean-5"], half)   # the connection drops halfway through the second part

    assert main(download_args(server, out, md5)) == 1
    error = one_error_line(capsys)
    assert f"the connection closed after {half:,} of {size:,} bytes" in error and "run the command again" in error
    download = out / "download"
    assert (download / "LibriSpeech/dev-clean-2/.completed").is_file()   # the first part is whole
    assert (download / "train-clean-5.tar.gz.part").stat().st_size == half   # the second waits to be resumed
    assert not (download / "LibriSpeech/train-clean-5").exists() and not (download / "train-clean-5.tar.gz").exists()
    assert not list(out.glob("librispeech_*"))   # no manifests

    assert main(download_args(server, out, md5)) == 0
    printed = capsys.readouterr().out
    # the second run asked for the rest of the second part only, and nothing of the first
    assert server.bytes_sent(PATHS["dev-clean-2"]) == [len(ARCHIVES["dev-clean-2"])]
    assert server.bytes_sent(PATHS["train-clean-5"]) == [half, size - half]
    assert server.requests[-1][1:3] == (f"bytes={half}-", 206)
    # archives deleted once unpacked; no staging folders; the corpus as the tarballs hold it
    assert [p for p in files_under(download) if "/" not in p and p != "LibriSpeech"] == []
    assert (download / "LibriSpeech/SPEAKERS.TXT").read_text() == speakers_txt()

    expected = {"train": sorted(MINI["train-clean-5"]),
                "dev": sorted(u for u in MINI["dev-clean-2"] if u.split("-")[0] in DEV_READERS),
                "test": sorted(u for u in MINI["dev-clean-2"] if u.split("-")[0] in TEST_READERS)}
    texts = {u: t for part in MINI.values() for u, (t, _) in part.items()}
    counts = {u: n for part in MINI.values() for u, (_, n) in part.items()}
    for split, ids in expected.items():
        cuts = read_gz_jsonl(out / f"librispeech_cuts_{split}.jsonl.gz")
        assert sorted(c["id"] for c in cuts) == ids
        for cut in cuts:
            assert cut["supervisions"][0]["text"] == texts[cut["id"]].lower()
            assert cut["supervisions"][0]["speaker"] == cut["id"].split("-")[0]
            assert cut["duration"] == pytest.approx(counts[cut["id"]] / 16000, abs=1e-9)
            source = Path(cut["recording"]["sources"][0]["source"])
            assert source.parent.parent.parent.parent == download.resolve() / "LibriSpeech"
            assert (flac_samples(str(source), out) == samples(cut["id"])).all()
    report = json.loads((out / "librispeech_report.json").read_text())
    assert {split: row["utterances"] for split, row in report["splits"].items()} == {"train": 4, "dev": 3, "test": 3}
    assert report["splits"]["train"]["hours"] == pytest.approx(104000 / 16000 / 3600, abs=1e-4)
    assert f"train with: python -m asr.train conf=librispeech_mini_iclustered data.root={out}" in printed

    # a third run finds every part complete: no request at all
    requests = len(server.requests)
    assert main(download_args(server, out, md5)) == 0
    assert len(server.requests) == requests and "dev-clean-2: already downloaded" in capsys.readouterr().out

    # two training steps of the mini preset on what was downloaded, through the documented command
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run(
        [sys.executable, "-m", "asr.train", "conf=librispeech_mini_iclustered", f"data.root={out}",
         "trainer.max_steps=2", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1",
         "data.progress=false", "data.feature_jobs=1", "data.sentencepiece_vocab=40", f"run_dir={run}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 2 and results["attention"] == "iclustered"
    # the test split is dev-clean-2's other half: 3 utterances, ceil(fbank frames / 2) encoder positions each
    frames = [1 + (counts[u] - 400) // 160 for u in expected["test"]]
    assert results["test"]["encoder_length"] == pytest.approx(sum((f + 1) // 2 for f in frames) / len(frames))
    assert 0 <= results["test"]["wer"]


def test_killed_download_resumes_and_a_server_without_range_restarts(server, tmp_path, capsys):
    """kill -9 in the middle of an archive leaves only its .part; the next run resumes it. A server
    that ignores Range (answers 200 with the whole file) makes the run start the file again rather
    than append it to the part (what lhotse's resumable_download does)."""
    out = tmp_path / "mini"
    md5 = md5_file(tmp_path, ARCHIVES)
    part = out / "download" / "dev-clean-2.tar.gz.part"
    stalled_at = len(ARCHIVES["dev-clean-2"]) // 3
    server.stall_after(PATHS["dev-clean-2"], stalled_at)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = subprocess.Popen([sys.executable, "-m", "recipes.librispeech.prepare",
                                *download_args(server, out, md5)], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (part.is_file() and part.stat().st_size == stalled_at):
        assert process.poll() is None and time.monotonic() < deadline, "the download never reached the stall"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    server.release()
    assert files_under(out) == ["download", "download/dev-clean-2.tar.gz.part"]

    server.ignore_range = True
    assert main(download_args(server, out, md5, "--keep-archives")) == 0
    capsys.readouterr()
    assert server.requests[-2][1:] == (f"bytes={stalled_at}-", 200, len(ARCHIVES["dev-clean-2"]))
    for name, data in ARCHIVES.items():   # kept, and byte for byte the served ones
        assert (out / "download" / f"{name}.tar.gz").read_bytes() == data
    assert len(read_gz_jsonl(out / "librispeech_cuts_train.jsonl.gz")) == 4

    # a kept archive is unpacked again (after its md5 is checked) without a request
    shutil.rmtree(out / "download/LibriSpeech/train-clean-5")
    requests = len(server.requests)
    assert main(download_args(server, out, md5, "--keep-archives")) == 0
    assert len(server.requests) == requests
    assert (out / "download/LibriSpeech/train-clean-5/.completed").is_file()


def test_part_holding_the_whole_file_is_finished_without_a_transfer(server, tmp_path, capsys):
    """Killed after the last byte but before the rename: the server answers the resumed request
    416 with the file's length, and the part is checked and used as it is."""
    out = tmp_path / "mini"
    (out / "download").mkdir(parents=True)
    (out / "download/dev-clean-2.tar.gz.part").write_bytes(ARCHIVES["dev-clean-2"])
    assert main(download_args(server, out, md5_file(tmp_path, ARCHIVES))) == 0
    assert server.requests[0] == (PATHS["dev-clean-2"], f"bytes={len(ARCHIVES['dev-clean-2'])}-", 416, 0)
    assert (out / "download/LibriSpeech/dev-clean-2/.completed").is_file()


def test_server_error_is_one_line_and_leaves_nothing(server, tmp_path, capsys):
    out = tmp_path / "mini"
    server.fail(PATHS["dev-clean-2"], 500)
    assert main(download_args(server, out, md5_file(tmp_path, ARCHIVES))) == 1
    error = one_error_line(capsys)
    assert f"{server.url}/31/dev-clean-2.tar.gz: HTTP error 500" in error
    assert files_under(out) == ["download"]


def test_archive_with_the_wrong_md5_is_deleted(server, tmp_path, capsys):
    """Without --md5-file the published md5s apply: the test's tarball is not OpenSLR's."""
    out = tmp_path / "mini"
    assert main(download_args(server, out, None)) == 1
    error = one_error_line(capsys)
    assert f"md5 is {hashlib.md5(ARCHIVES['dev-clean-2']).hexdigest()}, the published one " \
           f"{PUBLISHED_MD5['dev-clean-2']}; it was deleted" in error
    assert files_under(out) == ["download"]


@pytest.mark.parametrize("damage", ["truncated", "bad gzip crc"])
def test_damaged_archive_is_deleted(server, tmp_path, capsys, damage):
    """An archive whose md5 is the listed one but which does not unpack (a mirror's broken file
    with its own md5 list): nothing of it stays, neither the file nor half a corpus folder."""
    data = ARCHIVES["dev-clean-2"]
    if damage == "truncated":
        data = data[:len(data) * 2 // 3]
    else:   # the body intact, the CRC-32 in the gzip trailer wrong
        data = data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:]
        with pytest.raises(gzip.BadGzipFile):
            gzip.decompress(data)
    server.files[PATHS["dev-clean-2"]] = data
    out = tmp_path / "mini"
    assert main(download_args(server, out, md5_file(tmp_path, {"dev-clean-2": data}))) == 1
    error = one_error_line(capsys)
    assert "dev-clean-2.tar.gz: damaged archive" in error and "it was deleted" in error
    assert files_under(out) == ["download"]


@pytest.mark.parametrize("arguments, message", [
    (["--download", "mini", "clean-100"], "mini LibriSpeech (dev-clean-2, train-clean-5) and full LibriSpeech parts"),
    (["--download", "dev", "test"], "no training part; add mini"),
    (["--download", "mini", "--md5-file", "{tmp}/nothing.txt"], "--md5-file {tmp}/nothing.txt: cannot be read"),
])
def test_wrong_requests_are_usage_errors_before_any_download(server, tmp_path, capsys, arguments, message):
    arguments = [a.format(tmp=tmp_path) for a in arguments]
    assert main([*arguments, "--out", str(tmp_path / "out"), "--base-url", server.url, "--no-progress"]) == 2
    assert message.format(tmp=tmp_path) in one_error_line(capsys)
    assert server.requests == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("arguments", [["--download", "mini", "--base-url", "ftp://mirror/resources"],
                                       ["--corpus-dir", "x", "--keep-archives"],
                                       ["--corpus-dir", "x", "--download", "mini"],
                                       ["--download", "train-clean-6"]])
def test_bad_options_exit_2(arguments, capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(arguments)
    assert exit_status.value.code == 2
    assert "error:" in capsys.readouterr().err
