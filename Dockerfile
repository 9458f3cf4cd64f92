# syntax=docker/dockerfile:1
# GPU training image: CUDA 13.0 toolkit (nvcc builds the extension), torch 2.13.0 built for
# CUDA 13.0, the recipes' Debian packages, this project with attention_ext compiled for
# Ampere (sm_80, sm_86), Hopper (sm_90) and Blackwell (sm_100) plus PTX for later GPUs.
#
#   docker build -t clustered-asr .
#   docker run --gpus all --shm-size=16g -v /path/to/wsj:/data/wsj -v $PWD/runs:/runs \
#       clustered-asr python -m asr.train conf=wsj_iclustered data.root=/data/wsj trainer.devices=4
#
# The pairing: torch==2.13.0 as published on PyPI for Linux x86_64 is the CUDA 13.0 build (it
# requires cuda-toolkit==13.0.3), so the base is the CUDA 13.0 *devel* image: its nvcc has the
# same major.minor as torch.version.cuda, which torch's extension builder checks (a different
# major stops the build). CUDA 13 needs an NVIDIA driver >= 580 on the host. For an older driver
# build a CUDA 12.8 pair instead, e.g.
#   --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04 \
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# (if that index carries the wanted torch). A CPU torch stops the build (REQUIRE_CUDA_TORCH), and
# so does a torch whose CUDA major version differs from nvcc's (torch's extension builder).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

# Python (3.12 on Ubuntu 24.04) in a venv: Ubuntu's system Python refuses pip installs
# (PEP 668). python3-dev and g++ build the extension; tini is PID 1 so that `docker stop`
# reaches the trainer and DataLoader workers are reaped.
ARG DEBIAN_FRONTEND=noninteractive
# Not version-pinned: the base image tag fixes the Ubuntu release, its updates are security fixes.
# hadolint ignore=DL3008
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends \
        python3 python3-venv python3-dev g++ tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
RUN python3 -m venv "$VIRTUAL_ENV"

# Which torch, and what the extension is compiled for. setup.py decides on torch.version.cuda,
# not on a visible GPU (there is none during `docker build`); TORCH_CUDA_ARCH_LIST tells nvcc
# the targets, ATTENTION_EXT_CPU_ARCH replaces -march=native (the build machine is not the one
# that runs the image; x86-64-v3 = AVX2, every current data-centre x86 CPU has it).
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=""
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0;10.0+PTX"
ARG ATTENTION_EXT_CPU_ARCH=x86-64-v3
ENV CUDA_HOME=/usr/local/cuda \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    ATTENTION_EXT_CPU_ARCH=${ATTENTION_EXT_CPU_ARCH}

WORKDIR /opt/clustered-asr

# The same script as README and CI (.ci/install.sh), in two steps so that the heavy layers
# (Debian packages, torch with its CUDA libraries) stay cached when only the code changes:
# first the packages and torch, from the script alone; then, with the source, the project,
# its Python dependencies and the extension (the packages are found installed, torch is kept).
COPY .ci/install.sh .ci/install.sh
RUN --mount=type=cache,target=/root/.cache/pip \
    INSTALL_PROJECT=0 REQUIRE_CUDA_TORCH=1 TORCH_SPEC="$TORCH_SPEC" TORCH_INDEX_URL="$TORCH_INDEX_URL" \
    bash .ci/install.sh \
 && rm -rf /var/lib/apt/lists/*

COPY . .
RUN --mount=type=cache,target=/root/.cache/pip \
    bash .ci/install.sh \
 && python -m compileall -q asr attention_ext recipes

# A non-root user; the code stays root-owned (read-only to it). Runs and data are volumes, and
# the relative defaults point into them: run_root=runs -> /runs, data.root=data/<corpus> ->
# /data/<corpus> (the built-in synth corpus is generated into /data/synth on first use).
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
 && useradd --create-home --uid 1000 --shell /bin/bash asr \
 && mkdir -p /data /runs && chown asr:asr /data /runs \
 && ln -sT /runs runs && ln -sT /data data
VOLUME ["/data", "/runs"]
# Matplotlib wants a writable config folder; `docker run --user UID:GID` may have no home.
ENV MPLCONFIGDIR=/tmp/matplotlib
# Numeric, so that a runtime can verify it is not root (e.g. Kubernetes' runAsNonRoot).
USER 1000:1000

ENTRYPOINT ["/usr/bin/tini", "--"]
# The demo (synthetic corpus, i-clustered preset); any command replaces it, e.g.
# `python -m asr.train conf=wsj_iclustered data.root=/data/wsj trainer.devices=4`.
CMD ["python", "-m", "asr.train"]
