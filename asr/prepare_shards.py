"""Prepare a corpus for the streaming data path: every split's cuts checked, their features computed
and written as shards, once (asr/data/streaming/stream_shards.py; asr/docs/data.md, "Large corpora").

    python -m asr.prepare_shards root=data/big corpus=big [splits=[train,dev,test]] [jobs=4]
                                 [cache_dir=/scratch/big_features] [num_mel_bins=40]
                                 [stream_shard_cuts=1000] [skip_bad_audio=false] [allow_commands=false]

Then train with the same root, corpus, cache_dir and num_mel_bins, and `data.streaming=true` (or
the default `auto`, which finds the shards): `python -m asr.train conf=... data.root=data/big
data.corpus=big`. asr.train prepares missing shards itself too, on one process; this command is
for doing it ahead, with `jobs` processes, and seeing what was left out before training starts.

Resumable: run it again after an interruption and it computes only the shards not finished. A
split's shards are redone when its manifest changes (its size or modification time). Prints per
split the utterances, hours, shards, disk used and the utterances left out (and why).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from asr.config.command_line import key_value_config, run_key_value_command
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.corpus.manifests import ManifestError


class BadArguments(ValueError):
    """An argument asr.prepare_shards does not take, or a value the data options refuse."""


@dataclass
class PrepareShardsArguments:
    root: str = "data/synth"              # the folder of the manifests (data.root)
    corpus: str = "synth"                 # the manifests' name: {root}/{corpus}_cuts_{split}.jsonl.gz (data.corpus)
    splits: List[str] = field(default_factory=lambda: ["train", "dev", "test"])
    cache_dir: Optional[str] = None       # where the shards go (data.cache_dir); None: {root}/features
    num_mel_bins: int = 40                # data.num_mel_bins of the model to train
    stream_shard_cuts: int = 1000         # utterances per shard
    jobs: int = 1                         # processes computing shards (data.feature_jobs)
    skip_bad_audio: bool = False          # false: stop listing every utterance with unusable audio
    allow_commands: bool = False          # audio from shell commands in the manifests (data.allow_commands)
    progress: bool = True


def prepare(arguments: list[str]) -> None:
    args = key_value_config(PrepareShardsArguments, arguments, BadArguments)
    if not args.splits:
        raise BadArguments("splits=[] names no split; e.g. splits=[train,dev,test]")
    try:
        config = DataConfig(corpus=args.corpus, root=args.root, cache_dir=args.cache_dir, num_mel_bins=args.num_mel_bins,
                            stream_shard_cuts=args.stream_shard_cuts, feature_jobs=args.jobs,
                            skip_bad_audio=args.skip_bad_audio, allow_commands=args.allow_commands, progress=args.progress, streaming=True,
                            train_split=args.splits[0], targets=["chars"])
        config.check_feature_cache()   # the shards are written there
        module = SpeechDataModule(config)
    except ValueError as error:
        raise BadArguments(str(error)) from None
    for name in args.splits:
        split = module.split(name)
        folder = split.index.folder
        size = sum(path.stat().st_size for path in folder.iterdir() if path.is_file())
        dropped = f"; left out: {split.dropped}" if split.dropped else ""
        print(f"{name}: {split.utterances:,} utterances, {split.hours:.2f} h, {split.index.shards} shards, "
              f"{size / 1e9:.2f} GB in {folder}{dropped}")


def main(argv: list[str] | None = None) -> int:
    return run_key_value_command("asr.prepare_shards", __doc__, prepare, argv, usage_errors=(BadArguments, ManifestError),
                                 resume_hint="run the same command again: finished shards are kept")


if __name__ == "__main__":
    raise SystemExit(main())
