"""The call contract shared by every attention type.

    out = attn(q, k, v, lengths)   # q, k, v: (B, H, N, E); lengths: (B,) or None
                                   # out: (B, H, N, E); padded query rows are 0,
                                   # padded keys get no weight

Every attention module calls `check_inputs(q, k, v, lengths, attention=self)`
first, so a caller gets the same clear error whatever attention it runs, and an
attention registered with needs_shared_qk refuses a separate key tensor.
"""
from __future__ import annotations

import torch

from ._ops import set_device_value_checks
from .registry import SharedQKRequiredError


_input_validation = True


def set_input_validation(enabled: bool) -> bool:
    """Turns the value checks of the attentions on (the default) or off; returns the old setting.

    The shapes, dtypes and devices of q, k, v and lengths are always checked (that costs
    nothing). The value checks read tensors on the host: `check_inputs` that every length lies
    in [0, N], and on CUDA LSH's kernels their flag that lengths and sorted order are valid
    (both device synchronisations when the tensors live on a GPU; lengths on the CPU are
    checked for free). A GPU training loop whose lengths are known to be right turns them off:
    then no attention synchronises with the host (tests/attention_ext/test_cuda_graphs.py).
    They are skipped, whatever this switch says, where a host read cannot happen: in code
    traced by torch.compile or torch.export (a traced graph cannot branch on a tensor's
    values) and while a CUDA graph is being captured on the current stream (a synchronisation
    would invalidate the capture). Unchecked, a length outside [0, N] is clipped to it by the
    attentions: wrong numbers, never a crash or an out-of-bounds read.
    """
    global _input_validation
    previous, _input_validation = _input_validation, bool(enabled)
    set_device_value_checks(_input_validation)   # LSH's CUDA kernels read their flag by it
    return previous


def input_validation_enabled() -> bool:
    """Whether `check_inputs` checks the lengths' values now (on, and not being traced)."""
    return _input_validation and not torch.compiler.is_compiling()


def capturing_cuda_graph() -> bool:
    """True while the current CUDA stream is capturing a graph (never on a CPU-only torch)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None,
                 attention: torch.nn.Module | None = None) -> torch.Tensor:
    """Validates shapes and returns `lengths` as an int64 tensor on q's device.

    A `lengths` of None means every sequence has the full length N. `attention` is the
    calling module: if its type was registered with needs_shared_qk, k must be q.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "attention expects q, k, v of shape (batch, heads, length, dim); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    batch, heads, length, dim = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must share (batch, heads, length) {tuple(q.shape[:3])} with q, got {tuple(v.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if lengths is None:
        lengths = torch.full((batch,), length, dtype=torch.long, device=q.device)
    else:
        if lengths.dim() != 1 or lengths.shape[0] != batch:
            raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}")
        if lengths.is_floating_point():
            raise ValueError(f"lengths must be integers, got dtype {lengths.dtype}")
        # Checked where they are: free on the CPU, one synchronisation on a GPU (so never while
        # a CUDA graph is captured); then moved without waiting for the device's queue.
        check_values = input_validation_enabled() and not (lengths.is_cuda and capturing_cuda_graph())
        if lengths.numel() and check_values and (int(lengths.min()) < 0 or int(lengths.max()) > length):
            raise ValueError(
                f"lengths must lie in [0, {length}] (the padded length), got {lengths.tolist()}")
        lengths = lengths.to(device=q.device, dtype=torch.long, non_blocking=True)
    if getattr(attention, "needs_shared_qk", False) and not is_shared_qk(q, k):
        raise SharedQKRequiredError(
            f"attention '{attention.attention_name}' needs a model with shared query/key projections: "
            "call it with k = q (the same tensor), e.g. build the model with shared_qk=True; it got a "
            "separate key tensor. Use 'full', 'clustered' or 'iclustered' for separate keys.")
    return lengths


def valid_positions(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, N) bool mask, True where a position lies inside its sequence."""
    return torch.arange(length, device=lengths.device) < lengths[:, None]


def zero_padded_queries(out: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sets the rows of padded queries to 0 (the contract), without touching valid rows."""
    mask = valid_positions(lengths, out.shape[2])[:, None, :, None]
    return out.masked_fill(~mask, 0.0)


def zeros_without_valid_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The output of a batch in which no query is valid (B = 0, N = 0 or every length 0):
    zeros of v's shape that are still connected to q, k and v, so a backward pass gives them
    zero gradients instead of failing on an output without grad_fn. masked_fill, unlike
    multiplying by 0, keeps a NaN or inf of the (padded) inputs out of the zeros."""
    everything = torch.ones((), dtype=torch.bool, device=v.device)
    out = v.masked_fill(everything, 0.0)
    for x in (q, k):
        out = out + x.masked_fill(everything, 0.0).sum(-1, keepdim=True)
    return out


def is_shared_qk(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when the caller passed the very same tensor as queries and keys."""
    if k is q:
        return True
    if torch.compiler.is_compiling():   # traced tensors have no storage to compare
        return False
    return k.data_ptr() == q.data_ptr() and k.shape == q.shape and k.stride() == q.stride()


def kernel_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype an attention with compiled kernels computes in, for inputs of `dtype` on `device`.

    float32 and float64 run as they are. float16 and bfloat16 (mixed-precision training) run
    natively on CUDA, where the kernels load half-precision rows and accumulate in float32;
    the CPU kernels have no half-precision code, so there they are computed in float32 and
    the result is cast back to the input dtype.
    """
    if dtype in (torch.float32, torch.float64):
        return dtype
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return dtype
    return torch.float32


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an attention written in plain torch ops (linear, agglomerative) sums in:
    float16/bfloat16 inputs are summed in float32 (a sum over thousands of keys overflows or
    loses the small terms in half precision) and the result is cast back; float32 and float64
    as they are, on every device."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def hashing_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of random hash planes and rotations: float64 for float64 inputs, else float32.

    Half-precision queries are projected in float32 on both devices, on planes drawn in float32,
    so a half-precision call draws the same planes as a float32 call on the same device.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def autocast_disabled(device: torch.device):
    """A context with autocast off, for the body of an attention with compiled kernels.

    The attention casts q, k, v to `kernel_dtype` once and then computes in that dtype; autocast
    deciding the dtype op by op would mix float32 and half tensors between the kernels (which
    require matching dtypes). Under autocast the projections before the attention already give
    half-precision q, k, v, so the attention still runs in half precision on CUDA.
    """
    return torch.autocast(device_type=device.type, enabled=False)


def draw_clustering(q: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The random draws of one query clustering, in this order on every kernel route: `bits` hash
    planes (bits, E), their offsets (bits,), then the K-Means seed. The planes and offsets are drawn
    where q is, from that device's generator: on CUDA a copy from the host could not be held by a
    CUDA graph, whose replays draw new planes (the CUDA generator is graph-safe). The seed stays a
    host number: a captured graph keeps the one of its capture (tests/attention_ext/test_cuda_graphs.py)."""
    dtype = hashing_dtype(q.dtype)
    planes = torch.randn(bits, q.shape[-1], dtype=dtype, device=q.device)
    plane_offsets = torch.randn(bits, dtype=dtype, device=q.device)
    return planes, plane_offsets, draw_seed()


def draw_seed() -> int:
    """One 62-bit seed from torch's default CPU generator.

    Kernels derive their per-(batch, head) random streams from it (hash planes,
    initial centroids, LSH rotations), so `torch.manual_seed(s)` makes every
    attention call repeatable, and a sequence draws the same randomness whether
    it runs alone or at the same batch index of a padded batch.
    """
    return int(torch.randint(0, 2**62, (1,)).item())
