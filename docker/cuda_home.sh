#!/usr/bin/env bash
# The CUDA compiler of the image's build stage, from NVIDIA's PyPI wheels (no CUDA base image).
#
#   cuda_home.sh install REQUIREMENT   pip-installs REQUIREMENT (e.g. "cuda-toolkit[nvcc,cccl]==13.0.3",
#                                      the CUDA release torch was built with) into the venv, torch
#                                      pinned, and makes the wheels' folder a CUDA_HOME
#   cuda_home.sh path                  prints that CUDA_HOME; nothing if there is no nvcc there
#   cuda_home.sh remove                uninstalls the compiler wheels again (the runtime has no nvcc)
#
# NVIDIA's CUDA 13 wheels unpack into site-packages/nvidia/cu<major> (bin/nvcc, include/, lib/),
# the same folder as the runtime and library wheels torch depends on, so their headers are there
# too. torch's extension builder links -lcudart from $CUDA_HOME/lib64; the wheels have lib/ and
# libcudart.so.<major> only, hence the two links.
set -euo pipefail
compiler_wheels=(nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt nvidia-cuda-cccl)

cuda_home() {
  python - <<'PY'
import os, torch
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
major = (torch.version.cuda or "").split(".")[0]
for folder in nvidia.__path__:
    home = os.path.join(folder, f"cu{major}")
    if major and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        print(home)
        break
PY
}

case "${1:-}" in
  install)
    requirement=${2:?"cuda_home.sh install: give the compiler's pip requirement, e.g. 'cuda-toolkit[nvcc,cccl]==13.0.3'"}
    pin=$(mktemp)
    python -c 'import torch; print("torch==" + torch.__version__)' > "$pin"
    python -m pip install -q --root-user-action=ignore -c "$pin" "$requirement"
    rm -f "$pin"
    home=$(cuda_home)
    if [ -z "$home" ]; then
      echo "cuda_home.sh: no nvcc for torch's CUDA $(python -c 'import torch; print(torch.version.cuda)') after installing $requirement;" \
           "give the cuda-toolkit release torch requires (pip show torch)" >&2
      exit 1
    fi
    ln -sfn lib "$home/lib64"
    major=$(python -c 'import torch; print(torch.version.cuda.split(".")[0])')
    ln -sf "libcudart.so.$major" "$home/lib/libcudart.so"
    echo "cuda_home.sh: $("$home/bin/nvcc" --version | tail -n 2 | head -n 1) in $home"
    ;;
  path)
    cuda_home
    ;;
  remove)
    home=$(cuda_home)
    if [ -n "$home" ]; then
      python -m pip uninstall -q -y --root-user-action=ignore "${compiler_wheels[@]}"
      rm -f "$home/lib64" "$home/lib/libcudart.so"
    fi
    ;;
  *)
    echo "usage: cuda_home.sh install REQUIREMENT | path | remove" >&2
    exit 2
    ;;
esac
