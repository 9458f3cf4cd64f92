"""Downloading LibriSpeech (OpenSLR 12) or mini LibriSpeech (OpenSLR 31) for `prepare.py --download`.

Part names: lhotse's (`lhotse.recipes.librispeech`: LIBRISPEECH, the seven OpenSLR 12 archives, and
MINI_LIBRISPEECH = dev-clean-2 + train-clean-5, its default `mini_librispeech`, OpenSLR 31) and the
short names of `DOWNLOAD_NAMES`. URLs as lhotse's `download_librispeech` builds them:
`{base_url}/12/{part}.tar.gz` and `{base_url}/31/{part}.tar.gz`. Where the files go is lhotse's
layout too: `{download_dir}/{part}.tar.gz`, unpacked to `{download_dir}/LibriSpeech/{part}/` with
lhotse's `.completed` marker in it, so a part either downloader finished is not fetched again.
The fetching itself (resume, md5, unpacking) is recipes/archive_download.py; its docstring says
why lhotse's own download function is not called.

md5 sums: OpenSLR 12's as its md5sum.txt publishes them
(https://www.openslr.org/resources/12/md5sum.txt; the same values are pinned by several projects
that check downloads against that list). For OpenSLR 31 this machine could not read the published
list; its two values are those pinned by PaddleSpeech's dataset/mini_librispeech/mini_librispeech.py
(and independently by another project's checksum-pinned downloader). `--md5-file` replaces any of
them (a mirror with another release, a new release).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lhotse.recipes.librispeech import LIBRISPEECH, MINI_LIBRISPEECH

from recipes.archive_download import BadArchiveError, DownloadRequestError, obtain_archive, unpack_archive

OPENSLR = "https://www.openslr.org/resources"   # lhotse's default base_url, over https
RESOURCES = {**{part: 12 for part in LIBRISPEECH}, **{part: 31 for part in MINI_LIBRISPEECH}}

# --download names -> lhotse part names; lhotse's own part names are accepted too.
DOWNLOAD_NAMES = {
    "mini": MINI_LIBRISPEECH,                  # lhotse's default part "mini_librispeech"
    "clean-100": ("train-clean-100",),
    "clean-360": ("train-clean-360",),
    "other-500": ("train-other-500",),
    "dev": ("dev-clean",),
    "test": ("test-clean",),
    "dev-other": ("dev-other",),
    "test-other": ("test-other",),
    "all": LIBRISPEECH,                        # lhotse's "librispeech": 960 h + the four evaluation sets
    **{part: (part,) for part in (*LIBRISPEECH, *MINI_LIBRISPEECH)},
}
FULL_TRAIN_PARTS = ("train-clean-100", "train-clean-360", "train-other-500")
# Preparing full LibriSpeech needs its dev and test split: these come with any training part.
FULL_EVALUATION_PARTS = ("dev-clean", "test-clean")

PUBLISHED_MD5 = {
    "dev-clean": "42e2234ba48799c1f50f24a7926300a1",
    "dev-other": "c8d0bcc9cca99d4f8b62fcc847357931",
    "test-clean": "32fa31d27d2e1cad72775fee3f4849a9",
    "test-other": "fb5a50374b501bb3bac4815ee91d3135",
    "train-clean-100": "2a93770f6d5c6c964bc36631d331a522",
    "train-clean-360": "c0e676e450a7ff2f54aeade5171606fa",
    "train-other-500": "d1a0fd59409feb2c614ce4d30c387708",
    "dev-clean-2": "6d7ab67ac6a1d2c993d050e16d61080d",
    "train-clean-5": "5df7d4e78065366204ca6845bb08f490",
}


def resolve_parts(names: list[str]) -> tuple[str, ...]:
    """lhotse part names for the --download names, in lhotse's order, with dev-clean and test-clean
    added to full LibriSpeech training parts; mini and full LibriSpeech parts are not mixed."""
    wanted = {part for name in names for part in DOWNLOAD_NAMES[name]}
    if wanted & set(MINI_LIBRISPEECH) and wanted & set(LIBRISPEECH):
        raise DownloadRequestError(
            f"--download {' '.join(names)}: mini LibriSpeech ({', '.join(MINI_LIBRISPEECH)}) and full LibriSpeech "
            f"parts ({', '.join(sorted(wanted & set(LIBRISPEECH)))}) make different corpora; download them "
            "into different --out folders")
    if wanted & set(MINI_LIBRISPEECH):
        wanted |= set(MINI_LIBRISPEECH)
    if wanted & set(FULL_TRAIN_PARTS):
        wanted |= set(FULL_EVALUATION_PARTS)
    return tuple(part for part in (*MINI_LIBRISPEECH, *LIBRISPEECH) if part in wanted)


def completed_parts(download_dir: Path) -> list[str]:
    """The parts unpacked completely in download_dir (lhotse's marker file is there)."""
    return [part for part in RESOURCES if (download_dir / "LibriSpeech" / part / ".completed").is_file()]


def check_not_mixed(parts: tuple[str, ...], download_dir: Path) -> None:
    """A download folder holds mini LibriSpeech or full LibriSpeech, not both."""
    there = completed_parts(download_dir)
    for kind, other in ((MINI_LIBRISPEECH, LIBRISPEECH), (LIBRISPEECH, MINI_LIBRISPEECH)):
        if set(parts) & set(kind) and set(there) & set(other):
            raise DownloadRequestError(
                f"{download_dir} already holds {', '.join(p for p in there if p in other)}; "
                f"{', '.join(p for p in parts if p in kind)} would mix mini and full LibriSpeech: "
                "choose another --out (or --download-dir)")


def archive_url(base_url: str, part: str) -> str:
    return f"{base_url.rstrip('/')}/{RESOURCES[part]}/{part}.tar.gz"


def download_librispeech_parts(parts: tuple[str, ...], download_dir: str | Path, *, base_url: str = OPENSLR,
                               md5: dict[str, str] | None = None, keep_archives: bool = False,
                               progress: bool = True) -> Path:
    """Downloads, checks and unpacks each part not yet complete in download_dir; returns the
    LibriSpeech folder. md5: {archive name: md5} replacing the published values."""
    download_dir = Path(download_dir)
    check_not_mixed(parts, download_dir)
    sums = {f"{part}.tar.gz": value for part, value in PUBLISHED_MD5.items()} | (md5 or {})
    corpus = download_dir / "LibriSpeech"
    for part in parts:
        if (corpus / part / ".completed").is_file():
            print(f"{part}: already downloaded ({corpus / part})")
            continue
        archive = download_dir / f"{part}.tar.gz"
        expected = sums.get(archive.name)
        obtain_archive(archive, archive_url(base_url, part), expected, part, progress)
        install_part(archive, part, corpus, progress)
        if not keep_archives:
            archive.unlink()
        print(f"{part}: unpacked into {corpus / part}")
    return corpus


def install_part(archive: Path, part: str, corpus: Path, progress: bool) -> None:
    """Unpacks the archive beside `corpus` and moves LibriSpeech/<part> (marked complete) and the
    corpus's top-level files (SPEAKERS.TXT, CHAPTERS.TXT, ...) into it: each move is a rename, so the
    part folder appears whole or not at all."""
    staging = corpus.parent / f".{part}.unpacking"
    unpack_archive(archive, staging, progress)
    unpacked = staging / "LibriSpeech" / part
    if not unpacked.is_dir():
        shutil.rmtree(staging)
        archive.unlink()
        raise BadArchiveError(f"{archive}: holds no LibriSpeech/{part}/ folder, so it is not LibriSpeech's "
                              f"{part}; it was deleted")
    (unpacked / ".completed").touch()
    corpus.mkdir(parents=True, exist_ok=True)
    for item in (staging / "LibriSpeech").iterdir():
        if item.is_file():
            os.replace(item, corpus / item.name)
    if (corpus / part).exists():   # a folder some earlier unpacking left unfinished (no marker)
        shutil.rmtree(corpus / part)
    os.rename(unpacked, corpus / part)
    shutil.rmtree(staging)
