#!/usr/bin/env bash
# Installs everything this project needs on a fresh machine, and builds the
# attention_ext extension. README, CI and the Docker image all run this script.
#
#   TORCH_SPEC   the torch to install when none is installed (default torch==2.13.0,
#                the CPU build on the development machines). An installed torch is
#                kept and pinned, so pip never swaps it for another build.
#   SKIP_APT=1   do not install Debian packages (for images that have them already)
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
  python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  installed_torch=$(python -c "import torch; print(torch.__version__)")
fi
constraints=$(mktemp)
echo "torch==${installed_torch}" > "$constraints"

# The project, its Python dependencies, and the compiled extension. No build
# isolation: the extension compiles against the torch installed above.
python -m pip install -q -c "$constraints" setuptools wheel ninja
python -m pip install -q -c "$constraints" --no-build-isolation -e ".[asr,test]"
rm -f "$constraints"
python -c "import attention_ext._C, torch; print('install.sh: attention_ext built for torch', torch.__version__)"
