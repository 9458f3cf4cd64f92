"""One run per run folder: a second run on a folder another one holds refuses at once (exit 2, one
line naming the holder) and touches nothing of it; a lock left by a killed run is taken over."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from asr.core.exit_status import USAGE_ERROR
from asr.model.run_folder import RUN_LOCK, RunFolderInUseError, claim_run_folder
from asr.train import hydra_value

ROOT = Path(__file__).resolve().parents[2]


def hold_in_another_process(run_dir: Path) -> subprocess.Popen:
    """A process that claims run_dir as asr.train does and keeps it until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from asr.model.run_folder import claim_run_folder
        claim_run_folder(Path({str(run_dir)!r}))
        print("holding", flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def test_a_second_owner_is_refused_by_name_and_a_dead_owners_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_in_another_process(run_dir)
    try:
        with pytest.raises(RunFolderInUseError, match=rf"run folder {run_dir} is in use by another run \(asr process "
                                                       rf"{holder.pid} on .*\); wait for it to end, or give another run_dir"):
            claim_run_folder(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)   # dies without cleaning up: its lock file stays
        holder.wait()
    assert f"asr process {holder.pid} " in (run_dir / RUN_LOCK).read_text()
    claim_run_folder(run_dir)                # the kernel dropped the dead process's flock
    assert (run_dir / RUN_LOCK).read_text().startswith(f"asr process {os.getpid()} ")
    claim_run_folder(run_dir)                # the owner claiming again (a second train() in-process) is fine


def test_asr_train_on_a_folder_in_use_exits_2_at_once_and_leaves_it_alone(tmp_path):
    run_dir = tmp_path / "busy run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"the other run's")
    (run_dir / "results.json").write_text('{"test": "the other run\'s"}\n')
    holder = hold_in_another_process(run_dir)
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        second = subprocess.run([sys.executable, "-m", "asr.train", "conf=synth_full",
                                 f"run_dir={hydra_value(str(run_dir))}", "ckpt_path=last"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == USAGE_ERROR
    assert second.stderr.strip().splitlines() == [
        f"asr.train: error: run folder {run_dir} is in use by another run (asr process {holder.pid} on "
        + second.stderr.split(f"asr process {holder.pid} on ")[1].split(")")[0]
        + "); wait for it to end, or give another run_dir"]
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == b"the other run's"
    assert (run_dir / "results.json").read_text() == '{"test": "the other run\'s"}\n'


@pytest.mark.parametrize("folder", ["runs/plain-1.0", "runs/with space", "/tmp/it's,[1]=x"])
def test_a_run_folder_is_written_as_a_hydra_value_that_reads_back_whole(folder):
    override = OverridesParser.create().parse_override(f"run_dir={hydra_value(folder)}")
    assert override.value() == folder
