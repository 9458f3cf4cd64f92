""".ci/install.sh, the one install of README, CI and the Docker image, run for real against stub
`python`, `dpkg`, `apt-get`, `sudo` and `id` commands that record what it asks for.

(Moved from tests/test_docker.py, which checks the image's recipe.)
"""
from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
        print(torch["version"], torch["cuda"], "/stub/prefix", "3.11.0", torch.get("distribution", torch["version"]),
              sep="\n")
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
    assert project and project[0]["pip"][-1] == ".[asr,benchmarks,test]" and "--no-build-isolation" in project[0]["pip"]
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


def test_install_script_pins_the_distribution_version_not_torch_version(install_sandbox):
    # PyPI's CUDA torch: torch.__version__ is 2.13.0+cu130, the distribution pip knows is 2.13.0
    result, entries = install_sandbox(torch={"version": "2.13.0+cu130", "cuda": "13.0", "distribution": "2.13.0"})
    assert result.returncode == 0, result.stderr
    assert {call["constraints"] for call in pip_calls(entries)} == {"torch==2.13.0"}
    assert "keeping the installed 2.13.0+cu130 (CUDA 13.0) (" in result.stdout


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
