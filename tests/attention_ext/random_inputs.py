"""Inputs shared by the attention tests."""
import torch


def random_qkv(shape, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, dtype=dtype, generator=generator).requires_grad_()
                 for _ in range(3))


def on(device, *tensors):
    """Leaf copies of tensors on `device` (requiring grad where the originals do)."""
    return tuple(t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors)
