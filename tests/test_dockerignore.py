""".dockerignore, parsed by Docker's documented rules: last match wins, `**` spans folders, a match
on a folder excludes everything in it. The image's build context keeps every source file the
install needs and nothing heavy or built on the host."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    for package in ("asr", "attention_ext", "recipes", "conf", "docker"):
        needed += [path for path in (ROOT / package).rglob("*") if path.is_file()
                   and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so")
                   and path.name != "_C.build-hash"]   # install.sh's record of a host build
    assert len(needed) > 50
    dropped = [str(path.relative_to(ROOT)) for path in needed
               if dockerignore_excludes(ignore_patterns, path.relative_to(ROOT).as_posix())]
    assert not dropped


def test_every_file_the_dockerfile_copies_from_the_context_is_in_it(ignore_patterns):
    copies = [line.split()[1:-1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from=" not in line]
    sources = [source for words in copies for source in words if source != "."]
    assert ".ci/install.sh" in sources and "docker/cuda_home.sh" in sources
    for source in sources:
        assert (ROOT / source).is_file(), source
        assert not dockerignore_excludes(ignore_patterns, source), source
