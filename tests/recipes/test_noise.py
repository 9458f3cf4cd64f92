"""`python -m recipes.noise.prepare --download musan rirs`: tiny MUSAN and RIRS_NOISES archives in
the real layouts, built here and served by a local stand-in for OpenSLR (archive_server.py),
downloaded, prepared into lhotse manifests, and the printed options pointing at them."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile
from lhotse import RecordingSet, SupervisionSet
from lhotse.recipes.musan import MUSAN_URL
from lhotse.recipes.rir_noise import RIR_NOISE_ZIP_URL

from archive_server import ArchiveServer
from corpus_fixtures import read_gz_jsonl, tone
from recipes.noise.prepare import CORPORA, OPENSLR, archive_url, main

# file -> samples at 16 kHz
MUSAN_FILES = {
    "musan/noise/free-sound/noise-free-sound-0000.wav": 8000,
    "musan/noise/sound-bible/noise-sound-bible-0000.wav": 12000,
    "musan/music/fma/music-fma-0000.wav": 16000,
    "musan/speech/librivox/speech-librivox-0000.wav": 20000,
}
MUSAN_TEXT = {"musan/README": "MUSAN (test copy)\n",
              "musan/music/fma/ANNOTATIONS": "music-fma-0000 classical,baroque N Johann_Bach\n",
              "musan/speech/librivox/ANNOTATIONS": "speech-librivox-0000 male english\n"}
RIRS_FILES = {
    "RIRS_NOISES/pointsource_noises/noise-free-sound-0001.wav": 4000,
    "RIRS_NOISES/real_rirs_isotropic_noises/RWCP_type1_rir_circle_ane_imp110.wav": 3200,
    "RIRS_NOISES/real_rirs_isotropic_noises/RVB2014_type1_noise_largeroom1_1.wav": 16000,
    "RIRS_NOISES/simulated_rirs/smallroom/Room001/Room001-00001.wav": 1600,
    "RIRS_NOISES/simulated_rirs/mediumroom/Room001/Room001-00001.wav": 2400,
    "RIRS_NOISES/simulated_rirs/largeroom/Room001/Room001-00001.wav": 4800,
}
RIRS_TEXT = {"RIRS_NOISES/README": "RIRs and noises (test copy)\n",
             "RIRS_NOISES/real_rirs_isotropic_noises/rir_list":
                 "--rir-id RWCP_type1_rir_circle_ane_imp110 --room-id RWCP_type1_room1 "
                 "RIRS_NOISES/real_rirs_isotropic_noises/RWCP_type1_rir_circle_ane_imp110.wav\n"}


def wav(count: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, tone(count, 300, seed=seed), 16000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def build_musan() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        members = {**{name: wav(count, seed) for seed, (name, count) in enumerate(MUSAN_FILES.items())},
                   **{name: text.encode() for name, text in MUSAN_TEXT.items()}}
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            bundle.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_rirs() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as bundle:   # stored, as a .wav zip mostly is
        for seed, (name, count) in enumerate(RIRS_FILES.items()):
            bundle.writestr(name, wav(count, seed))
        for name, text in RIRS_TEXT.items():
            bundle.writestr(name, text)
    return buffer.getvalue()


ARCHIVES = {"musan.tar.gz": build_musan(), "rirs_noises.zip": build_rirs()}
PATHS = {"musan.tar.gz": "/17/musan.tar.gz", "rirs_noises.zip": "/28/rirs_noises.zip"}


@pytest.fixture
def server():
    with ArchiveServer() as running:
        for name, data in ARCHIVES.items():
            running.files[PATHS[name]] = data
        yield running


def md5_list(folder: Path, archives: dict[str, bytes]) -> str:
    path = folder / "md5sum.txt"
    path.write_text("".join(f"{hashlib.md5(data).hexdigest()}  {name}\n" for name, data in archives.items()))
    return str(path)


def recordings(path: Path) -> dict[str, tuple[float, str]]:
    """{recording id: (duration, audio file)} of a RecordingSet manifest."""
    return {r.id: (r.duration, r.sources[0].source) for r in RecordingSet.from_file(path)}


def test_urls_are_lhotses():
    assert archive_url(OPENSLR, CORPORA["musan"]) == MUSAN_URL
    assert archive_url(OPENSLR, CORPORA["rirs"]) == RIR_NOISE_ZIP_URL


def test_downloads_and_prepares_musan_and_rirs(server, tmp_path, capsys):
    out = tmp_path / "noise"
    arguments = ["--download", "musan", "rirs", "--out", str(out), "--base-url", server.url,
                 "--md5-file", md5_list(tmp_path, ARCHIVES), "--no-progress"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    download = (out / "download").resolve()

    def expected(files: dict[str, int], stems: list[str], ids=None) -> dict[str, tuple[float, str]]:
        chosen = {name: count for name, count in files.items() if Path(name).stem in stems}
        return {(ids or {}).get(name, Path(name).stem): (count / 16000, str(download / name))
                for name, count in chosen.items()}

    assert recordings(out / "musan_recordings_noise.jsonl.gz") == expected(
        MUSAN_FILES, ["noise-free-sound-0000", "noise-sound-bible-0000"])
    assert recordings(out / "musan_recordings_music.jsonl.gz") == expected(MUSAN_FILES, ["music-fma-0000"])
    assert recordings(out / "musan_recordings_speech.jsonl.gz") == expected(MUSAN_FILES, ["speech-librivox-0000"])
    music, = SupervisionSet.from_file(out / "musan_supervisions_music.jsonl.gz")
    assert (music.recording_id, music.speaker, music.custom) == (
        "music-fma-0000", "Johann_Bach", {"genres": ["classical", "baroque"], "vocals": False})
    assert recordings(out / "real-rir_recordings_all.jsonl.gz") == expected(
        RIRS_FILES, ["RWCP_type1_rir_circle_ane_imp110"])
    assert recordings(out / "iso-noise_recordings_all.jsonl.gz") == expected(
        RIRS_FILES, ["RVB2014_type1_noise_largeroom1_1"])
    assert recordings(out / "point-noise_recordings_all.jsonl.gz") == expected(RIRS_FILES, ["noise-free-sound-0001"])
    simulated = {name: f"{name.split('/')[2].removesuffix('room')}-Room001-00001" for name in RIRS_FILES
                 if "simulated_rirs" in name}   # lhotse names them <small|medium|large>-<file>
    assert recordings(out / "sim-rir_recordings_all.jsonl.gz") == expected(RIRS_FILES, ["Room001-00001"], simulated)
    # every sample as it went into the archive
    for name, count in {**MUSAN_FILES, **RIRS_FILES}.items():
        seed = list(MUSAN_FILES if name in MUSAN_FILES else RIRS_FILES).index(name)
        np.testing.assert_array_equal(soundfile.read(download / name, dtype="int16")[0], tone(count, 300, seed=seed))

    # the options to train with name these manifests
    assert f"  data.augment.noise_source={out}/musan_recordings_noise.jsonl.gz\n" in printed
    assert f"  data.augment.rir_source={out}/real-rir_recordings_all.jsonl.gz" in printed
    assert "musan_recordings_noise.jsonl.gz" in printed and "sim-rir_recordings_all.jsonl.gz" in printed
    # lhotse's markers, archives deleted, no temporary folders left
    assert sorted(p.name for p in (out / "download").iterdir()) == [".musan_completed", "RIRS_NOISES", "musan"]
    assert (out / "download/RIRS_NOISES/.completed").is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []

    # a second run downloads nothing and keeps the manifests
    before = len(server.requests)
    assert main(arguments) == 0
    assert len(server.requests) == before and "musan: already downloaded" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["truncated", "bad crc"])
def test_damaged_zip_gives_one_line_and_leaves_nothing(server, tmp_path, capsys, damage):
    data = ARCHIVES["rirs_noises.zip"]
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:   # a byte inside the first member's (stored) samples
        at = data.index(b"data") + 100
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    server.files[PATHS["rirs_noises.zip"]] = data
    out = tmp_path / "noise"
    assert main(["--download", "rirs", "--out", str(out), "--base-url", server.url, "--no-progress",
                 "--md5-file", md5_list(tmp_path, {"rirs_noises.zip": data})]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recipes.noise.prepare: error: ")
    assert "rirs_noises.zip: damaged archive" in lines[0] and "it was deleted" in lines[0]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["download"]


def test_server_error_gives_one_line(server, tmp_path, capsys):
    server.fail(PATHS["musan.tar.gz"], 503)
    out = tmp_path / "noise"
    assert main(["--download", "musan", "--out", str(out), "--base-url", server.url, "--no-progress"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{server.url}/17/musan.tar.gz: HTTP error 503" in lines[0]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["download"]
