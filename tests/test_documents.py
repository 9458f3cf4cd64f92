"""The documents hold together: every relative link of a tracked Markdown file reaches a file, a
folder or a heading that exists, and every package's code map names every module it has.

Links: `[text](path)`, `[text](path#anchor)` and `[text](#anchor)`, outside code spans and fenced
blocks; web addresses are not followed. An anchor must be the anchor GitHub gives one of the
target file's headings: the heading's text without its Markdown, lowercased, every character
that is not a letter, digit, space, `-` or `_` removed, each space made a `-`, and `-1`, `-2`, ...
added to repeats.

Code maps: each package's README has a section "## Code map" that names, in backticks and relative
to the package folder, every module (`train.py`, `data/manifests.py`) or the folder that holds it
(`benchmarks/`). Every `.py` file of the package except `__init__.py` and `__main__.py` must be
named by its path or by one of its folders, and every path the map names must exist. Moving a
module means editing its package's map, nothing here.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_MAPS = {"asr": "asr/README.md", "attention_ext": "attention_ext/README.md", "recipes": "recipes/README.md"}
CODE_MAP_HEADING = "Code map"
TEST_COMMAND = "bash .ci/install.sh && python -m pytest -q"
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def tracked_markdown() -> list[Path]:
    """The Markdown files git tracks (outputs of runs, e.g. a matrix.md under runs/, are not)."""
    try:
        listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):   # a copy without git: the documented folders
        listed = [str(path.relative_to(ROOT)) for folder in ("asr", "attention_ext", "recipes")
                  for path in (ROOT / folder).rglob("*.md")] + ["README.md"]
    return sorted(ROOT / name for name in listed if (ROOT / name).is_file())


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def heading_text(raw: str) -> str:
    """A heading as GitHub renders it: links become their text, code and emphasis lose their marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return CODE_SPAN.sub(lambda match: match.group(2).strip(), text).replace("*", "")


def github_anchor(heading: str) -> str:
    kept = "".join(char for char in heading_text(heading).strip().lower()
                   if char.isalnum() or char in " -_")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match:
            anchor = github_anchor(match.group(2))
            repeat = seen.get(anchor, 0)
            seen[anchor] = repeat + 1
            found.add(anchor if repeat == 0 else f"{anchor}-{repeat}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link in the file's prose that is not a web address."""
    links = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(2)
            if target and not EXTERNAL.match(target):
                links.append((number, target))
    return links


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: ({target})"
        if not linked.exists():
            broken.append(f"{where}: {file_part} does not exist")
        elif anchor and linked.suffix != ".md":
            broken.append(f"{where}: an anchor into a file that is not Markdown")
        elif anchor and anchor not in anchors(linked):
            broken.append(f"{where}: {linked.relative_to(ROOT)} has no heading with anchor #{anchor}")
    return broken


def code_map(readme: Path) -> str:
    """The text of the README's "## Code map" section, up to the next heading of level 1 or 2."""
    section, inside = [], False
    for _, line in prose_lines(readme.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match and len(match.group(1)) <= 2:
            inside = match.group(2) == CODE_MAP_HEADING
        elif inside:
            section.append(line)
    return "\n".join(section)


def mapped_paths(package: str, text: str) -> set[str]:
    """Paths named in backticks in a map, relative to the package ('data/', 'train.py')."""
    paths = set()
    for match in CODE_SPAN.finditer(text):
        name = match.group(2).strip()
        if re.fullmatch(r"[\w./-]+", name) and (name.endswith(".py") or name.endswith("/")):
            paths.add(name.removeprefix(f"{package}/"))
    return paths


def package_modules(package: str) -> list[str]:
    return sorted(str(path.relative_to(ROOT / package)) for path in (ROOT / package).rglob("*.py")
                  if path.name not in ("__init__.py", "__main__.py") and "__pycache__" not in path.parts)


def test_the_markdown_files_are_found():
    names = {str(path.relative_to(ROOT)) for path in tracked_markdown()}
    assert {"README.md", *CODE_MAPS.values()} <= names


@pytest.mark.parametrize("path", tracked_markdown(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_heading(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("package", sorted(CODE_MAPS))
def test_the_code_map_names_every_module(package):
    named = mapped_paths(package, code_map(ROOT / CODE_MAPS[package]))
    assert named, f"{CODE_MAPS[package]} has no '## {CODE_MAP_HEADING}' section naming its modules"
    folders = {name for name in named if name.endswith("/")}
    missing = [module for module in package_modules(package)
               if module not in named and not any(module.startswith(folder) for folder in folders)]
    assert missing == [], f"{CODE_MAPS[package]}'s code map does not name these modules or their folders"


@pytest.mark.parametrize("package", sorted(CODE_MAPS))
def test_every_path_of_the_code_map_exists(package):
    named = mapped_paths(package, code_map(ROOT / CODE_MAPS[package]))
    assert sorted(name for name in named if not (ROOT / package / name).exists()) == []


def test_readme_is_the_front_door_with_the_ci_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert TEST_COMMAND in readme
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


# The checker itself, on cases whose answer is known.

@pytest.mark.parametrize("heading, anchor", [
    ("Evaluation with another attention: `python -m asr.evaluate`", "evaluation-with-another-attention-python--m-asrevaluate"),
    ("Words: lexicon and n-gram LM decoding (`asr/evaluation/decoding/`)", "words-lexicon-and-n-gram-lm-decoding-asrevaluationdecoding"),
    ("`clustered` and `iclustered`", "clustered-and-iclustered"),
    ("The [GPU](x.md): **status**", "the-gpu-status"),
    ("Scale: the data side from 10 h to 10,000 h", "scale-the-data-side-from-10-h-to-10000-h"),
])
def test_github_anchor(heading, anchor):
    assert github_anchor(heading) == anchor


def test_broken_links_are_found(tmp_path, monkeypatch):
    tmp_path = tmp_path.resolve()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "guide.md").write_text("# Guide\n\n## Two words\n\n## Two words\n")
    (tmp_path / "README.md").write_text(
        "# Top\n[ok](sub/guide.md#two-words) [repeat](sub/guide.md#two-words-1) [folder](sub/)\n"
        "[self](#top) [web](https://example.org/x.md) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n# not a heading\n```\n"
        "[gone](missing.md) [no heading](sub/guide.md#three) [not here](#not-a-heading)\n")
    assert broken_links(tmp_path / "README.md") == [
        "README.md:8: (missing.md): missing.md does not exist",
        "README.md:8: (sub/guide.md#three): sub/guide.md has no heading with anchor #three",
        "README.md:8: (#not-a-heading): README.md has no heading with anchor #not-a-heading"]


def test_a_code_map_counts_folders_and_paths():
    text = "| `train.py` | the command |\n| `data/` | corpora |\n| `asr/model/ctc.py`, `not a path`, `x=1` |"
    assert mapped_paths("asr", text) == {"train.py", "data/", "model/ctc.py"}


def test_code_names_no_issue_numbers():
    # A docstring or comment says what the code does and links the RESULTS file; issue numbers are
    # the history of the tracker, not of the code, and go stale.
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for package in ("asr", "attention_ext", "recipes") for path in sorted((ROOT / package).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bissues? [0-9]", line)]
    assert found == []
