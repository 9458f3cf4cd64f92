"""The CUDA sources compile, also where torch is a CPU build (as in CI).

setup.py compiles attention_ext/csrc/*.cu only against a CUDA torch, so on a machine with a CPU
torch a change to a .cu file or to a header it shares with the CPU code (input_checks.h) would
go unchecked until someone builds on a GPU machine. Where nvcc is installed, this compiles each
.cu file to an object file as torch's BuildExtension would: its nvcc flags
(cpp_extension.COMMON_NVCC_FLAGS, -std=c++20), setup.py's NVCC_FLAGS, torch's headers, for
Ampere (sm_80) and Hopper (sm_90). It asserts that nvcc succeeds and warns about none of our
files. Nothing runs on a GPU here: this checks the code compiles, not what it computes.

Skipped without nvcc, and with a CUDA torch (its install compiled these files already).
"""
import ast
import os
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
CUDA_SOURCES = sorted(CSRC.glob("*.cu"))
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


# Operator families with no CUDA twin on purpose: the fused CPU kernels of the clustered
# attentions' dense part and of i-clustered's top-key part; on CUDA those parts run as torch
# products and the sparse products of sparse_product_cuda.cu (clustered.py, iclustered.py).
CPU_ONLY_FAMILIES = {"centroid_attention", "clustered_top_attention"}


def test_every_operator_family_has_a_cuda_source():
    families = {path.stem for path in CSRC.glob("*.cpp")} - {"module"} - CPU_ONLY_FAMILIES
    assert {path.stem.removesuffix("_cuda") for path in CUDA_SOURCES} == families


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
