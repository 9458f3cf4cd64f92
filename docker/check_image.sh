#!/usr/bin/env bash
# Runs an image that docker/build_here.sh built the way its users run it (`docker run` there, podman
# here: no daemon) and checks what it must do, printing one line per check with its seconds:
#
#   sudo docker/check_image.sh [IMAGE]        (default clustered-asr:cpu)
#
#   1. the kernels' tests: python -m pytest tests/attention_ext -q (CUDA tests skip without a GPU)
#   2. python -m asr.train conf=synth_iclustered trainer.max_steps=20 with /data and /runs mounted
#      from host folders of a non-root user and --user that user: the synthetic corpus is generated
#      into the data folder, the run folder lands in the runs folder, owned by that user
#   3. SIGTERM (podman stop, through tini) during training: the run leaves checkpoints/last.ckpt,
#      and the same command with ckpt_path=last resumes from its step and trains 10 more (test=false:
#      check 2 tested a run already)
#   4. a GPU asked for where there is none: the runtime's --device request, and
#      trainer.accelerator=gpu inside the container, each fail with one line
#
# Environment: BUILD_HERE_STORE (as build_here.sh), CHECK_USER (default 4321:4321, neither root nor
# the image's own uid 1000), PODMAN_RUN_FLAGS (default: this sandbox's limits, see below).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/here_storage.sh
image=${1:-clustered-asr:cpu}
user=${CHECK_USER:-4321:4321}
work="$STORE/check"
# This machine's sandbox: cgroup v1 (crun refuses it; runc with cgroupfs works) and rlimits that
# cannot be raised (podman's defaults of nofile 1048576 and nproc 32768 fail).
podman_flags=${PODMAN_FLAGS:---cgroup-manager cgroupfs --runtime runc}
run_flags=${PODMAN_RUN_FLAGS:---ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=4096:4096}
podman() { command podman $STORAGE_FLAGS $podman_flags "$@"; }
run_image() {
  podman run --network host --shm-size=2g $run_flags --user "$user" \
    -v "$work/data:/data" -v "$work/runs:/runs" "$@"
}

now() { date +%s.%N; }
started=$(now)
step_started=$started
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f s", end - start }'; }
passed() { echo "check_image.sh: $* ($(seconds_since "$step_started"))"; step_started=$(now); }
failed() { echo "check_image.sh: FAILED: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work/data" "$work/runs" "$work/logs"
chown "$user" "$work/data" "$work/runs"

# ---- 1. the kernels' tests (the code folder is read-only to the user: no pytest cache)
run_image --rm "$image" python -m pytest tests/attention_ext -q -p no:cacheprovider > "$work/logs/pytest.log" 2>&1 \
  || { tail -n 30 "$work/logs/pytest.log"; failed "tests/attention_ext (log: $work/logs/pytest.log)"; }
passed "[1/4] tests/attention_ext: $(tail -n 1 "$work/logs/pytest.log")"

# ---- 2. a short training run, corpus and run folder on the mounted folders
run_image --rm "$image" python -m asr.train conf=synth_iclustered trainer.max_steps=20 \
  > "$work/logs/train.log" 2>&1 || { tail -n 30 "$work/logs/train.log"; failed "asr.train (log: $work/logs/train.log)"; }
run=$(ls -d "$work"/runs/synth_iclustered/*/ | head -n 1)
[ -f "$run/results.json" ] && [ -f "$run/checkpoints/best.ckpt" ] || failed "no results.json and best.ckpt in $run"
owners=$(find "$work/runs" "$work/data" -printf '%U:%G\n' | sort -u | tr '\n' ' ')
[ "$owners" = "$user " ] || failed "files in the mounted folders belong to $owners, not only to $user"
passed "[2/4] asr.train trainer.max_steps=20: $(grep -E '^test: ' "$work/logs/train.log" | head -n 1); run folder ${run#"$work"/} owned by $user"

# ---- 3. SIGTERM during training, then resume
stopped=/runs/stopped
run_image -d --name check-sigterm "$image" python -m asr.train conf=synth_iclustered run_dir=$stopped \
  trainer.max_steps=2000 > /dev/null
for _ in $(seq 600); do   # until training has run some steps (the step budget estimate is logged after the first steps)
  podman logs check-sigterm 2>&1 | grep -q "steps left take about" && break
  sleep 1
done
sleep 10
podman stop --time 120 check-sigterm > /dev/null   # SIGTERM to PID 1 (tini), which hands it to python
status=$(podman inspect check-sigterm --format '{{.State.ExitCode}}')
podman logs check-sigterm > "$work/logs/sigterm.log" 2>&1
podman rm check-sigterm > /dev/null
checkpoint="$work/runs/stopped/checkpoints/last.ckpt"
[ -f "$checkpoint" ] || { tail -n 20 "$work/logs/sigterm.log"; failed "no $checkpoint after SIGTERM"; }
saved_step=$(grep -o -E 'SIGTERM: saved .* at step [0-9]+' "$work/logs/sigterm.log" | grep -o -E '[0-9]+$' || true)
[ -n "$saved_step" ] || failed "the stopped run did not log its SIGTERM checkpoint (log: $work/logs/sigterm.log)"
run_image --rm "$image" python -m asr.train conf=synth_iclustered run_dir=$stopped ckpt_path=last \
  trainer.max_steps=$((saved_step + 10)) test=false > "$work/logs/resume.log" 2>&1 \
  || { tail -n 30 "$work/logs/resume.log"; failed "the resumed run (log: $work/logs/resume.log)"; }
resumed=$(grep -o -E 'resuming from [^ ]+ \(epoch [0-9]+, step [0-9]+\)' "$work/logs/resume.log" | head -n 1)
[ -n "$resumed" ] || failed "the resumed run did not say where it resumed from (log: $work/logs/resume.log)"
passed "[3/4] SIGTERM: exit status $status, last.ckpt saved at step $saved_step; ${resumed/$stopped\//}, finished at step $((saved_step + 10))"

# ---- 4. no GPU: what a GPU request says
gpu_request=$(run_image --rm --device nvidia.com/gpu=all "$image" true 2>&1 | tail -n 5 || true)
[ "$(wc -l <<< "$gpu_request")" = 1 ] || failed "the GPU request said more than one line: $gpu_request"
gpu_training=$(run_image --rm "$image" python -m asr.train conf=synth_iclustered trainer.accelerator=gpu 2>&1 >/dev/null || true)
[ "$(wc -l <<< "$gpu_training")" = 1 ] || failed "trainer.accelerator=gpu without a GPU said more than one line: $gpu_training"
passed "[4/4] no GPU: podman --device nvidia.com/gpu=all: '$gpu_request'; asr.train trainer.accelerator=gpu: '$gpu_training'"
echo "check_image.sh: all checks passed in $(seconds_since "$started")"
