"""Builds attention_ext._C, the compiled kernels of the attention library.

The sources live in attention_ext/csrc/, one folder per operator family (clustering/, lsh/,
cluster_ops/, sparse_products/, centroid_attention/) with its CPU (.cpp) and CUDA (.cu) files
side by side and the argument checks both call (checks.h); common/ holds what families share
(and module.cpp, the Python module, sits at the top). Every .cpp and .cu below csrc/ is built.
The CUDA sources (sharing common/cuda_common.cuh) are compiled only when the installed torch is a CUDA build (torch.version.cuda), never merely because
nvcc is on PATH: a CPU torch with nvcc installed must still build the CPU extension.
A CUDA build needs the nvcc of the CUDA version torch was built with (CUDA_HOME).

Environment:
  ATTENTION_EXT_CPU_ARCH  value for -march (default "native"; set e.g. "x86-64-v3"
                          when building an image that runs on other machines)
  ATTENTION_EXT_DEBUG=1   build the host code with -O0 -g (device code stays optimised); the
                          default build has no debug information (-g0)
  MAX_JOBS                parallel compilations (ninja); default: the CPUs this process may use
  ATTENTION_EXT_CUDA=0    build the CPU kernels only, even with a CUDA torch
  TORCH_CUDA_ARCH_LIST    the GPU architectures to compile for, read by torch's
                          BuildExtension, e.g. "8.0 8.6 9.0" (Ampere A100, Ampere RTX 30xx,
                          Hopper). Unset: the GPUs visible at build time. This file passes
                          no -gencode/-arch flags of its own, so the list is always honoured.
"""
import glob
import os
import shutil
import sysconfig

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
except ImportError as error:  # pragma: no cover - only hit on a broken install
    raise SystemExit(
        "attention_ext needs PyTorch at build time. Install torch first "
        "(for example `pip install torch==2.13.0`), then this project with "
        "`pip install --no-build-isolation -e .`"
    ) from error

here = os.path.dirname(os.path.abspath(__file__))
csrc = os.path.join("attention_ext", "csrc")


def sources(pattern: str) -> list[str]:
    """The files below csrc/ (any depth) whose names match `pattern`, in a fixed order."""
    return sorted(glob.glob(os.path.join(csrc, "**", pattern), recursive=True))


cpp_sources = sources("*.cpp")
cuda_sources = sources("*.cu")
headers = sources("*.h") + sources("*.cuh")
with_cuda = (torch.version.cuda is not None and bool(cuda_sources)
             and os.environ.get("ATTENTION_EXT_CUDA", "1") != "0")

debug = os.environ.get("ATTENTION_EXT_DEBUG") == "1"
arch = os.environ.get("ATTENTION_EXT_CPU_ARCH", "native")
# -g0: Python's own compile flags (sysconfig CFLAGS) carry -g, and debug information for torch's
# templates tripled the compile time of a file (clustering.cpp: 34.7 s of CPU with it, 11.5 s
# without) and made the library 28 MB; ATTENTION_EXT_DEBUG=1 is the build to debug.
cxx_flags = ["-O0", "-g"] if debug else ["-O3", f"-march={arch}", "-g0"]
# -fno-trapping-math: without it GCC will not turn the branches of the softmax loops' exp
# (vector_exp.h: the clamps and the underflow select) into blends unless the instruction set
# has mask registers, so on x86-64-v3 (AVX2) every exp loop stayed scalar while AVX-512 builds
# vectorised them. The flag lets GCC ignore floating-point exception flags, which nothing here
# reads; it changes no value (no reassociation, unlike -ffast-math).
cxx_flags += [] if debug else ["-fno-trapping-math"]
# at::parallel_for runs its body on torch's intra-op threads only when the extension
# is compiled with OpenMP (without -fopenmp its header falls back to a serial loop).
# Linking with -fopenmp adds a dependency on libgomp.so.1, which the dynamic loader
# resolves to the copy torch has already loaded: one OpenMP runtime per process.
cxx_flags += ["-fopenmp"]
link_flags = ["-fopenmp"]
# No -std in either list: torch adds the C++ standard its headers need (C++20 for torch 2.13;
# they warn under C++17). nvcc: no -lineinfo (smaller binaries); no -gencode
# (TORCH_CUDA_ARCH_LIST decides). --use_fast_math: the kernels' float exp/log/division may
# differ from IEEE by a few ulp; statistics that decide hash bits are computed in double,
# which fast math leaves alone. tests/attention_ext/test_cuda_sources_compile.py reads
# NVCC_FLAGS (keep it a literal list).
NVCC_FLAGS = ["-O3", "--use_fast_math"]

if with_cuda:
    extension = CUDAExtension(
        "attention_ext._C",
        cpp_sources + cuda_sources,
        define_macros=[("WITH_CUDA", None)],
        depends=headers,
        extra_compile_args={"cxx": cxx_flags, "nvcc": NVCC_FLAGS},
        extra_link_args=link_flags,
    )
else:
    extension = CppExtension(
        "attention_ext._C", cpp_sources, depends=headers, extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )

# Compile with ninja, one job per CPU this process may use. torch's BuildExtension takes ninja from
# PATH (else it compiles one file at a time) and runs os.cpu_count() + 2 jobs, which counts the
# host's CPUs inside a container limited to fewer. pip's ninja lies beside this Python.
scripts = sysconfig.get_path("scripts")
if shutil.which("ninja") is None and shutil.which("ninja", path=scripts):
    os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("MAX_JOBS", str(len(os.sched_getaffinity(0))))

setup(ext_modules=[extension], cmdclass={"build_ext": BuildExtension})
