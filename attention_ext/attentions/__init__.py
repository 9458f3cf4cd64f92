"""The attention types: one module per attention (or a family sharing its parts, as clustered and
i-clustered do), each registering itself with `registry.register_attention` when imported.

Being a module of this folder is the registration: the package's face (attention_ext/__init__.py)
imports every module here. Helpers that are not attentions live in subpackages (clustered_triton/,
the Triton kernels of clustered and i-clustered attention's CUDA route), which the face does not
walk.
"""
