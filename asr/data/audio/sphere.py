"""NIST SPHERE audio files (.sph, WSJ .wv1/.wv2, TIMIT .WAV): header parsing and decoding.

A SPHERE file is a plain-text header ("NIST_1A", the header size, then `name -type value`
lines up to `end_head`) followed by the samples. Uncompressed PCM (TIMIT, the fixtures) and
G.711 mu-law / A-law (Switchboard) are decoded here with numpy. Shorten-compressed files
(`sample_coding pcm,embedded-shorten-v2.00`, most of WSJ; `ulaw,embedded-shorten-...`, some
telephone corpora) need an external decoder; see `decode_shorten_sphere` for the order in which
we try them and the message a user gets when none is installed.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPHERE_MAGIC = b"NIST_1A"


class SphereError(ValueError):
    """A SPHERE file that cannot be read: bad header, unsupported coding, or no decoder."""


@dataclass(frozen=True)
class SphereHeader:
    fields: dict  # name -> int / float / str, as typed in the header
    header_size: int

    @property
    def sample_rate(self) -> int:
        return int(self.fields.get("sample_rate", 0))

    @property
    def channel_count(self) -> int:
        return int(self.fields.get("channel_count", 1))

    @property
    def sample_count(self) -> int:
        """Samples per channel."""
        return int(self.fields.get("sample_count", 0))

    @property
    def sample_n_bytes(self) -> int:
        return int(self.fields.get("sample_n_bytes", 2))

    @property
    def coding(self) -> str:
        """The base coding: 'pcm', 'ulaw' or 'alaw' (SPHERE's default is pcm)."""
        base = str(self.fields.get("sample_coding", "pcm")).split(",")[0].strip().lower()
        return {"mu-law": "ulaw", "mulaw": "ulaw", "a-law": "alaw"}.get(base, base)

    @property
    def compression(self) -> str | None:
        """'shorten', 'wavpack', 'shortpack' or None (uncompressed)."""
        coding = str(self.fields.get("sample_coding", "pcm")).lower()
        byte_format = str(self.fields.get("sample_byte_format", "")).lower()
        for name in ("shorten", "wavpack", "shortpack"):
            if f"embedded-{name}" in coding or name in byte_format:
                return name
        return None

    @property
    def big_endian(self) -> bool:
        return str(self.fields.get("sample_byte_format", "01")) == "10"


def is_sphere(path: str | Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(len(SPHERE_MAGIC)) == SPHERE_MAGIC


def read_sphere_header(path: str | Path) -> SphereHeader:
    path = Path(path)
    with open(path, "rb") as handle:
        head = handle.read(1024)
        if not head.startswith(SPHERE_MAGIC):
            raise SphereError(f"{path}: not a NIST SPHERE file (it does not start with 'NIST_1A')")
        lines = head.split(b"\n")
        try:
            header_size = int(lines[1].strip())
        except (IndexError, ValueError):
            raise SphereError(f"{path}: bad SPHERE header (second line must be the header size)") from None
        if header_size > len(head):
            handle.seek(0)
            head = handle.read(header_size)
    text = head[:header_size].decode("ascii", errors="replace")
    fields: dict = {}
    ended = False
    for line in text.split("\n")[2:]:
        line = line.strip()
        if line == "end_head":
            ended = True
            break
        if not line or line.startswith(";"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        name, kind, value = parts
        try:
            if kind == "-i":
                fields[name] = int(value)
            elif kind == "-r":
                fields[name] = float(value)
            elif kind.startswith("-s"):
                # -sN: a string of N characters (it may contain spaces).
                length = int(kind[2:]) if kind[2:].isdigit() else len(value)
                fields[name] = value[:length]
            else:
                fields[name] = value
        except ValueError:
            raise SphereError(f"{path}: bad SPHERE header field {line!r}") from None
    if not ended:
        raise SphereError(f"{path}: SPHERE header has no 'end_head' within its {header_size} bytes")
    return SphereHeader(fields=fields, header_size=header_size)


def ulaw_to_linear(codes: np.ndarray) -> np.ndarray:
    """G.711 mu-law bytes -> int16 (the standard expansion, as in sox/sph2pipe)."""
    codes = ~codes.astype(np.uint8)
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = ((mantissa.astype(np.int32) << 3) + 0x84) << exponent
    linear = magnitude - 0x84
    return np.where(sign != 0, -linear, linear).astype(np.int16)


def alaw_to_linear(codes: np.ndarray) -> np.ndarray:
    """G.711 A-law bytes -> int16."""
    codes = codes.astype(np.uint8) ^ 0x55
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = (codes & 0x0F).astype(np.int32)
    linear = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << (exponent - 1))
    return np.where(sign != 0, linear, -linear).astype(np.int16)


def read_sphere(path: str | Path) -> tuple[np.ndarray, int]:
    """Decode a SPHERE file to (int16 samples of shape (channels, samples), sample_rate)."""
    path = Path(path)
    header = read_sphere_header(path)
    if header.sample_rate <= 0:
        raise SphereError(f"{path}: SPHERE header has no sample_rate")
    if header.compression is not None:
        return decode_shorten_sphere(path, header), header.sample_rate
    with open(path, "rb") as handle:
        handle.seek(header.header_size)
        payload = handle.read()
    channels = header.channel_count
    if header.coding == "pcm":
        if header.sample_n_bytes != 2:
            raise SphereError(f"{path}: {8 * header.sample_n_bytes}-bit SPHERE PCM is not supported (16-bit only)")
        usable = len(payload) - len(payload) % 2
        samples = np.frombuffer(payload[:usable], dtype=">i2" if header.big_endian else "<i2").astype(np.int16)
    elif header.coding in ("ulaw", "alaw"):
        codes = np.frombuffer(payload, dtype=np.uint8)
        samples = ulaw_to_linear(codes) if header.coding == "ulaw" else alaw_to_linear(codes)
    else:
        raise SphereError(f"{path}: unsupported SPHERE sample_coding {header.fields.get('sample_coding')!r}")
    expected = header.sample_count * channels
    if header.sample_count and samples.size < expected:
        raise SphereError(
            f"{path}: truncated SPHERE file: header says {header.sample_count} samples x {channels} channels, "
            f"the file holds {samples.size // max(channels, 1)}"
        )
    if header.sample_count:
        samples = samples[:expected]
    samples = samples[: samples.size - samples.size % channels]
    return samples.reshape(-1, channels).T.copy(), header.sample_rate


SHORTEN_DECODER_ADVICE = (
    "install ffmpeg (Debian/Ubuntu: apt-get install ffmpeg; `bash .ci/install.sh` does it), which decodes "
    "16-bit PCM shorten (WSJ), or put LDC's sph2pipe on PATH (built by Kaldi's tools/Makefile, or from "
    "https://www.ldc.upenn.edu/language-resources/tools/sphere-conversion-tools), which decodes every "
    "SPHERE coding"
)


def decode_shorten_sphere(path: Path, header: SphereHeader) -> np.ndarray:
    """Decode a compressed SPHERE file with an external program -> int16 (channels, samples).

    sph2pipe (LDC's reference converter) is used when it is on PATH: it reads every SPHERE coding.
    Otherwise ffmpeg, whose `nistsphere` demuxer + `shorten` decoder handle 16-bit PCM shorten (all of
    WSJ) but not mu-law shorten. Neither is a Python package, hence the message naming both.
    """
    if shutil.which("sph2pipe"):
        command = ["sph2pipe", "-f", "wav", "-p", str(path)]
        result = subprocess.run(command, capture_output=True)
        if result.returncode == 0:
            import soundfile  # a WAV container: its byte order is defined, unlike sph2pipe's raw output

            samples, _ = soundfile.read(io.BytesIO(result.stdout), dtype="int16", always_2d=True)
            return samples.T.copy()
        failure = f"sph2pipe failed: {result.stderr.decode(errors='replace').strip()}"
    elif shutil.which("ffmpeg"):
        if header.coding != "pcm":
            raise SphereError(
                f"{path}: {header.coding} shorten-compressed SPHERE cannot be decoded by ffmpeg; put LDC's "
                "sph2pipe on PATH (built by Kaldi's tools/Makefile, or from "
                "https://www.ldc.upenn.edu/language-resources/tools/sphere-conversion-tools)"
            )
        command = ["ffmpeg", "-nostdin", "-v", "error", "-i", str(path), "-f", "s16le", "-acodec", "pcm_s16le", "-"]
        result = subprocess.run(command, capture_output=True)
        if result.returncode == 0:
            samples = np.frombuffer(result.stdout, dtype="<i2").astype(np.int16)
            return _interleaved_to_channels(samples, header.channel_count)
        failure = f"ffmpeg failed: {result.stderr.decode(errors='replace').strip()}"
    else:
        raise SphereError(
            f"{path}: this SPHERE file is {header.compression}-compressed "
            f"(sample_coding {header.fields.get('sample_coding')!r}) and no decoder is installed: "
            + SHORTEN_DECODER_ADVICE
        )
    raise SphereError(f"{path}: cannot decode {header.compression}-compressed SPHERE: {failure}")


def _interleaved_to_channels(samples: np.ndarray, channels: int) -> np.ndarray:
    samples = samples[: samples.size - samples.size % channels]
    return samples.reshape(-1, channels).T.copy()
