#!/usr/bin/env bash
# Installs everything this project needs on a fresh machine, and builds the
# attention_ext extension. README, CI and the Docker image all run this script.
#
#   TORCH_SPEC       the torch to install when none is installed (default torch==2.13.0). On the
#                    development machines that resolves to their local 2.13.0+cpu wheel; from
#                    PyPI on Linux x86_64 it is the CUDA 13.0 build (the one the Dockerfile uses).
#                    An installed torch is kept and pinned, so pip never swaps it for another build.
#   TORCH_INDEX_URL  the package index to take that torch from (default: pip's own), e.g.
#                    https://download.pytorch.org/whl/cu130; used only when torch is installed here.
#   SKIP_APT=1       do not install Debian packages (for images that have them already;
#                    packages that are already installed are never installed again anyway)
#   REQUIRE_CUDA_TORCH=1  fail unless torch is a CUDA build (the GPU image must not quietly
#                    end up with a CPU torch and a CPU-only extension)
#   INSTALL_PROJECT=0  stop after the Debian packages and torch (the Dockerfile runs this first,
#                    before copying the source, so those heavy layers stay cached across code changes)
#
# The extension build reads ATTENTION_EXT_CPU_ARCH and TORCH_CUDA_ARCH_LIST (see setup.py);
# it needs nvcc for a CUDA torch but never a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: espeak-ng and flite synthesise the built-in corpus, sox resamples,
# ffmpeg decodes shorten-compressed NIST SPHERE audio (WSJ's .wv1 files).
apt_packages=(espeak-ng flite sox ffmpeg)
missing=()
for package in "${apt_packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${SKIP_APT:-0}" != "1" ] && [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo"; fi
  echo "install.sh: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# torch: keep the installed one, or install the pinned one; pin it for every later step.
installed_torch=$(python -c "import torch; print(torch.__version__)" 2>/dev/null || true)
if [ -z "$installed_torch" ]; then
  torch_spec="${TORCH_SPEC:-torch==2.13.0}"
  index_args=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then index_args=(--index-url "$TORCH_INDEX_URL"); fi
  echo "install.sh: installing $torch_spec${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
  # ${a[@]+"${a[@]}"}: an empty array expands to nothing, also under set -u in older bash
  python -m pip install -q ${index_args[@]+"${index_args[@]}"} "$torch_spec"
  installed_torch=$(python -c "import torch; print(torch.__version__)")
fi
torch_cuda=$(python -c "import torch; print(torch.version.cuda or '')")
echo "install.sh: torch $installed_torch (${torch_cuda:+CUDA $torch_cuda}${torch_cuda:-a CPU build})"
if [ "${REQUIRE_CUDA_TORCH:-0}" = "1" ] && [ -z "$torch_cuda" ]; then
  echo "install.sh: REQUIRE_CUDA_TORCH=1 but torch $installed_torch is a CPU build; set TORCH_SPEC" \
       "(and TORCH_INDEX_URL) to a CUDA build, e.g. TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130" >&2
  exit 1
fi
if [ "${INSTALL_PROJECT:-1}" = "0" ]; then
  exit 0
fi
constraints=$(mktemp)
echo "torch==${installed_torch}" > "$constraints"

# The project, its Python dependencies, and the compiled extension. No build
# isolation: the extension compiles against the torch installed above.
python -m pip install -q -c "$constraints" setuptools wheel ninja
python -m pip install -q -c "$constraints" --no-build-isolation -e ".[asr,test]"
rm -f "$constraints"
python -c "import attention_ext._C, torch; print('install.sh: attention_ext built for torch', torch.__version__)"
