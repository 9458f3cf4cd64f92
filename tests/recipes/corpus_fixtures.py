"""Writers for the corpus fixture trees: synthetic audio in the real corpora's file formats.

These are written independently of recipes/ (the SPHERE header by hand, mu-law with the G.711
formula, shorten with its bitstream spelled out), so reading them back tests the recipes' readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def tone(num_samples: int, frequency: float = 440.0, rate: int = 16000, amplitude: int = 3000,
         seed: int = 0) -> np.ndarray:
    """int16 sine plus a little noise: any waveform works, the tests compare samples exactly."""
    t = np.arange(num_samples) / rate
    noise = np.random.default_rng(seed).normal(0, 50, num_samples)
    return np.round(amplitude * np.sin(2 * np.pi * frequency * t) + noise).astype(np.int16)


def sphere_header(fields: list[tuple[str, str, object]], size: int = 1024) -> bytes:
    lines = ["NIST_1A", f"   {size}"] + [f"{name} -{kind} {value}" for name, kind, value in fields] + ["end_head"]
    text = ("\n".join(lines) + "\n").encode("ascii")
    assert len(text) <= size
    return text + b" " * (size - len(text))


def write_sphere_pcm(path: Path, samples: np.ndarray, rate: int = 16000, big_endian: bool = False,
                     extra_fields: list[tuple[str, str, object]] = ()) -> None:
    """samples: int16 (n,) or (channels, n)."""
    samples = np.atleast_2d(samples)
    channels, count = samples.shape
    byte_format = "10" if big_endian else "01"
    header = sphere_header([
        *extra_fields,
        ("sample_count", "i", count), ("channel_count", "i", channels), ("sample_n_bytes", "i", 2),
        ("sample_rate", "i", rate), ("sample_byte_format", "s2", byte_format),
        ("sample_coding", "s3", "pcm"), ("sample_sig_bits", "i", 16),
    ])
    payload = samples.T.astype(">i2" if big_endian else "<i2").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + payload)


def linear_to_ulaw(samples: np.ndarray) -> np.ndarray:
    """G.711 mu-law encoding (the classic Sun g711.c algorithm)."""
    bias, clip = 0x84, 32635
    x = samples.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), clip) + bias
    exponent = np.zeros_like(magnitude)
    for e in range(7, 0, -1):
        exponent = np.where((exponent == 0) & (magnitude >= (1 << (e + 7))), e, exponent)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def ulaw_to_linear_reference(codes: np.ndarray) -> np.ndarray:
    """G.711 mu-law decoding, written out for the tests."""
    out = []
    for code in codes.tolist():
        code = ~code & 0xFF
        t = ((code & 0x0F) << 3) + 0x84
        t <<= (code & 0x70) >> 4
        out.append(0x84 - t if code & 0x80 else t - 0x84)
    return np.array(out, dtype=np.int16)


def write_sphere_ulaw(path: Path, samples: np.ndarray, rate: int = 8000) -> np.ndarray:
    """Two-channel (or mono) 8 kHz mu-law SPHERE like Switchboard's; returns the decoded int16 samples."""
    samples = np.atleast_2d(samples)
    channels, count = samples.shape
    codes = linear_to_ulaw(samples)
    header = sphere_header([
        ("sample_count", "i", count), ("channel_count", "i", channels), ("sample_n_bytes", "i", 1),
        ("sample_rate", "i", rate), ("sample_coding", "s4", "ulaw"),
    ])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + codes.T.tobytes())
    return np.stack([ulaw_to_linear_reference(row) for row in codes])


class _Bits:
    def __init__(self):
        self.bits: list[int] = []

    def put(self, value: int, count: int) -> None:
        self.bits.extend((value >> i) & 1 for i in range(count - 1, -1, -1))

    def unsigned(self, value: int, k: int) -> None:  # shorten's uvar: unary high part, k low bits
        self.bits.extend([0] * (value >> k) + [1])
        self.put(value & ((1 << k) - 1), k)

    def ulong(self, value: int) -> None:
        width = int(value).bit_length()
        self.unsigned(width, 2)
        self.unsigned(value, width)

    def signed(self, value: int, k: int) -> None:
        self.unsigned((value << 1) if value >= 0 else (((~value) << 1) | 1), k + 1)

    def tobytes(self) -> bytes:
        bits = self.bits + [0] * (-len(self.bits) % 8)
        return np.packbits(np.array(bits, dtype=np.uint8)).tobytes()


def shorten_encode(samples: np.ndarray, block_size: int = 256) -> bytes:
    """A minimal shorten v2 encoder (16-bit little-endian, first-difference prediction, Rice codes)."""
    samples = np.atleast_2d(samples).astype(np.int64)
    channels, count = samples.shape
    bits = _Bits()
    for value in (5, channels, block_size, 0, 0, 0):  # type S16LH, channels, block, maxnlpc, nmean, nskip
        bits.ulong(value)
    previous = np.zeros(channels, dtype=np.int64)
    position, current_block = 0, block_size
    while position < count:
        size = min(block_size, count - position)
        if size != current_block:
            bits.unsigned(5, 2)  # FN_BLOCKSIZE
            bits.ulong(size)
            current_block = size
        for channel in range(channels):
            block = samples[channel, position:position + size]
            residual = np.diff(np.concatenate([[previous[channel]], block]))
            k = min(15, max(0, int(np.log2(np.mean(np.abs(residual)) + 1))))
            bits.unsigned(1, 2)  # FN_DIFF1
            bits.unsigned(k, 3)
            for value in residual.tolist():
                bits.signed(value, k)
            previous[channel] = block[-1]
        position += size
    bits.unsigned(4, 2)  # FN_QUIT
    return b"ajkg" + bytes([2]) + bits.tobytes()


def write_sphere_shorten(path: Path, samples: np.ndarray, rate: int = 16000) -> None:
    samples = np.atleast_2d(samples)
    channels, count = samples.shape
    coding = "pcm,embedded-shorten-v2.00"
    header = sphere_header([
        ("sample_count", "i", count), ("channel_count", "i", channels), ("sample_n_bytes", "i", 2),
        ("sample_rate", "i", rate), ("sample_byte_format", "s2", "01"),
        ("sample_coding", f"s{len(coding)}", coding), ("sample_sig_bits", "i", 16),
    ])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + shorten_encode(samples))


def read_gz_jsonl(path: Path) -> list[dict]:
    import gzip
    import json

    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def flac_samples(path: str, root: Path) -> np.ndarray:
    """The samples of a manifest's audio path (relative paths are relative to the manifest folder)."""
    import soundfile

    samples, rate = soundfile.read(str(Path(root) / path), dtype="int16")
    assert rate == 16000
    return samples
