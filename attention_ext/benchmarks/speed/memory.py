"""Peak tensor memory of a call, on CPU and CUDA.

Peak memory is the peak of tensor memory allocated by PyTorch's allocator during
the forward+backward, above what was live before it (inputs excluded, gradients
and everything kept for backward included). On CUDA this is
torch.cuda.max_memory_allocated. On CPU there is no such counter, so
`cpu_peak_memory_bytes` reads the allocation events of torch.profiler
(profile_memory=True), which carry the allocator's running total of live bytes.
Memory a kernel takes outside PyTorch's allocator (malloc, std::vector, a BLAS
library's scratch) is not counted on either device.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Callable

import torch


@contextlib.contextmanager
def _kineto_banner_filtered():
    """Drops the 'profiler_start/stop' lines Kineto writes straight to fd 2.

    They would interleave with the progress lines once per measurement; any
    other output written meanwhile is passed through unchanged.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if "ActivityProfiler" not in line:
                    sys.stderr.write(line)
            sys.stderr.flush()


def cpu_peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of CPU tensor memory live during `fn()`, above the level before it.

    Method: run `fn` under torch.profiler with profile_memory=True. Every
    allocation and free through PyTorch's CPU allocator is recorded with the
    allocator's running total of live bytes, updated under the allocator's lock,
    so the totals are in true chronological order whatever the timestamps. A
    4-byte marker tensor allocated just before `fn` fixes the level before it
    (its event's total minus its own size); the peak is the largest total after
    that, minus that level. Tensors freed by `fn` that were allocated before it
    lower the level, as they really do.

    Not seen: memory taken outside PyTorch's allocator, and tensors allocated on
    threads the profiler does not follow (OpenMP workers inside at::parallel_for;
    the calling thread and autograd's threads are followed).
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _kineto_banner_filtered():
        profiler.start()
    try:
        marker = torch.empty(1, dtype=torch.float32)
        marker_address, marker_bytes = marker.data_ptr(), marker.element_size()
        del marker
        fn()
    finally:
        with _kineto_banner_filtered():
            profiler.stop()

    allocations = []  # (time ns, bytes (+ allocated, - freed), allocator total after it, address)
    stack = list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            event = node.extra_fields
            if event.device.type == "cpu":
                allocations.append((node.start_time_ns, event.alloc_size, event.total_allocated,
                                    event.ptr))
        stack.extend(node.children)
    allocations.sort(key=lambda allocation: allocation[0])
    marker_index = next((index for index, (_, size, _, address) in enumerate(allocations)
                         if address == marker_address and size == marker_bytes), None)
    if marker_index is None:
        raise RuntimeError(
            "torch.profiler recorded no CPU allocation events; CPU peak memory cannot be "
            f"measured with this torch ({torch.__version__})")
    _, size, total, _ = allocations[marker_index]
    level_before = total - size
    peak = max(total for _, _, total, _ in allocations[marker_index:])
    return max(0, peak - level_before)


def cuda_peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of CUDA tensor memory live during `fn()`, above the level before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    level_before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - level_before)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak tensor memory of `fn()` above the level before it, on `device`'s type."""
    if device.type == "cuda":
        return cuda_peak_memory_bytes(fn, device)
    if device.type == "cpu":
        return cpu_peak_memory_bytes(fn)
    raise ValueError(f"peak memory is measured on cpu and cuda only, not {device}")
