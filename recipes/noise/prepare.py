"""Noise and room impulse responses for training-time augmentation: MUSAN (OpenSLR 17) and the
RIRs and noises of Ko et al. 2017 (OpenSLR 28), downloaded and turned into lhotse RecordingSet
manifests that `data.augment.noise_source=` / `data.augment.rir_source=` take.

    python -m recipes.noise.prepare --download musan rirs --out data/noise

Download: recipes/archive_download.py (resumable, md5-checked, unpacked whole or not at all; its
docstring says why lhotse's `download_musan` / `download_rir_noise` are not called) with lhotse's
URLs (`MUSAN_URL`, `RIR_NOISE_ZIP_URL`: `{base_url}/17/musan.tar.gz`, `{base_url}/28/rirs_noises.zip`)
into lhotse's layout: `{download_dir}/musan/` with lhotse's `.musan_completed` beside it, and
`{download_dir}/RIRS_NOISES/` (with a `.completed` marker: lhotse has none for it).

Manifests: lhotse's `prepare_musan` and `prepare_rir_noise`, written under a temporary folder and
renamed into `--out`, so each file there is whole:

    musan_recordings_{noise,music,speech}.jsonl.gz, musan_supervisions_music.jsonl.gz
    {point-noise,iso-noise,real-rir,sim-rir}_recordings_all.jsonl.gz

Audio paths in them are absolute (the unpacked folders stay where they are). The end of the run
prints what each manifest holds and the options to train with: MUSAN's noise part as the noise
source (its music and speech parts are there for other mixes), the real RIRs as room responses.
md5 sums: OpenSLR's published ones (17: md5sum.txt, 28: checksum.md5), as pinned by many projects
that check against them; `--md5-file` replaces them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from asr.core.exit_status import run_command
from recipes.archive_download import (BadArchiveError, DownloadError, DownloadRequestError, http_url,
                                      obtain_archive, read_md5_file, unpack_archive)

OPENSLR = "https://www.openslr.org/resources"


@dataclass(frozen=True)
class NoiseCorpus:
    resource: int        # OpenSLR resource number
    archive: str
    folder: str          # what the archive unpacks to
    marker: str          # relative to the download folder: there when the folder is complete
    md5: str
    manifests: tuple[str, ...]
    noise_manifest: str | None = None   # printed as data.augment.noise_source
    rir_manifest: str | None = None     # printed as data.augment.rir_source


CORPORA = {
    "musan": NoiseCorpus(17, "musan.tar.gz", "musan", ".musan_completed", "0c472d4fc0c5141eca47ad1ffeb2a7df",
                         ("musan_recordings_noise.jsonl.gz", "musan_recordings_music.jsonl.gz",
                          "musan_recordings_speech.jsonl.gz", "musan_supervisions_music.jsonl.gz"),
                         noise_manifest="musan_recordings_noise.jsonl.gz"),
    "rirs": NoiseCorpus(28, "rirs_noises.zip", "RIRS_NOISES", "RIRS_NOISES/.completed",
                        "e6f48e257286e05de56413b4779d8ffb",
                        ("real-rir_recordings_all.jsonl.gz", "sim-rir_recordings_all.jsonl.gz",
                         "point-noise_recordings_all.jsonl.gz", "iso-noise_recordings_all.jsonl.gz"),
                        rir_manifest="real-rir_recordings_all.jsonl.gz"),
}


class NoisePreparationError(RuntimeError):
    """lhotse could not read an unpacked folder (not the corpus's layout, unreadable audio)."""


def archive_url(base_url: str, corpus: NoiseCorpus) -> str:
    return f"{base_url.rstrip('/')}/{corpus.resource}/{corpus.archive}"


def download_noise_corpus(name: str, download_dir: Path, *, base_url: str = OPENSLR, md5: dict | None = None,
                          keep_archives: bool = False, progress: bool = True) -> Path:
    """Downloads, checks and unpacks one corpus unless complete there; returns its folder."""
    corpus = CORPORA[name]
    folder = download_dir / corpus.folder
    if (download_dir / corpus.marker).is_file():
        print(f"{name}: already downloaded ({folder})")
        return folder
    archive = download_dir / corpus.archive
    expected = (md5 or {}).get(corpus.archive, corpus.md5)
    obtain_archive(archive, archive_url(base_url, corpus), expected, name, progress)
    staging = download_dir / f".{name}.unpacking"
    unpack_archive(archive, staging, progress)
    if not (staging / corpus.folder).is_dir():
        shutil.rmtree(staging)
        archive.unlink()
        raise BadArchiveError(f"{archive}: holds no {corpus.folder}/ folder, so it is not {name}; it was deleted")
    if folder.exists():   # left by an unpacking that did not finish
        shutil.rmtree(folder)
    os.rename(staging / corpus.folder, folder)
    (download_dir / corpus.marker).touch()
    shutil.rmtree(staging)
    if not keep_archives:
        archive.unlink()
    print(f"{name}: unpacked into {folder}")
    return folder


def prepare_noise_manifests(name: str, folder: Path, out: Path) -> None:
    """lhotse's manifests of the unpacked folder, into out (kept when all are there already)."""
    from lhotse.recipes import prepare_musan, prepare_rir_noise

    corpus = CORPORA[name]
    if all((out / manifest).is_file() for manifest in corpus.manifests):
        return
    staging = out / f".{name}.manifests"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if name == "musan":
            prepare_musan(folder.resolve(), output_dir=staging)
        else:
            prepare_rir_noise(folder.resolve(), output_dir=staging)
    except (AssertionError, RuntimeError, ValueError, OSError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise NoisePreparationError(f"lhotse could not prepare {folder}: {error or type(error).__name__}; is it "
                                    f"the {name} corpus as its archive unpacks?") from None
    missing = [manifest for manifest in corpus.manifests if not (staging / manifest).is_file()]
    if missing:
        shutil.rmtree(staging, ignore_errors=True)
        raise NoisePreparationError(f"lhotse wrote no {', '.join(missing)} from {folder}: a part of the corpus "
                                    "is missing")
    for manifest in corpus.manifests:
        os.replace(staging / manifest, out / manifest)
    shutil.rmtree(staging)


def summary(names: list[str], out: Path) -> str:
    """Each recording manifest with its count and hours, then the options that feed them to training."""
    from lhotse import RecordingSet

    lines = [f"{'manifest':<40}{'recordings':>12}{'hours':>10}"]
    options = []
    for name in names:
        corpus = CORPORA[name]
        for manifest in corpus.manifests:
            if "_recordings_" in manifest:
                recordings = RecordingSet.from_file(out / manifest)
                hours = sum(recording.duration for recording in recordings) / 3600
                lines.append(f"{manifest:<40}{len(recordings):>12}{hours:>10.2f}")
        if corpus.noise_manifest:
            options.append(f"  data.augment.noise_source={out / corpus.noise_manifest}")
        if corpus.rir_manifest:
            options.append(f"  data.augment.rir_source={out / corpus.rir_manifest}")
    return "\n".join([*lines, "train with them (another noise or room-response manifest above can take their place):",
                      *options])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--download", nargs="+", required=True, choices=list(CORPORA),
                        help="musan (OpenSLR 17, 11 GB: noise, music, speech) and/or rirs (OpenSLR 28, 1.3 GB: "
                             "real and simulated room impulse responses, point-source and isotropic noises)")
    parser.add_argument("--out", default="data/noise", help="where the manifests go (default data/noise)")
    parser.add_argument("--base-url", default=OPENSLR, type=http_url,
                        help=f"OpenSLR's resources folder or a mirror's (default {OPENSLR})")
    parser.add_argument("--download-dir", default=None,
                        help="where the archives are downloaded and unpacked (default {out}/download)")
    parser.add_argument("--md5-file", default=None,
                        help="md5sum-format list ('<md5>  musan.tar.gz') replacing the built-in published md5s")
    parser.add_argument("--keep-archives", action="store_true", help="keep the archives after unpacking")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    out = Path(args.out)
    download_dir = Path(args.download_dir) if args.download_dir else out / "download"
    names = list(dict.fromkeys(args.download))

    def body():
        md5 = read_md5_file(args.md5_file) if args.md5_file else None
        for name in names:
            folder = download_noise_corpus(name, download_dir, base_url=args.base_url, md5=md5,
                                           keep_archives=args.keep_archives, progress=not args.no_progress)
            out.mkdir(parents=True, exist_ok=True)
            prepare_noise_manifests(name, folder, out)
        print(summary(names, out))

    return run_command("recipes.noise.prepare", body, usage_errors=(DownloadRequestError,),
                       failures=(DownloadError, BadArchiveError, NoisePreparationError),
                       resume_hint="run the same command again: it continues the download where it stopped")


if __name__ == "__main__":
    sys.exit(main())
