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
#
# It prints one line per step (Debian packages, torch, Python packages, the extension), each with
# the seconds it took, and the total at the end. A second
# run with nothing changed takes seconds: pip is skipped while pyproject.toml, torch and the Python
# environment are those of the last successful install and every requirement is still satisfied;
# the extension build is skipped while its sources, setup.py, torch and the build settings hash to
# the value stored beside the built library (attention_ext/_C.build-hash).
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)
say() { echo "install.sh: $*"; }
# Each step's line ends with its duration: a step that takes a while prints its line when it
# starts (say_begin, no newline) and the outcome and seconds when done (say_done).
now() { date +%s.%N; }
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f s", end - start }'; }
install_started=$(now)
step_started=$install_started
step() { step_started=$(now); }
say_step() { say "$* ($(seconds_since "$step_started"))"; }
say_begin() { printf 'install.sh: %s ... ' "$*"; }
say_done() { echo "$* ($(seconds_since "$step_started"))"; }
# A failure message starts on a line of its own, after a say_begin's unfinished one.
fail() { echo; echo "install.sh: $*" >&2; exit 1; }
# pip's and apt's own output goes to a log (a local index's warnings would otherwise break the
# one line per step); on failure its end is printed and the step stops the install.
state_dir=build/install-state      # the logs, and what the last successful install was made from
mkdir -p "$state_dir"
quietly() {
  local log="$state_dir/$1.log"; shift
  if ! "$@" >"$log" 2>&1; then
    echo; tail -n 30 "$log" >&2
    echo "install.sh: '$*' failed; its whole output is in $log" >&2
    exit 1
  fi
}

# A short fingerprint of files and strings (file names included, so a renamed source counts).
fingerprint() {
  local item
  for item in "$@"; do
    if [ -f "$item" ]; then printf '%s\n' "$item"; cat "$item"; else printf '%s\n' "$item"; fi
  done | sha256sum | cut -c1-16
}

# ---- 1. Debian packages: espeak-ng and flite synthesise the built-in corpus, sox resamples,
# ffmpeg decodes shorten-compressed NIST SPHERE audio (WSJ's .wv1 files); wordnet-base holds the
# WordNet 3.0 the shipped sentence list was built from (a test rebuilds it identically);
# festival and its three US English voices speak the synthetic corpus's optional extra voices
# (python -m recipes.synth.prepare --extra-voices festival); asterisk-core-sounds-en-g722 (Allison
# Smith's recorded prompts, G.722) and asterisk-core-sounds-en (their transcripts) are the
# real-speech test set of recipes/asterisk (about 11 MB).
apt_packages=(espeak-ng flite sox ffmpeg wordnet-base festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts
              asterisk-core-sounds-en-g722 asterisk-core-sounds-en)
missing=()
for package in "${apt_packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${SKIP_APT:-0}" = "1" ]; then
  say_step "[1/4] Debian packages: skipped (SKIP_APT=1)${missing[*]:+; not installed: ${missing[*]}}"
elif [ ${#missing[@]} -eq 0 ]; then
  say_step "[1/4] Debian packages: ${apt_packages[*]} already installed"
else
  if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo"; fi
  say_begin "[1/4] Debian packages: installing ${missing[*]} with apt-get (a minute or two)"
  quietly apt-get-update $SUDO apt-get update -qq
  quietly apt-get-install $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  say_done "installed"
fi

# ---- 2. torch: keep the installed one, or install the pinned one; pin it for every later step.
# NumPy comes with it: torch imports it if present, and importing torch without it (the extension
# build does) prints "Failed to initialize NumPy".
# One python start that imports torch (seconds on its own): torch, its CUDA, the environment, Python.
# The pin (last line) is the distribution's version, which pip compares: PyPI's CUDA torch calls
# itself 2.13.0+cu130 (torch.__version__) but is the distribution 2.13.0, so a pin of
# torch==2.13.0+cu130 would match nothing and pip would find the project's requirements impossible.
torch_probe='import sys, torch, importlib.metadata as metadata; print(torch.__version__, torch.version.cuda or "", sys.prefix, sys.version.split()[0], metadata.version("torch"), sep="\n")'
probe_torch() {
  local facts
  facts=$(python -c "$torch_probe" 2>/dev/null) || facts=""
  installed_torch=$(sed -n 1p <<<"$facts"); torch_cuda=$(sed -n 2p <<<"$facts")
  python_prefix=$(sed -n 3p <<<"$facts"); python_version=$(sed -n 4p <<<"$facts")
  torch_distribution=$(sed -n 5p <<<"$facts")
}
# "CUDA 13.0" or "a CPU build", for the step lines
torch_kind() { if [ -n "${torch_cuda:-}" ]; then echo "CUDA $torch_cuda"; else echo "a CPU build"; fi; }
step
probe_torch
if [ -z "${installed_torch:-}" ]; then
  torch_spec="${TORCH_SPEC:-torch==2.13.0}"
  index_args=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then index_args=(--index-url "$TORCH_INDEX_URL"); fi
  say_begin "[2/4] torch: installing $torch_spec${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} and numpy (a large download: minutes)"
  # ${a[@]+"${a[@]}"}: an empty array expands to nothing, also under set -u in older bash
  quietly pip-torch python -m pip install -q ${index_args[@]+"${index_args[@]}"} "$torch_spec" numpy
  probe_torch
  if [ -z "${installed_torch:-}" ]; then
    fail "torch does not import after installing $torch_spec (pip's output: $state_dir/pip-torch.log)"
  fi
  say_done "installed $installed_torch ($(torch_kind))"
else
  say_step "[2/4] torch: keeping the installed $installed_torch ($(torch_kind))"
fi
if [ "${REQUIRE_CUDA_TORCH:-0}" = "1" ] && [ -z "${torch_cuda:-}" ]; then
  echo "install.sh: REQUIRE_CUDA_TORCH=1 but torch $installed_torch is a CPU build; set TORCH_SPEC" \
       "(and TORCH_INDEX_URL) to a CUDA build, e.g. TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130" >&2
  exit 1
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==${torch_distribution:-$installed_torch}" > "$constraints"
# Triton (the test extra's): a CUDA torch requires its own build of it; beside a CPU torch, where only its
# interpreter runs (the tests of attention_ext/attentions/clustered_triton), the version those tests pass with (3.6's
# interpreter fails on loops with run-time bounds under NumPy 2.4). Triton depends on nothing, torch included.
triton_pin=()
if [ -z "${torch_cuda:-}" ]; then triton_pin=(triton==3.8.0); fi
if ! python -c "import numpy" >/dev/null 2>&1; then
  step
  say_begin "[2/4] torch: installing numpy (torch uses it; the extension build imports torch)"
  quietly pip-numpy python -m pip install -q -c "$constraints" numpy
  say_done "installed"
fi
if [ "${INSTALL_PROJECT:-1}" = "0" ]; then
  say "done in $(seconds_since "$install_started")"
  exit 0
fi

# ---- 3. Python packages: the project (editable) and its dependencies. No build isolation:
# the extension compiles against the torch installed above. pip builds the extension too.
# Skipped while the inputs are those of the last successful install and the environment still
# satisfies them (the project installed from this checkout, every requirement present).
packages_key=$(fingerprint pyproject.toml "torch $installed_torch" "python $python_prefix" ${triton_pin[@]+"${triton_pin[@]}"})
verify_packages='
import importlib.metadata as metadata, json, os, sys, urllib.parse
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
try:
    dist = metadata.distribution("clustered-asr")
except metadata.PackageNotFoundError:
    sys.exit("the project is not installed")
url = json.loads(dist.read_text("direct_url.json") or "{}")
where = urllib.parse.unquote(urllib.parse.urlparse(url.get("url", "")).path)
if not url.get("dir_info", {}).get("editable") or os.path.realpath(where) != os.path.realpath(sys.argv[1]):
    source = url.get("url", "an unknown place")
    sys.exit(f"the project is installed from {source}, not from this checkout")
for text in dist.requires or []:
    requirement = Requirement(text)
    if requirement.marker and not any(requirement.marker.evaluate({"extra": extra}) for extra in ("", "asr", "benchmarks", "test")):
        continue
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        sys.exit(f"{requirement.name} is missing")
    if not requirement.specifier.contains(version, prereleases=True):
        sys.exit(f"{requirement.name} {version} does not satisfy {requirement}")
'
extension_built_by_pip=0
step
if [ "$(cat "$state_dir/python-packages" 2>/dev/null)" = "$packages_key" ] \
   && why=$(python -c "$verify_packages" "$checkout" 2>&1); then
  say_step "[3/4] Python packages: up to date (pyproject.toml, torch and the environment unchanged; requirements satisfied)"
else
  say_begin "[3/4] Python packages: pip install -e \".[asr,benchmarks,test]\" (downloads what is missing; builds attention_ext: minutes)"
  rm -f "$state_dir/python-packages"
  # --root-user-action=ignore: as root (CI, Docker) pip would warn mid-line, cutting the step line in two
  quietly pip-build-tools python -m pip install -q --root-user-action=ignore -c "$constraints" setuptools wheel ninja
  quietly pip-project python -m pip install -q --root-user-action=ignore -c "$constraints" --no-build-isolation \
    ${triton_pin[@]+"${triton_pin[@]}"} -e ".[asr,benchmarks,test]"
  echo "$packages_key" > "$state_dir/python-packages"
  extension_built_by_pip=1
  say_done "installed"
fi

# ---- 4. The extension attention_ext._C, rebuilt in place when its sources, setup.py, torch or
# the build settings changed since the build recorded in attention_ext/_C.build-hash.
extension_key=$(fingerprint setup.py $(find attention_ext/csrc -type f 2>/dev/null | LC_ALL=C sort) \
  "torch $installed_torch $python_prefix" "python $python_version" \
  "ATTENTION_EXT_CPU_ARCH=${ATTENTION_EXT_CPU_ARCH:-} ATTENTION_EXT_DEBUG=${ATTENTION_EXT_DEBUG:-}" \
  "ATTENTION_EXT_CUDA=${ATTENTION_EXT_CUDA:-} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-}")
extension_hash_file=attention_ext/_C.build-hash
check_extension='import attention_ext._C, torch; print(torch.__version__)'
step
if [ "$extension_built_by_pip" = "1" ]; then
  echo "$extension_key" > "$extension_hash_file"
  say_step "[4/4] attention_ext: built by pip above for torch $(python -c "$check_extension")"
elif [ "$(cat "$extension_hash_file" 2>/dev/null)" = "$extension_key" ] \
     && compgen -G "attention_ext/_C*.so" >/dev/null; then
  say_step "[4/4] attention_ext: up to date (sources, setup.py and torch unchanged since its build)"
else
  say_begin "[4/4] attention_ext: compiling the extension (csrc/ or its settings changed; about 2 minutes on 2 cores)"
  rm -f "$extension_hash_file"
  build_log="$state_dir/extension-build.log"
  if ! python setup.py build_ext --inplace >"$build_log" 2>&1; then
    echo
    tail -n 40 "$build_log" >&2
    echo "install.sh: the extension build failed; the whole log is in $build_log" >&2
    exit 1
  fi
  echo "$extension_key" > "$extension_hash_file"
  say_done "built for torch $(python -c "$check_extension")"
fi
say "done in $(seconds_since "$install_started")"
