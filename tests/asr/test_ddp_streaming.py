"""The streaming data path past one machine, simulated on this one (tests/asr/test_ddp_nodes.py is
the eager version, whose launcher helpers this module uses): torchrun with two "nodes" of two
processes each on a streamed corpus, then a resume on two nodes of one process.

1. 2 nodes x 2 processes train on the corpus's shards (prepared ahead, here, so the processes only
   read them): in the first epoch the processes' shares are disjoint and cover every training
   utterance once (padding batches excluded: the streaming sampler drops nothing), each process
   runs exactly the batches StreamingBucketSampler deals it (its windows) and all take the same
   number of steps; each process opens only the shards of its own windows (an audit hook records
   every shard a process opens). With trainer.checkpoint_every_n_steps=1, the job is killed (-9,
   every process) in the second epoch, while rank 0 writes the checkpoint of that epoch's second
   step (asr.core.fault_injection's checkpoint_replace), so last.ckpt is the one of its first step.
   Its first epoch's validation (a process with no window of the dev split runs padding batches)
   gives the error rates of a single process's validation of the same checkpoint.
2. The run resumes (ckpt_path=last) on 2 nodes x 1 process: each process runs the batches the
   sampler deals two processes from the checkpoint's position - the second epoch's batches not done
   before - and over the two jobs that epoch trains every utterance exactly once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from asr.data.batching.stream_sampler import StreamingBucketSampler, plan_buckets
from asr.data.streaming.stream_shards import StreamIndex
from asr.training.fit import ensure_corpus
from test_ddp_nodes import arguments, manifest_ids, of, processes_of, records, recorded_as_sampled, torchrun, wait
from tiny_runs import ROOT, compose_config, subprocess_environment, tiny_config, validate_in_one_process

TIMEOUT = 300
STREAMING = ["data.streaming=true", "data.stream_shard_cuts=1", "data.stream_window_shards=2", "data.max_duration=18"]
# Records every shard file of a training stream a process opens (reading or writing; Python's audit
# hooks, PEP 578: builtins.open and os.open both raise "open"), with the rank its launcher gave it,
# into ASR_AUDIT_DIR/<pid>.jsonl.
SITECUSTOMIZE = '''
import json, os, sys
if os.environ.get("ASR_AUDIT_DIR"):
    _log = os.path.join(os.environ["ASR_AUDIT_DIR"], f"{os.getpid()}.jsonl")
    _busy = []

    def _audit(event, args):
        if _busy or event != "open" or not isinstance(args[0], (str, os.PathLike)):
            return
        path = os.fspath(args[0])
        if f"{os.sep}train{os.sep}stream{os.sep}shard-" not in path:
            return
        _busy.append(1)
        try:
            with open(_log, "a") as f:
                f.write(json.dumps({"rank": os.environ.get("RANK", "-"), "shard": os.path.basename(path)}) + "\\n")
        finally:
            _busy.pop()

    sys.addaudithook(_audit)
'''


@pytest.fixture(scope="module")
def stream_corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, feature cache): the built-in corpus with 21 / 5 / 1 utterances, its splits prepared as
    shards of one utterance - ten windows of two shards and one of one, dealt to four processes."""
    root = tmp_path_factory.mktemp("synth_stream_ddp")
    ensure_corpus(compose_config(f"data.root={root}", "synth_corpus.train_utterances=21",
                                 "synth_corpus.dev_utterances=5", "synth_corpus.test_utterances=1",
                                 "synth_corpus.jobs=1"))
    cache = root / "cache"
    cfg = tiny_config(root, "conf=synth_full", f"data.cache_dir={cache}", *STREAMING)
    SpeechDataModule(DataConfig.of(cfg.data), frame_subsampling=cfg.model.subsampling, seed=cfg.seed).setup("fit")
    return root, cache


def stream_sampler(run_config, rank: int, world_size: int) -> StreamingBucketSampler:
    """The training sampler of `rank` out of `world_size`, as the data module builds it for the run."""
    data = SpeechDataModule(DataConfig.of(run_config.data), frame_subsampling=run_config.model.subsampling, seed=run_config.seed)
    index = StreamIndex.open(data.split(run_config.data.train_split).index.folder)
    buckets = plan_buckets(index, run_config.data.num_buckets, run_config.data.max_duration)
    return StreamingBucketSampler(index, buckets, shuffle=True, seed=run_config.seed, rank=rank, world_size=world_size,
                                  window_shards=run_config.data.stream_window_shards)


def sampled(sampler: StreamingBucketSampler) -> list[tuple[list[str], bool]]:
    return [([cut.id for cut in batch.cuts], batch.padding) for batch in sampler]


def window_shards(sampler: StreamingBucketSampler, consumed=None) -> set[str]:
    """The shard files of the windows the sampler deals its process (from `consumed` on, if given)."""
    windows, counts = sampler.epoch_plan(sampler.epoch)
    mine = sampler.shares(consumed if consumed is not None else counts * 0, counts)[sampler.rank]
    return {f"shard-{int(shard):06d}{suffix}" for window in mine for shard in windows[window]
            for suffix in (".lilcom", ".cuts.jsonl.gz")}


def shards_read(audit: Path) -> dict[str, set[str]]:
    read: dict[str, set[str]] = {}
    for log in audit.glob("*.jsonl"):
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            read.setdefault(entry["rank"], set()).add(entry["shard"])
    return read


def kill_every_process(marker: str) -> None:
    for pid in processes_of(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def jobs(stream_corpus, tmp_path_factory) -> Iterator[dict]:
    where = tmp_path_factory.mktemp("stream_nodes")
    try:
        yield run_the_jobs(*stream_corpus, where)
    finally:   # whatever a failed job left running (torchrun starts its workers in sessions of their own)
        kill_every_process(str(where))


def run_the_jobs(corpus: Path, cache: Path, where: Path) -> dict:
    run, site = where / "run", where / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = subprocess_environment()
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")]),
               ASR_TEST_MARKER=str(where))
    config = tiny_config(corpus, "conf=synth_full", f"data.cache_dir={cache}", *STREAMING)
    first_epoch_steps = stream_sampler(config, 0, 4).estimated_batches()
    found: dict = {"where": where, "run": run, "config": config, "first_epoch_steps": first_epoch_steps}

    # 1. 2 nodes x 2 processes; killed while rank 0 replaces the second epoch's first step checkpoint
    # (replacements: steps 2 .. E-1 of the first epoch, E not (its last), its end, step E+1, step E+2)
    audit = where / "audit_first"
    audit.mkdir()
    marker = where / "paused"
    paused = dict(env, ASR_AUDIT_DIR=str(audit), ASR_PAUSE_AT=f"checkpoint_replace:{first_epoch_steps + 1}",
                  ASR_PAUSE_MARKER=str(marker))
    agents = torchrun(2, 2, arguments(corpus, run, cache, *STREAMING, "trainer.num_nodes=2", "trainer.devices=2",
                                      "trainer.strategy=ddp", "trainer.max_epochs=2", "test=false",
                                      "trainer.checkpoint_every_n_steps=1"), where, "first", paused)
    try:
        wait_for(marker, agents)
    finally:
        kill_every_process(str(where))
    wait(agents, 60)
    shutil.copy(run / "checkpoints" / "best.ckpt", where / "first_best.ckpt")   # the first epoch's (job 2 may replace)
    found["first"] = {"outputs": [output.read_text() for _, output in agents],
                      "records": [records(run, rank) for rank in range(4)], "read": shards_read(audit),
                      "checkpoint": torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)}

    # 2. resumed on 2 nodes x 1 process, to the second epoch's end
    skip = [len(records(run, rank)) for rank in range(2)]
    audit = where / "audit_resumed"
    audit.mkdir()
    agents = torchrun(2, 1, arguments(corpus, run, cache, *STREAMING, "trainer.num_nodes=2", "trainer.devices=1",
                                      "trainer.strategy=ddp", "trainer.max_epochs=2", "ckpt_path=last", "test=false"),
                      where, "resumed", dict(env, ASR_AUDIT_DIR=str(audit)))
    statuses = wait(agents)
    found["resumed"] = {"statuses": statuses, "outputs": [output.read_text() for _, output in agents],
                        "records": [records(run, rank, skip[rank]) for rank in range(2)], "read": shards_read(audit)}
    assert statuses == [0, 0], "\n".join(text[-3000:] for text in found["resumed"]["outputs"])
    return found


def wait_for(marker: Path, agents) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        assert all(process.poll() is None for process, _ in agents), \
            "\n".join(output.read_text()[-3000:] for _, output in agents)
        assert time.monotonic() < deadline, "the kill point was not reached in time"
        time.sleep(0.05)


def training_ids(batches: list[dict]) -> Counter:
    return Counter(i for b in batches if not b["padding"] for i in b["ids"])


def test_four_streaming_processes_read_and_run_disjoint_shares_that_cover_the_epoch_once(jobs, stream_corpus):
    first, config = jobs["first"], jobs["config"]
    mine = [of(batches, "train", 0) for batches in first["records"]]
    assert {len(batches) for batches in mine} == {jobs["first_epoch_steps"]}    # in step
    seen = [training_ids(batches) for batches in mine]
    assert sum(seen, Counter()) == manifest_ids(stream_corpus[0], "train")     # every utterance, once
    assert any(b["padding"] for batches in mine for b in batches)             # (the shares are uneven)
    for rank in range(4):
        sampler = stream_sampler(config, rank, 4)
        assert recorded_as_sampled(mine[rank]) == sampled(sampler), rank      # its windows' batches
        # it opened the shards of its windows of the first epoch, and of no other window than its own
        # in the second (killed early in it, it may not have reached all of them)
        second = stream_sampler(config, rank, 4)
        second.set_epoch(1)
        read = first["read"][str(rank)]
        assert window_shards(sampler) <= read <= window_shards(sampler) | window_shards(second), rank
    validation = [training_ids(of(batches, "val", 0)) for batches in first["records"]]
    assert sum(validation, Counter()) == manifest_ids(stream_corpus[0], "dev")
    assert "DDP: 4 processes, 2 machine(s) x 2" in first["outputs"][0]


def test_a_resume_on_two_processes_trains_exactly_the_batches_the_killed_job_had_not(jobs, stream_corpus):
    first, resumed, config = jobs["first"], jobs["resumed"], jobs["config"]
    steps = jobs["first_epoch_steps"]
    saved = first["checkpoint"]
    (state,) = [value for key, value in saved.items() if key.endswith("DataModule")]
    position = state["stream_position"]
    assert saved["global_step"] == steps + 1 and position["epoch"] == 1 and position["steps"] == 1
    last = jobs["run"] / "checkpoints" / "last.ckpt"
    assert f"resuming from {last} (epoch 1, step {steps + 1})" in resumed["outputs"][0]
    # what the killed job had trained of the second epoch when last.ckpt was written: a batch a process
    done = [of(batches, "train", 1)[:1] for batches in first["records"]]
    again = [of(batches, "train", 1) for batches in resumed["records"]]
    assert len(again[0]) == len(again[1]) > 0
    for rank in range(2):
        sampler = stream_sampler(config, rank, 2)
        sampler.resume_at(position)
        assert recorded_as_sampled(again[rank]) == sampled(sampler), rank
        windows, counts = sampler.epoch_plan(1)
        consumed = torch.tensor(position["consumed"]).numpy()
        assert resumed["read"][str(rank)] <= window_shards(sampler, consumed), rank
    assert sum((training_ids(batches) for batches in done + again), Counter()) == \
        manifest_ids(stream_corpus[0], "train")


def test_the_gathered_streamed_validation_is_a_single_process_validation(jobs):
    first_best = jobs["where"] / "first_best.ckpt"
    saved = torch.load(first_best, weights_only=True)
    assert saved["epoch"] == 0
    expected, _ = validate_in_one_process(jobs["run"], first_best)
    assert 0 < expected["per"] and expected["per"] != 1.0     # not the all-blank (or perfect) output
    assert saved["val_error_rates"] == expected
