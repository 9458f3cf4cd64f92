"""How fast the data pipeline is on this machine: feature precomputation and one epoch of batches.

    python -m asr.benchmarks.data --root data/synth [--corpus synth] [--split train] [--limit N]

Prints two tables, each measured in this one run:
1. precomputing the fbank features of the split into a fresh temporary folder with 1 and 2 processes;
2. one epoch of training batches (SpecAugment on, as in training) with precomputed features and
   0, 1, 2 DataLoader workers, and with features computed on the fly; times relative to the first row.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from asr.data.config import DataConfig

from asr.data.datamodule import SpeechDataModule
from asr.data.corpus.manifests import ManifestError
from asr.core.exit_status import run_command
from asr.data.features.feature_cache import precompute_features
from asr.data.features.features import FilterBank


def _epoch_seconds(module: SpeechDataModule) -> tuple[float, int]:
    loader = module.train_dataloader()
    start = time.perf_counter()
    frames = 0
    for batch in loader:
        frames += int(batch["feature_lengths"].sum())
    seconds = time.perf_counter() - start
    del loader  # stops persistent workers
    return seconds, frames


def main(argv: list[str] | None = None) -> int:
    """The command, with the project's exit statuses (asr.core.exit_status): 2 for a bad option or a
    folder without the manifests, 130 after Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m asr.benchmarks.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--corpus", default="synth")
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int, default=None, help="use the first N utterances of the split")
    parser.add_argument("--num-mel-bins", type=int, default=40)
    parser.add_argument("--max-duration", type=float, default=200.0)
    args = parser.parse_args(argv)
    return run_command("asr.benchmarks.data", lambda: benchmark(args), usage_errors=(BadArguments, ManifestError))


class BadArguments(ValueError):
    """An option the data module refuses (its ValueError, raised before anything is measured)."""


def benchmark(args: argparse.Namespace) -> None:
    def config(**overrides) -> DataConfig:
        data = DataConfig(corpus=args.corpus, root=args.root, train_split=args.split, dev_split=args.split,
                          targets=["phones", "chars"], num_mel_bins=args.num_mel_bins,
                          max_duration=args.max_duration, max_train_utterances=args.limit, progress=False,
                          **overrides)
        data.check_feature_cache()   # the cached mode writes features there
        return data

    try:
        probe = SpeechDataModule(config(precompute_features=False))
    except ValueError as error:
        raise BadArguments(str(error)) from None
    cuts = list(probe.split(args.split, features=False).cuts)
    hours = sum(c.duration for c in cuts) / 3600
    print(f"{args.corpus}/{args.split}: {len(cuts)} utterances, {hours:.2f} h of audio, "
          f"{args.num_mel_bins} mel bins\n")

    print("precompute features (fresh folder)      seconds   utt/s   vs 1 process")
    filterbank = FilterBank(args.num_mel_bins)
    base = None
    for jobs in (1, 2):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            _, failures = precompute_features(cuts, filterbank, Path(folder), jobs=jobs, progress=False)
            seconds = time.perf_counter() - start
        base = base or seconds
        print(f"  feature_jobs={jobs:<28d} {seconds:8.1f} {len(cuts) / seconds:7.0f}   {base / seconds:5.2f}x"
              + (f"  ({len(failures)} failed)" if failures else ""))

    print("\none training epoch (SpecAugment on)     seconds   frames/s   vs first row")
    cached = SpeechDataModule(config(precompute_features=True, feature_jobs=2))
    cached.setup("fit")  # fills the cache under root (reused by later runs) and the statistics
    rows = [(f"precomputed, num_workers={w}", config(precompute_features=True, num_workers=w)) for w in (0, 1, 2)]
    rows.append(("on the fly, num_workers=0", config(precompute_features=False, num_workers=0)))
    rows.append(("on the fly, num_workers=2", config(precompute_features=False, num_workers=2)))
    base = None
    for label, cfg in rows:
        module = SpeechDataModule(cfg)
        module.setup("fit")
        seconds, frames = _epoch_seconds(module)
        base = base or seconds
        print(f"  {label:<37s} {seconds:8.1f} {frames / seconds:10.0f}   {base / seconds:5.2f}x")


if __name__ == "__main__":
    sys.exit(main())
