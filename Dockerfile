# syntax=docker/dockerfile:1
# GPU training image, built from Debian packages and PyPI alone: a Debian bookworm base, torch
# 2.13.0 from PyPI (its CUDA 13.0 wheels carry the CUDA runtime libraries), NVIDIA's compiler
# wheels (nvcc, from PyPI) in a build stage that compiles attention_ext for Ampere (sm_80, sm_86),
# Hopper (sm_90) and Blackwell (sm_100) plus PTX for later GPUs, and a runtime stage without nvcc.
#
#   docker build -t clustered-asr .
#   docker run --gpus all --shm-size=16g -v /path/to/wsj:/data/wsj -v $PWD/runs:/runs \
#       clustered-asr python -m asr.train conf=wsj_iclustered data.root=/data/wsj trainer.devices=4
#
# Without a Docker daemon (buildah, a debootstrapped base): docker/build_here.sh.
# CUDA 13 needs an NVIDIA driver >= 580 on the host. Build arguments (asr/docs/install.md):
#   BASE_IMAGE      any Debian or Ubuntu image; e.g. nvidia/cuda:13.0.2-devel-ubuntu24.04 for
#                   NVIDIA's (the CUDA of the image is not used: nvcc comes from CUDA_COMPILER)
#   TORCH_SPEC, TORCH_INDEX_URL   the torch, as .ci/install.sh reads them
#   CUDA_COMPILER   the pip requirement of nvcc's wheels, the same CUDA release as torch's
#                   (torch 2.13.0 requires cuda-toolkit==13.0.3); empty: a CPU build, e.g.
#   --build-arg TORCH_SPEC=torch==2.13.0+cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu --build-arg CUDA_COMPILER=
ARG BASE_IMAGE=debian:bookworm

# ---- build: torch, the project's Python packages, the extension compiled with nvcc ---------------
FROM ${BASE_IMAGE} AS build
ARG DEBIAN_FRONTEND=noninteractive
# Not version-pinned: the base image fixes the Debian release, its updates are security fixes.
# hadolint ignore=DL3008
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv python3-dev g++ ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
# A venv: Debian's and Ubuntu's system Python refuse pip installs (PEP 668).
RUN python3 -m venv "$VIRTUAL_ENV"

# setup.py decides on torch.version.cuda, not on a visible GPU (there is none during a build);
# TORCH_CUDA_ARCH_LIST tells nvcc the targets, ATTENTION_EXT_CPU_ARCH replaces -march=native
# (the build machine is not the one that runs the image; x86-64-v3 = AVX2).
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=""
ARG CUDA_COMPILER="cuda-toolkit[nvcc,cccl]==13.0.3"
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0;10.0+PTX"
ARG ATTENTION_EXT_CPU_ARCH=x86-64-v3
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    ATTENTION_EXT_CPU_ARCH=${ATTENTION_EXT_CPU_ARCH}

WORKDIR /opt/clustered-asr
# The same script as README and CI (.ci/install.sh). Torch first, from the script alone, so that
# its layer stays cached when only the code changes; a CUDA_COMPILER build refuses a CPU torch.
# The Debian packages of the recipes go to the runtime stage only (SKIP_APT=1 here).
COPY .ci/install.sh .ci/install.sh
RUN --mount=type=cache,target=/root/.cache/pip \
    REQUIRE_CUDA_TORCH=$([ -n "$CUDA_COMPILER" ] && echo 1 || echo 0) \
    INSTALL_PROJECT=0 SKIP_APT=1 TORCH_SPEC="$TORCH_SPEC" TORCH_INDEX_URL="$TORCH_INDEX_URL" \
    bash .ci/install.sh

# nvcc from PyPI, into the venv beside torch's CUDA wheels; their folder is the CUDA_HOME
# (docker/cuda_home.sh says how).
COPY docker/cuda_home.sh docker/cuda_home.sh
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -n "$CUDA_COMPILER" ]; then bash docker/cuda_home.sh install "$CUDA_COMPILER"; fi

COPY . .
# Then the project, its Python dependencies and the extension; the compiler wheels are removed
# afterwards, so the venv the runtime stage copies has no nvcc.
RUN --mount=type=cache,target=/root/.cache/pip \
    CUDA_HOME=$(bash docker/cuda_home.sh path) SKIP_APT=1 bash .ci/install.sh \
 && bash docker/cuda_home.sh remove \
 && rm -rf build/temp* build/lib* \
 && python -m compileall -q asr attention_ext recipes

# ---- runtime: Python, the recipes' Debian packages, the venv and the built project ---------------
FROM ${BASE_IMAGE} AS runtime
ARG DEBIAN_FRONTEND=noninteractive
# tini is PID 1 so that `docker stop` (SIGTERM) reaches the trainer and DataLoader workers are
# reaped; g++ and python3-dev stay for torch.compile (inductor's CPU code is C++) and Triton (it
# compiles a small C launcher when first used), and for the kernel tests that build the extension
# (no nvcc: the CUDA code is compiled ahead of time, PTX for newer GPUs is the driver's to JIT).
# hadolint ignore=DL3008
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-dev g++ libgomp1 tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
WORKDIR /opt/clustered-asr
# The recipes' Debian packages (espeak-ng, sox, ffmpeg, ...) by the same script; it finds torch
# installed and keeps it.
COPY .ci/install.sh .ci/install.sh
RUN INSTALL_PROJECT=0 bash .ci/install.sh \
 && rm -rf /var/lib/apt/lists/* build
COPY --from=build /opt/clustered-asr /opt/clustered-asr

# A non-root user; the code stays root-owned (read-only to it). Runs and data are volumes, and
# the relative defaults point into them: run_root=runs -> /runs, data.root=data/<corpus> ->
# /data/<corpus> (the built-in synth corpus is generated into /data/synth on first use).
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
 && useradd --create-home --uid 1000 --shell /bin/bash asr \
 && mkdir -p /data /runs && chown asr:asr /data /runs \
 && ln -sT /runs runs && ln -sT /data data
VOLUME ["/data", "/runs"]
# `docker run --user UID:GID` runs as a user without a home (Docker's HOME is then /): the caches
# under HOME (Triton's ~/.triton, lhotse's ~/.lhotse, torch's ~/.cache) and matplotlib's config go to /tmp.
ENV HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
# Numeric, so that a runtime can verify it is not root (e.g. Kubernetes' runAsNonRoot).
USER 1000:1000

ENTRYPOINT ["/usr/bin/tini", "--"]
# The demo (synthetic corpus, i-clustered preset); any command replaces it, e.g.
# `python -m asr.train conf=wsj_iclustered data.root=/data/wsj trainer.devices=4`.
CMD ["python", "-m", "asr.train"]
