"""The extension as the Docker image builds it (ATTENTION_EXT_CPU_ARCH=x86-64-v3: AVX2, no AVX-512)
passes the kernel tests, run as on an AVX2 machine.

Every other test runs the native build (-march=native), which on an AVX-512 machine never executes
the AVX2 code paths that many users' machines and the image run. This builds a second copy of
attention_ext._C for x86-64-v3 into a temporary folder, checks that it holds no AVX-512 (zmm)
instruction, and runs the kernel test files against it in a subprocess with MKL and ATen held to
AVX2 as well (MKL_ENABLE_INSTRUCTIONS=AVX2, ATEN_CPU_CAPABILITY=avx2), the approximation of an AVX2
machine that attention_ext/RESULTS.md checked against a real one. About 2.5 minutes on 2 cores, most
of it the build.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The kernel tests that compare every kernel with brute-force math, on the CPU.
KERNEL_TESTS = ["test_clustered.py", "test_iclustered.py", "test_lsh.py", "test_centroid_attention.py",
                "test_kmeans_assignment.py", "test_centroid_routes.py", "test_clustered_top_attention.py",
                "test_bad_input_threads.py"]
# MKL_CBWR=AVX2,STRICT: MKL's AVX2 sgemm, forced on a CPU with AVX-512, splits its sums by the thread
# count on some CPUs (the centroid attention's bmm gave other last bits with 1 and 2 threads on the
# 2026-12-06 development machine, before this change too); strict conditional
# numerical reproducibility keeps gemm independent of the threads, so test_results_do_not_depend_on_threads
# checks the kernel's own partition of the rows, as it does without the AVX2 emulation.
AVX2_ONLY = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}

pytestmark = pytest.mark.skipif(not os.uname().machine == "x86_64", reason="x86-64-v3 is an x86-64 target")


@pytest.fixture(scope="module")
def portable_package(tmp_path_factory) -> Path:
    """A copy of the attention_ext package whose _C is built with -march=x86-64-v3."""
    work = tmp_path_factory.mktemp("x86_64_v3")
    env = dict(os.environ, ATTENTION_EXT_CPU_ARCH="x86-64-v3", ATTENTION_EXT_CUDA="0")
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(work / "lib"),
                            "--build-temp", str(work / "temp")], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    library = next((work / "lib" / "attention_ext").glob("_C*.so"))
    package = work / "package" / "attention_ext"
    shutil.copytree(ROOT / "attention_ext", package,
                    ignore=shutil.ignore_patterns("_C*.so", "csrc", "results", "__pycache__", "*.md"))
    shutil.copy(library, package / library.name)
    return package.parent


def test_the_portable_build_has_no_avx512_instructions(portable_package):
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    library = next((portable_package / "attention_ext").glob("_C*.so"))
    disassembly = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)], capture_output=True,
                                 text=True, check=True).stdout
    assert "ymm" in disassembly          # it is vectorised (AVX2) ...
    assert "zmm" not in disassembly      # ... and uses no AVX-512 register


def test_kernel_tests_pass_on_the_portable_build_with_avx2_only(portable_package, tmp_path):
    # Inductor's cache does not key on ATEN_CPU_CAPABILITY: code it compiled under avx2 gave wrong
    # results (and once a crash) in later runs without it, so these runs keep their own cache.
    env = dict(os.environ, PYTHONPATH=str(portable_package), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               **AVX2_ONLY)
    # run from a folder outside the checkout, so that `python -m` does not put the checkout's own
    # attention_ext (the native build) first on sys.path
    which = subprocess.run([sys.executable, "-c", "import attention_ext._C as c, torch; "
                            "print(c.__file__); print(torch.backends.cpu.get_cpu_capability())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert Path(which[0]).is_relative_to(portable_package) and which[1] == "AVX2"
    tests = [str(ROOT / "tests" / "attention_ext" / name) for name in KERNEL_TESTS]
    finished = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert finished.returncode == 0, finished.stdout[-4000:]
    assert " passed" in finished.stdout.splitlines()[-1]
