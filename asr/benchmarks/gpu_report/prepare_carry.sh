#!/usr/bin/env bash
# Prepares, on a development machine with internet access to PyPI and espeak-ng installed, what a
# GPU machine without either needs for `python -m asr.benchmarks.gpu_report`:
#   .whl/     wheels (Python 3.12, manylinux x86-64) of the packages the GPU image lacks; the image
#             has torch, lightning, sentencepiece, triton, pytest, numpy, pyyaml, click, tabulate,
#             toolz, sortedcontainers (its package list, 2026-11); versions as this project installs them
#   .corpus/  a small built-in synthetic corpus (200 / 30 / 30 utterances) for the training parts
# Both folders are ignored by git (.git/info/exclude), so only a carry brings them along.
#
# On the GPU machine, from the repository root, with .whl and .corpus carried:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#       && export PYTHONPATH=/tmp/site
#   TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=12 python3 setup.py build_ext --inplace
#   python3 -m asr.benchmarks.gpu_report --corpus .corpus --out "$OUT/gpu_report"
set -euo pipefail
cd "$(dirname "$0")/../../.."
packages=(hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 jiwer==4.0.0 rapidfuzz==3.14.6
          lhotse==1.33.0 audioread==3.1.0 cytoolz==1.2.0 intervaltree==3.2.1 lilcom==1.8.2
          soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 flashlight-text==0.0.7 kaldi-native-fbank)
exclude=$(git rev-parse --git-path info/exclude)   # .git/info/exclude, also in a worktree
mkdir -p "$(dirname "$exclude")"
for folder in .whl .corpus; do
  grep -qx "/$folder/" "$exclude" 2>/dev/null || echo "/$folder/" >> "$exclude"
done
mkdir -p .whl
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
           manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
for package in "${packages[@]}"; do
  # antlr4's runtime 4.9.3 is a source distribution only: build its (pure Python) wheel here
  if [[ $package == antlr4-python3-runtime* ]]; then
    python3 -m pip wheel -q --no-deps -w .whl "$package"
  else
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .whl "$package"
  fi
done
echo "prepare_carry: $(ls .whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1))"
if [ ! -f .corpus/synth_cuts_train.jsonl.gz ]; then
  python3 -m recipes.synth.prepare --out .corpus --train 200 --dev 30 --test 30
fi
echo "prepare_carry: corpus in .corpus ($(du -sh .corpus | cut -f1)); carry .whl and .corpus"
