"""What every test session needs before any test module is imported.

Triton's interpreter (TRITON_INTERPRET=1) runs attention_ext's Triton kernels on the CPU, where CI
tests them (tests/attention_ext/test_triton_clustered.py). Triton reads the variable when its
language module is imported, and torch._dynamo imports triton: a test module that imports dynamo
while being collected, before the Triton tests set the variable, left triton's own @jit library
functions compiled-mode, and every interpreted kernel failed on them ("Cannot call @triton.jit'd
outside of the scope of a kernel"). So it is set here, first, and only where no GPU is present
(on a GPU the kernels compile; `import torch` alone does not import triton).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
