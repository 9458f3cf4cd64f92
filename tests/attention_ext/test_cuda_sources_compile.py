"""The CUDA sources compile, also where torch is a CPU build (as in CI).

setup.py compiles the .cu files of attention_ext/csrc/<family>/ only against a CUDA torch, so on a
machine with a CPU torch a change to a .cu file or to a header it shares with the CPU code (its
family's checks.h, common/checks.h) would go unchecked until someone builds on a GPU machine. Where nvcc is installed, this compiles each
.cu file to an object file as torch's BuildExtension would: its nvcc flags
(cpp_extension.COMMON_NVCC_FLAGS, -std=c++20), setup.py's NVCC_FLAGS, torch's headers, for
Ampere (sm_80) and Hopper (sm_90). It asserts that nvcc succeeds and warns about none of our
files. Nothing runs on a GPU here: this checks the code compiles, not what it computes.

Skipped without nvcc, and with a CUDA torch (its install compiled these files already).
"""
import ast
import os
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "attention_ext" / "csrc"
CUDA_SOURCES = sorted(CSRC.rglob("*.cu"))
NVCC = shutil.which("nvcc")
ARCHITECTURES = ("80", "90")

pytestmark = [
    pytest.mark.skipif(not NVCC, reason="nvcc is not on PATH"),
    pytest.mark.skipif(torch.version.cuda is not None,
                       reason="torch is a CUDA build: the install compiled the .cu files itself"),
]


def setup_nvcc_flags() -> list[str]:
    """NVCC_FLAGS of setup.py, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NVCC_FLAGS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no NVCC_FLAGS = [...] literal")


def nvcc_command(source: Path, output: Path) -> list[str]:
    includes = cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    return [
        NVCC, *cpp_extension.COMMON_NVCC_FLAGS, "--compiler-options", "-fPIC", "-std=c++20",
        *setup_nvcc_flags(),
        # A CPU torch ships c10/cuda's headers but not the file CMake generates for them
        # (c10/cuda/impl/cuda_cmake_macros.h); its only macro matters on Windows.
        "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
        "-DWITH_CUDA", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
        *(f"-I{path}" for path in includes),
        *(f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in ARCHITECTURES),
        "-c", str(source), "-o", str(output)]


# Operators with no CUDA twin on purpose: the fused CPU kernels of the clustered attentions' dense
# part (centroid_attention/) and of i-clustered's top-key part (sparse_products/
# clustered_top_attention.cpp); on CUDA those parts run as torch products and the sparse products
# of sparse_product_cuda.cu (clustered.py, iclustered.py).
CPU_ONLY_OPERATORS = {"centroid_attention", "centroid_attention_backward", "centroid_attention_top",
                      "centroid_attention_top_backward", "clustered_top_attention",
                      "clustered_top_attention_backward"}
FAMILIES = sorted(path for path in CSRC.iterdir() if path.is_dir() and path.name != "common")


def operators(paths, pattern: str) -> set[str]:
    """The operator names `pattern` (a regex with one group) finds in the files `paths`."""
    return {name for path in paths for name in re.findall(pattern, path.read_text())}


def kernels(paths, dispatch_key: str) -> set[str]:
    """The operators the files register a kernel of for `dispatch_key` (CPU or CUDA)."""
    blocks = [block for path in paths for block in re.findall(
        r"TORCH_LIBRARY_IMPL\(attention_ext, " + dispatch_key + r", m\) \{(.*?)\n\}", path.read_text(), re.S)]
    return {name for block in blocks for name in re.findall(r'm\.impl\("(\w+)"', block)}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda path: path.name)
def test_a_family_folder_holds_the_cpu_and_cuda_kernels_of_its_operators(family):
    """Every operator a family defines has its CPU kernel, and its CUDA kernel unless it is CPU-only
    on purpose, in the family's own folder."""
    defined = operators(family.glob("*.cpp"), r'm\.def\("(\w+)\(')
    assert defined
    assert kernels(family.glob("*.cpp"), "CPU") == defined
    assert kernels(family.glob("*.cu"), "CUDA") == defined - CPU_ONLY_OPERATORS


@pytest.mark.parametrize("family", [path for path in FAMILIES if any(path.glob("*.cu"))], ids=lambda path: path.name)
def test_the_cpu_and_cuda_kernels_of_a_family_call_the_same_argument_checks(family):
    """Each operator's argument checks are written once, in the family's checks.h, and both its CPU
    and its CUDA entry call them (attention_ext_checks::check_<operator>)."""
    called = {".cpp": set(), ".cu": set()}   # the checks the CPU files call, the CUDA file
    for source in [*family.glob("*.cpp"), *family.glob("*.cu")]:
        text = source.read_text()
        assert '#include "checks.h"' in text, source.name
        called[source.suffix] |= set(re.findall(r"attention_ext_checks::(check_\w+)\(", text))
    shared = set(re.findall(r"inline \w+ (check_\w+)\(", (family / "checks.h").read_text()))
    assert called[".cu"] and called[".cu"] <= called[".cpp"] & shared


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{source name: (object file, nvcc's return code and output)}, all compiled at once on
    every core (about a minute each, mostly torch's headers)."""
    folder = tmp_path_factory.mktemp("cuda_objects")

    def compile_one(source):
        output = folder / f"{source.stem}.o"
        result = subprocess.run(nvcc_command(source, output), cwd=ROOT, capture_output=True, text=True,
                                timeout=900)
        return source.name, (output, result.returncode, result.stdout + result.stderr)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(pool.map(compile_one, CUDA_SOURCES))


@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda path: path.name)
def test_cuda_source_compiles_without_warnings(source, compiled):
    output, returncode, log = compiled[source.name]
    assert returncode == 0, f"nvcc failed on {source.name}:\n{log[-6000:]}"
    # nvcc and gcc name the file first ("attention_ext/csrc/x_cuda.cu(12): warning ..."); torch's
    # own headers live in site-packages and are not ours to fix
    ours = [line for line in log.splitlines() if "warning" in line.lower() and "attention_ext/csrc/" in line]
    assert not ours, f"nvcc warns about {source.name}:\n" + "\n".join(ours)
    assert output.stat().st_size > 0
