"""The CUDA sources keep to what a CUDA graph can hold, read from the source text (CPU, in CI).

tests/attention_ext/test_cuda_graphs.py checks the behaviour on a GPU; this catches, on any
machine, the three ways a kernel file breaks it: a launch on another stream than the current
one, memory that bypasses torch's caching allocator (or a copy or wait that blocks the host),
and a host read of a device value outside the value checks that attention_ext.set_input_validation
turns off (common/value_checks.h).
"""
import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "attention_ext" / "csrc"
CUDA_SOURCES = sorted([*CSRC.rglob("*.cu"), *CSRC.rglob("*.cuh")])
# Calls that allocate outside torch's allocator or block the host until the device is done.
FORBIDDEN = ("cudaMalloc", "cudaFree", "cudaMemcpy(", "cudaDeviceSynchronize", "cudaStreamSynchronize",
             "cudaEventSynchronize", "cudaStreamCreate", "getDefaultCUDAStream")
# How a device value reaches the host: allowed only under a value check (see below).
HOST_READS = (".item<", ".item()", ".cpu()", "at::kCPU", ".tolist(")


def code_of(source: Path) -> str:
    """The source without comments, so that a comment naming a call does not count."""
    text = re.sub(r"/\*.*?\*/", "", source.read_text(), flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def top_level_arguments(text: str) -> list[str]:
    """`text` split at the commas outside any parentheses or brackets."""
    arguments, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            arguments.append(current.strip())
            current = ""
        else:
            current += char
    return arguments + [current.strip()]


def test_there_are_cuda_sources():
    assert len([s for s in CUDA_SOURCES if s.suffix == ".cu"]) >= 4


@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda path: path.name)
def test_every_launch_runs_on_the_current_stream(source):
    """Every <<<grid, block, shared, stream>>> names stream() (c10's current stream, cuda_common.cuh)."""
    launches = re.findall(r"<<<(.*?)>>>", code_of(source), flags=re.S)
    for launch in launches:
        arguments = top_level_arguments(launch)
        assert len(arguments) == 4 and arguments[3] == "stream()", f"{source.name}: <<<{launch}>>>"


@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda path: path.name)
def test_no_allocation_or_wait_outside_torch(source):
    code = code_of(source)
    assert [call for call in FORBIDDEN if call in code] == [], source.name


@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda path: path.name)
def test_host_reads_only_of_host_tensors_or_under_the_value_checks(source):
    """A device value is read on the host only inside `if (...device_value_checks()...)` (off with
    set_input_validation(False)); `to(at::kCPU)` only in the branch for inputs that are host tensors
    already (lsh_hash's, whose condition asks `is_cuda()`)."""
    lines = code_of(source).splitlines()
    for number, line in enumerate(lines):
        if not any(read in line for read in HOST_READS):
            continue
        before = "\n".join(lines[max(0, number - 12):number])
        guarded = "device_value_checks()" in before or re.search(r"is_cuda\(\).*\n(.*\n)*\s*} else {", before)
        assert guarded, f"{source.name}:{number + 1}: {line.strip()}"
