"""Past one machine, simulated on this one: torchrun with two "nodes" (two torchrun agents on
localhost, --node-rank 0 and 1, one rendezvous at 127.0.0.1), gloo on the CPU.

One run folder goes through three jobs, as a run on a cluster might:

1. 2 nodes x 2 processes train 2 epochs and test (`trainer.num_nodes=2 trainer.devices=2`): every
   process runs its own disjoint share of every split, each utterance once; only rank 0 writes the
   checkpoints, the logs and results.json (every file each process writes is recorded by an audit
   hook, tests' sitecustomize below); each split's features are computed once, by one process; the gathered
   validation PER is a single process's validation of the same checkpoint; and the process group
   has the collective timeout asked for (`trainer.ddp_timeout_minutes`).
2. The run resumes (`ckpt_path=last`) on 2 nodes x 1 process, and the process of node 1 is killed
   (SIGKILL) in the second epoch it trains: the job ends at once, node 0 says in one line what
   happened and how to resume, and last.ckpt is the end of the epoch before.
3. It resumes again on one process (python -m asr.train, no launcher) and trains to the end.

Each resume continues from its checkpoint's step and epoch; the epochs it trains take the batches
that the sampler gives for the new number of processes (asr.data.batching.duration_buckets: the checkpoint holds the
epoch to start, not a position in it, so nothing of the old world size carries over).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lhotse import load_manifest
from omegaconf import OmegaConf

from asr.data.batching.duration_buckets import duration_bucketing_sampler
from asr.data.config import DataConfig
from asr.data.datamodule import SpeechDataModule
from tiny_runs import ROOT, TINY, subprocess_environment, validate_in_one_process

TIMEOUT = 300
# Records every file a process opens for writing, renames to or removes under ASR_AUDIT_UNDER, with
# the rank its launcher gave it, into ASR_AUDIT_DIR/<pid>.jsonl (Python's audit hooks, PEP 578).
SITECUSTOMIZE = '''
import json, os, sys
if os.environ.get("ASR_AUDIT_DIR"):
    _log = os.path.join(os.environ["ASR_AUDIT_DIR"], f"{os.getpid()}.jsonl")
    _under = tuple(os.environ["ASR_AUDIT_UNDER"].split(os.pathsep))
    _writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    _busy = []

    def _audit(event, args):
        if _busy or event not in ("open", "os.rename", "os.remove"):
            return
        path = args[1] if event == "os.rename" else args[0]
        if event == "open":
            mode, flags = args[1], args[2]
            if not (mode and set(mode) & set("wax+")) and not (mode is None and flags & _writing):
                return
        if not isinstance(path, (str, bytes, os.PathLike)):
            return
        path = os.path.abspath(os.fsdecode(path))
        if not path.startswith(_under):
            return
        _busy.append(1)
        try:
            with open(_log, "a") as f:
                f.write(json.dumps({"rank": os.environ.get("RANK", "-"), "path": path}) + "\\n")
        finally:
            _busy.pop()

    sys.addaudithook(_audit)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def arguments(corpus: Path, run: Path, cache: Path, *overrides: str) -> list[str]:
    return ["conf=synth_full", *TINY, f"data.root={corpus}", f"data.cache_dir={cache}", f"run_dir={run}",
            "trainer.accelerator=cpu", "trainer.record_batches=true", "trainer.torch_threads=1", *overrides]


def torchrun(nodes: int, per_node: int, asr_train: list[str], where: Path, name: str,
             env: dict[str, str]) -> list[tuple[subprocess.Popen, Path]]:
    """`nodes` torchrun agents on localhost, one per simulated machine, each starting `per_node`
    processes of asr.train; (process, output file) per agent."""
    port = free_port()
    agents = []
    for node in range(nodes):
        output = where / f"{name}.node{node}.log"
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                   f"--nproc-per-node={per_node}", f"--node-rank={node}", "--master-addr=127.0.0.1",
                   f"--master-port={port}", "-m", "asr.train", *asr_train]
        with open(output, "w") as handle:
            agents.append((subprocess.Popen(command, cwd=where, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                            start_new_session=True), output))
    return agents


def wait(agents, seconds: float = TIMEOUT) -> list[int]:
    deadline = time.monotonic() + seconds
    try:
        return [process.wait(timeout=max(1.0, deadline - time.monotonic())) for process, _ in agents]
    except subprocess.TimeoutExpired:
        for process, _ in agents:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        raise


def processes_of(marker: str) -> list[int]:
    """The processes this test started (their environment holds `marker`): agents and workers."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if f"ASR_TEST_MARKER={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def records(run: Path, rank: int, skip: int = 0) -> list[dict]:
    """The batches process `rank` recorded (asr.training.callbacks.BatchRecorder), after the first `skip` lines."""
    path = run / "batches" / f"rank{rank}.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [json.loads(line) for line in lines[skip:] if line.endswith("}")]


def line_counts(run: Path, ranks: int) -> list[int]:
    return [len(records(run, rank)) for rank in range(ranks)]


def of(batches: list[dict], stage: str, epoch: int) -> list[dict]:
    return [b for b in batches if b["stage"] == stage and b["epoch"] == epoch]


def manifest_ids(corpus: Path, split: str) -> Counter:
    return Counter(cut.id for cut in load_manifest(corpus / f"synth_cuts_{split}.jsonl.gz"))


def sampler_batches(run: Path, world_size: int, rank: int, epoch: int) -> list[tuple[list[str], bool]]:
    """The training batches (ids, padding) of `rank` out of `world_size` in `epoch`, from the sampler
    alone, as the data module builds it (asr.data.datamodule, step 6) for the run's config."""
    cfg = OmegaConf.load(run / "config.yaml")
    data = SpeechDataModule(DataConfig.of(cfg.data), frame_subsampling=cfg.model.subsampling, seed=cfg.seed)
    cuts = data.split(cfg.data.train_split).cuts   # as training kept them (the features are cached)
    sampler = duration_bucketing_sampler(cuts, cfg.data.max_duration, cfg.data.num_buckets, shuffle=True,
                                         seed=cfg.seed, rank=rank, world_size=world_size)
    sampler.set_epoch(epoch)
    return [(list(batch.cuts.ids), batch.padding) for batch in sampler]


def recorded_as_sampled(batches: list[dict]) -> list[tuple[list[str], bool]]:
    return [(b["ids"], b["padding"]) for b in batches]


def checkpoint_position(path: Path) -> tuple[int, int]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint["epoch"], checkpoint["global_step"]


def worker_pid(marker: str, rank: int) -> int | None:
    """The asr.train process of this test (its environment holds `marker`) that has RANK=rank."""
    for pid in processes_of(marker):
        try:
            environment = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environment and b"asr.train" in command:
            return pid
    return None


@pytest.fixture(scope="module")
def jobs(ddp_corpus, tmp_path_factory) -> Iterator[dict]:
    """The three jobs of the module doc, one after another in one run folder; what each left."""
    where = tmp_path_factory.mktemp("nodes")
    try:
        yield run_the_jobs(ddp_corpus, where)
    finally:   # whatever a failed job left running (torchrun starts its workers in sessions of their own)
        for pid in processes_of(str(where)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_the_jobs(ddp_corpus: Path, where: Path) -> dict:
    run, cache, audit, site = where / "run", where / "features", where / "audit", where / "site"
    audit.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = subprocess_environment()
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")]),
               ASR_TEST_MARKER=str(where))
    found: dict = {"where": where, "run": run, "cache": cache}

    # 1. 2 nodes x 2 processes, 2 epochs, then the test split; every write recorded
    audited = dict(env, ASR_AUDIT_DIR=str(audit), ASR_AUDIT_UNDER=os.pathsep.join([str(run), str(cache)]))
    agents = torchrun(2, 2, arguments(ddp_corpus, run, cache, "trainer.num_nodes=2", "trainer.devices=2",
                                      "trainer.strategy=ddp", "trainer.max_epochs=2",
                                      "trainer.ddp_timeout_minutes=7"), where, "first", audited)
    statuses = wait(agents)
    found["first"] = {"statuses": statuses, "outputs": [output.read_text() for _, output in agents],
                      "records": [records(run, rank) for rank in range(4)],
                      "results": json.loads((run / "results.json").read_text()) if statuses == [0, 0] else None,
                      "writes": [json.loads(line) for log in audit.glob("*.jsonl") for line in log.read_text().splitlines()]}
    assert statuses == [0, 0], "\n".join(text[-3000:] for text in found["first"]["outputs"])
    shutil.copy(run / "checkpoints" / "last.ckpt", where / "first_last.ckpt")   # the next job rewrites it
    with open(next(run.glob("logs/version_*/metrics.csv"))) as f:
        found["first"]["validations"] = [row for row in csv.DictReader(f) if row.get("val/per")]

    # 2. resumed on 2 nodes x 1 process; node 1's process killed in the second epoch it trains
    skip = line_counts(run, 2)
    resume_epoch = checkpoint_position(run / "checkpoints" / "last.ckpt")[0] + 1
    agents = torchrun(2, 1, arguments(ddp_corpus, run, cache, "trainer.num_nodes=2", "trainer.devices=1",
                                      "trainer.strategy=ddp", "trainer.max_epochs=5", "ckpt_path=last",
                                      "test=false"), where, "killed", env)
    deadline = time.monotonic() + TIMEOUT
    while not of(records(run, 1, skip[1]), "train", resume_epoch + 1):
        assert all(process.poll() is None for process, _ in agents), \
            "\n".join(output.read_text()[-3000:] for _, output in agents)
        assert time.monotonic() < deadline, "the second epoch of the resumed job did not start in time"
        time.sleep(0.05)
    pid = worker_pid(str(where), rank=1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    statuses = wait(agents, 120)
    found["killed"] = {"statuses": statuses, "seconds_to_end": time.monotonic() - killed_at,
                       "resume_epoch": resume_epoch, "outputs": [output.read_text() for _, output in agents],
                       "records": [records(run, rank, skip[rank]) for rank in range(2)],
                       "last": checkpoint_position(run / "checkpoints" / "last.ckpt")}

    # 3. resumed again on one process, to the end
    skip = line_counts(run, 1)
    finished = subprocess.run([sys.executable, "-m", "asr.train",
                               *arguments(ddp_corpus, run, cache, "trainer.devices=1", "trainer.max_epochs=5",
                                          "ckpt_path=last", "test=false")],
                              cwd=where, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr[-4000:]
    found["single"] = {"output": finished.stdout + finished.stderr, "records": records(run, 0, skip[0]),
                       "results": json.loads((run / "results.json").read_text())}
    return found


def test_four_processes_on_two_nodes_run_disjoint_shares_of_every_split(jobs, ddp_corpus):
    first = jobs["first"]
    for stage, split, epochs in (("train", "train", (0, 1)), ("val", "dev", (0, 1)), ("test", "test", (2,))):
        for epoch in epochs:
            mine = [of(batches, stage, epoch) for batches in first["records"]]
            assert mine[0] and len({len(batches) for batches in mine}) == 1, (stage, epoch)   # in step
            seen = [Counter(i for b in batches if not b["padding"] for i in b["ids"]) for batches in mine]
            assert sum(seen, Counter()) == manifest_ids(ddp_corpus, split), (stage, epoch)    # all, once each
            assert sum(len(s) for s in seen) == len(set().union(*seen)), (stage, epoch)       # disjoint
    # 6 training utterances, 4 processes: every process got some (the last round's batches are split)
    assert all(of(batches, "train", 0) and not of(batches, "train", 0)[0]["padding"] for batches in first["records"])
    assert "DDP: 4 processes, 2 machine(s) x 2; a process waits at most 7 min at a collective" in first["outputs"][0]


def test_only_rank_zero_writes_checkpoints_logs_and_results(jobs):
    run, cache = jobs["run"], jobs["cache"]
    writers: dict[str, set[str]] = {}     # path -> the ranks that wrote it
    for write in jobs["first"]["writes"]:
        writers.setdefault(write["path"], set()).add(write["rank"])
    by_rank: dict[str, set[str]] = {}
    for path, ranks in writers.items():
        for rank in ranks:
            by_rank.setdefault(rank, set()).add(path)
    assert {"0", "1", "2", "3"} <= set(by_rank)
    # what the data preparation writes - the feature cache, the run's copies of the lexicon and LM - is
    # written by whichever process needs it first (under the lock), once: the others find it on disk
    # (options.json excepted: it says the options, and every process that finds it missing writes it)
    prepared = [path for path in writers if path.startswith((str(cache) + os.sep, str(run / "decoding") + os.sep))]
    assert prepared and all(len(writers[path]) == 1 for path in prepared if not path.endswith((".tmp", "options.json", ".lock")))
    assert all(len(list(cache.glob(f"*/{split}/shard-*.json"))) == 1 for split in ("train", "dev", "test"))
    in_run = {rank: {str(Path(p).relative_to(run)) for p in paths if p.startswith(str(run) + os.sep)}
              for rank, paths in by_rank.items()}
    for rank in ("1", "2", "3"):   # besides that: its own batch record and log, and the lock
        assert {path for path in in_run[rank] if not path.startswith("decoding/")} <= \
            {f"batches/rank{rank}.jsonl", f"train_ddp_process_{rank}.log", ".data_preparation.lock"}, rank
    assert not in_run.get("-")     # nor the torchrun agents
    assert {"checkpoints/last.ckpt", "checkpoints/best.ckpt", "results.json", "config.yaml", "train.log"} <= in_run["0"]
    assert any(path.startswith("logs/") for path in in_run["0"])


def test_the_gathered_validation_is_a_single_process_validation(jobs):
    first = jobs["first"]
    expected, expected_loss = validate_in_one_process(jobs["run"], jobs["where"] / "first_last.ckpt")
    assert 0 < expected["per"] and expected["per"] != 1.0     # not the all-blank (or perfect) output
    assert first["results"]["val"]["per"] == expected["per"] and first["results"]["val"]["wer"] == expected["wer"]
    assert float(first["validations"][-1]["val/per"]) == pytest.approx(expected["per"], rel=1e-6)
    assert float(first["validations"][-1]["val/loss"]) == pytest.approx(expected_loss, rel=1e-4)


def test_a_killed_process_ends_the_job_with_one_line_saying_how_to_resume(jobs):
    killed, run = jobs["killed"], jobs["run"]
    assert all(status != 0 for status in killed["statuses"])
    assert killed["seconds_to_end"] < 60          # noticed at the next collective (seconds here), not a timeout
    lines = re.findall(r"^asr\.train: error: .*$", killed["outputs"][0], re.M)
    assert len(lines) == 1, killed["outputs"][0][-3000:]
    assert re.fullmatch(
        r"asr\.train: error: another process of the run has ended: killed, out of memory, or its machine lost "
        r"\(.*by peer.*\), so the run stopped; resume "
        r"from its last checkpoint by starting the job again with run_dir=(\S+) ckpt_path=last added to "
        r"asr\.train's arguments \(on any number of processes\)", lines[0])
    assert re.search(r"run_dir=(\S+)", lines[0]).group(1) == str(run.resolve())
    # instead of the collective's error and Hydra's report of it (torchrun's agent prints its own summary)
    assert "This is typically caused by" not in killed["outputs"][0]
    assert "Error executing job" not in killed["outputs"][0]


def test_each_resume_continues_from_its_checkpoint_with_the_new_process_count(jobs):
    first, killed, single, run = jobs["first"], jobs["killed"], jobs["single"], jobs["run"]
    resumed = killed["resume_epoch"]
    # the killed job resumed from the first job's end: 4 processes -> 2
    assert f"(epoch {resumed - 1}, step {first['results']['steps']})" in killed["outputs"][0]
    for rank in range(2):
        assert recorded_as_sampled(of(killed["records"][rank], "train", resumed)) == \
            sampler_batches(run, 2, rank, resumed)
    # its last checkpoint is the end of the epoch it finished before the kill
    steps_then = first["results"]["steps"] + len(of(killed["records"][0], "train", resumed))
    assert killed["last"] == (resumed, steps_then)
    # the single process resumed from there: 2 processes -> 1, the epochs its sampler gives, to the end
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'} (epoch {resumed}, step {steps_then})" in single["output"]
    epochs = list(range(resumed + 1, 5))
    for epoch in epochs:
        assert recorded_as_sampled(of(single["records"], "train", epoch)) == sampler_batches(run, 1, 0, epoch)
    assert single["results"]["steps"] == steps_then + sum(len(of(single["records"], "train", e)) for e in epochs)
    assert single["results"]["epochs"] == 5
