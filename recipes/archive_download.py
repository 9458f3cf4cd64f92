"""Fetching a corpus archive from OpenSLR (or a mirror): resumable download, md5 check, unpacking
into a staging folder - the part that lhotse's `download_librispeech`, `download_musan` and
`download_rir_noise` leave out. The recipes using it (recipes/librispeech/download.py,
recipes/noise/prepare.py) build the same URLs as those functions and install what is unpacked where
lhotse puts it, with lhotse's completion markers, so the two can be used on the same folder.

Why not call lhotse's functions (lhotse 1.33, `lhotse.utils.resumable_download`, read and tried
against a local server; recipes/librispeech/README.md):
- it downloads to the archive's final name, so a half-downloaded file looks like an archive;
- it resumes with an HTTP Range request but appends whatever comes back: a server that ignores
  Range (answers 200 with the whole file) leaves the partial bytes plus the whole file behind
  (80 kB partial + 200 kB file -> 280 kB);
- a connection closed early ends the download without an error (a 50 kB file of 200 kB);
- nothing is verified, and it unpacks in place (a kill leaves half a corpus folder).

Here:
- `fetch_archive` downloads to `<archive>.part`, resuming with `Range: bytes=N-` when the server
  answers 206 from exactly N, starting again when it answers 200, and finishing on 416 when the
  part already holds the whole file. A body shorter than announced, a dropped or stalled
  connection (60 s without data) or an HTTP error stops with `DownloadError` and keeps the part
  for the next run. The finished file's md5 is compared with the published one, then it is
  renamed to `<archive>`: a file under the archive's own name has been checked.
- `unpack_archive` unpacks a .tar.gz (tar's "data" filter: no absolute paths, no `..`, no links
  out of the folder) or a .zip into a fresh staging folder, and reads the gzip stream to its end so
  its CRC-32 and length are checked too (zip members are CRC-checked as they are read).
- An archive that is not the published one or does not unpack is deleted (`BadArchiveError`):
  the next run downloads it afresh instead of resuming onto bad bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path

from tqdm.auto import tqdm

CHUNK = 1 << 20
TIMEOUT_S = 60   # a connection silent this long counts as lost
# lhotse sends a browser's User-Agent "to stop picky servers from complaining with 403"; so do we.
USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) clustered-asr"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIABLE_RANGE = re.compile(r"bytes \*/(\d+)")


class DownloadError(RuntimeError):
    """The server or the connection failed (or the disk did); a re-run continues where it stopped."""


class BadArchiveError(RuntimeError):
    """A downloaded archive is not the published one or does not unpack; it was deleted."""


class DownloadRequestError(ValueError):
    """A download asked for wrongly (parts that do not go together, an unreadable --md5-file): a
    usage error, found before anything is downloaded."""


def http_url(value: str) -> str:
    """argparse type of --base-url: an http(s) address."""
    import argparse
    from urllib.parse import urlsplit

    if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s):// address")
    return value


def read_md5_file(path: str | os.PathLike) -> dict[str, str]:
    """{archive name: md5} from an md5sum-format file ('<md5>  <name>' lines, as OpenSLR's
    md5sum.txt), for --md5-file; an unreadable file or a line that is not one is an error naming it."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DownloadRequestError(f"--md5-file {path}: cannot be read ({error})") from None
    sums = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not re.fullmatch(r"[0-9a-fA-F]{32}", fields[0]):
            raise DownloadRequestError(f"--md5-file {path}:{number}: not an md5sum line ('<32 hex digits>  "
                                       f"<file name>'): {line!r}")
        sums[Path(fields[1].lstrip("*")).name] = fields[0].lower()
    return sums


def file_md5(path: Path, progress: bool) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024,
                                          desc=f"md5 {path.name.removesuffix('.part')}", disable=not progress) as bar:
        while block := handle.read(CHUNK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _open(url: str, offset: int):
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)


def _download(url: str, part: Path, progress: bool) -> None:
    """Completes `part` from `url`, resuming from its size."""
    offset = part.stat().st_size if part.exists() else 0
    try:
        response = _open(url, offset)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            whole = _UNSATISFIABLE_RANGE.fullmatch(error.headers.get("Content-Range", ""))
            if whole and int(whole.group(1)) == offset:
                return   # the part already holds the whole file
            part.unlink()   # longer than the file: not a prefix of it
            return _download(url, part, progress)
        kept = f"; the {offset:,} bytes downloaded before are kept in {part}" if offset else ""
        raise DownloadError(f"{url}: HTTP error {error.code} {error.reason}{kept}; run the command again "
                            "later, or use a mirror with --base-url") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(f"{url}: cannot connect ({reason}); check the address and the network, "
                            "then run the command again") from None
    with response:
        if response.status == 206:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != offset:
                raise DownloadError(f"{url}: the server answered the request for bytes {offset:,}- with "
                                    f"{response.headers.get('Content-Range')!r}; run the command again")
            total = None if match.group(3) == "*" else int(match.group(3))
        else:   # 200: the whole file (a server that ignores Range, or a first request)
            offset = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length is not None else None
        received = offset
        try:
            with open(part, "r+b" if offset else "wb") as handle, \
                    tqdm(total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                         desc=part.name.removesuffix(".part"), disable=not progress) as bar:
                handle.seek(offset)
                handle.truncate()
                while block := response.read(CHUNK):
                    handle.write(block)
                    received += len(block)
                    bar.update(len(block))
        except (OSError, http.client.HTTPException) as error:
            raise DownloadError(f"{url}: the transfer stopped after {received:,} of "
                                f"{'?' if total is None else f'{total:,}'} bytes ({error}); they are kept in "
                                f"{part}: run the command again to resume") from None
    if total is not None and received != total:
        raise DownloadError(f"{url}: the connection closed after {received:,} of {total:,} bytes; they are "
                            f"kept in {part}: run the command again to resume")


def fetch_archive(url: str, archive: Path, md5: str | None, progress: bool = True) -> None:
    """Downloads `url` to `archive` (through `<archive>.part`, resumable) and checks its md5
    (None: no published md5 known; the unpacking checks the archive's own CRCs)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    part = archive.with_name(archive.name + ".part")
    _download(url, part, progress)
    if md5 is not None:
        found = file_md5(part, progress)
        if found != md5:
            part.unlink()
            raise BadArchiveError(f"{url}: the downloaded file's md5 is {found}, the published one {md5}; "
                                  "it was deleted: run the command again to download it afresh (a mirror "
                                  "serving another release of the file: pass its md5 list with --md5-file)")
    os.replace(part, archive)


def check_archive(archive: Path, md5: str | None, progress: bool = True) -> None:
    """An archive found already downloaded (kept by --keep-archives, or by a kill while unpacking)
    is checked as a fresh one would be: a wrong one is deleted."""
    if md5 is not None and (found := file_md5(archive, progress)) != md5:
        archive.unlink()
        raise BadArchiveError(f"{archive}: md5 {found}, the published one is {md5}; it was deleted: run the "
                              "command again to download it afresh")


def obtain_archive(archive: Path, url: str, md5: str | None, label: str, progress: bool = True) -> None:
    """The archive at `archive`: one already there is checked (check_archive: a wrong one is deleted
    and refused), else it is downloaded from `url` (fetch_archive), saying so under `label`."""
    if archive.is_file():
        check_archive(archive, md5, progress)
    else:
        print(f"{label}: downloading {url}")
        fetch_archive(url, archive, md5, progress)


class _ReadProgress:
    """A binary file that advances a progress bar by the bytes read from it."""

    def __init__(self, handle, bar):
        self.handle, self.bar = handle, bar

    def read(self, size=-1):
        data = self.handle.read(size)
        self.bar.update(len(data))
        return data


def unpack_archive(archive: Path, staging: Path, progress: bool = True) -> None:
    """Unpacks `archive` (.tar.gz or .zip) into `staging` (emptied first). A damaged archive is
    deleted with the staging folder (BadArchiveError); any other failure (a full disk) keeps it."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with open(archive, "rb") as raw, tqdm(total=archive.stat().st_size, unit="B", unit_scale=True,
                                              unit_divisor=1024, desc=f"unpack {archive.name}",
                                              disable=not progress) as bar:
            if archive.name.endswith(".zip"):
                with zipfile.ZipFile(raw) as bundle:
                    bar.reset(total=sum(member.compress_size for member in bundle.infolist()))
                    for member in bundle.infolist():
                        bundle.extract(member, staging)   # names with '..' or a drive are made safe
                        bar.update(member.compress_size)
            else:
                stream = gzip.GzipFile(fileobj=_ReadProgress(raw, bar))
                with tarfile.open(fileobj=stream, mode="r|") as bundle:
                    for member in bundle:
                        bundle.extract(member, staging, filter="data")
                while stream.read(CHUNK):   # to the gzip trailer: its CRC-32 and length are checked there
                    pass
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, gzip.BadGzipFile) as error:
        shutil.rmtree(staging, ignore_errors=True)
        archive.unlink()
        raise BadArchiveError(f"{archive}: damaged archive ({error}); it was deleted: run the command again to "
                              "download it afresh") from None
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise DownloadError(f"cannot unpack {archive} into {staging.parent}: {error}; the archive is kept: "
                            "run the command again once that is fixed") from None
