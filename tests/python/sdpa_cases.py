"""The scaled-dot-product-attention cases of test_sdpa.py, runnable on any device.

test_sdpa.py runs each case on flagos in its own process and compares it with
the same case on the native device: the CPU in the same process (host driver),
or native CUDA in a child process that never loads torch_fl (cuda driver: in a
process that registered flagos, PyTorch's autograd serves flagos only, see
docs/gpu.md). The child runs this file::

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python tests/python/sdpa_cases.py cuda OUT.pt

A case's result: the forward output, the gradients of every input that takes
one, and which fused attention operators ran, forward and backward (from the
profiler); or the error, when the device refuses the case.
"""

import contextlib
import re
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}

# The operators that tell which kernel ran. flagos runs CUDA's flash through
# the overrideable operator, whose own name is left out of the comparison.
_KERNEL_OP = re.compile(r"aten::_(scaled_dot_product_\w+|flash_attention_\w+|"
                        r"efficient_attention_\w+|cudnn_attention_\w+)$")
_FLAGOS_ONLY_OPS = {"aten::_scaled_dot_product_fused_attention_overrideable",
                    "aten::_scaled_dot_product_fused_attention_overrideable_backward"}


def case(case_id, backend="default", dtype="bfloat16", B=2, H=4, kv_heads=None, L=128, S=None,
         E=64, causal=False, mask=None, dropout=0.0, gqa=False, grad=True, batched=True):
    """mask: None, "bool" (L x S, every row keeps a key) or "float" (B x H x L x S,
    additive, requires grad when ``grad``)."""
    return dict(id=case_id, backend=backend, dtype=dtype, B=B, H=H, kv_heads=kv_heads or H, L=L,
                S=S or L, E=E, causal=causal, mask=mask, dropout=dropout, gqa=gqa, grad=grad,
                batched=batched)


# The cuda driver's cases: every backend forced, and the default choice, over
# causal masks, boolean and additive masks, GQA, dropout, a head dimension
# flash pads (36), unequal sequence lengths, inference, unbatched inputs.
CUDA_CASES = [
    case("default"),
    case("default-causal", causal=True),
    case("default-causal-L64-S128", causal=True, L=64, S=128),
    case("default-bool-mask", mask="bool"),
    case("default-float-mask-grad", mask="float"),
    case("default-gqa", H=8, kv_heads=2, gqa=True),
    case("default-dropout", dropout=0.1),
    case("default-dropout-causal", dropout=0.1, causal=True),
    case("default-headdim-36", E=36),
    case("default-fp16", dtype="float16"),
    case("default-fp32", dtype="float32"),
    case("default-inference", grad=False),
    case("default-unbatched", batched=False),
    case("flash", "flash"),
    case("flash-causal", "flash", causal=True),
    case("flash-gqa", "flash", H=8, kv_heads=2, gqa=True),
    case("flash-dropout", "flash", dropout=0.2),
    case("flash-headdim-36", "flash", E=36),
    case("flash-headdim-36-dropout-causal", "flash", E=36, dropout=0.1, causal=True),
    case("flash-bool-mask", "flash", mask="bool"),  # refused by CUDA: must be by flagos too
    case("efficient", "efficient"),
    case("efficient-causal", "efficient", causal=True),
    case("efficient-bool-mask", "efficient", mask="bool"),
    case("efficient-float-mask-grad", "efficient", mask="float"),
    case("efficient-dropout", "efficient", dropout=0.1),
    case("efficient-fp32", "efficient", dtype="float32"),
    case("efficient-gqa", "efficient", H=8, kv_heads=2, gqa=True),
    case("cudnn", "cudnn"),
    case("cudnn-causal", "cudnn", causal=True),
    case("cudnn-float-mask", "cudnn", mask="float", grad=False),
    case("cudnn-dropout", "cudnn", dropout=0.1),
    case("math", "math"),
    case("math-causal-gqa", "math", causal=True, H=8, kv_heads=2, gqa=True),
    case("math-dropout", "math", dropout=0.1),
]

# The host driver's cases: CPU's choice, float32 (CPU's flash serves it).
HOST_CASES = [
    case("host-default", dtype="float32", L=32, E=16),
    case("host-causal", dtype="float32", L=32, E=16, causal=True),
    case("host-bool-mask", dtype="float32", L=32, E=16, mask="bool"),
    case("host-float-mask-grad", dtype="float32", L=32, E=16, mask="float"),
    case("host-gqa", dtype="float32", L=32, E=16, H=8, kv_heads=2, gqa=True),
    case("host-flash", "flash", dtype="float32", L=32, E=16),
    case("host-math", "math", dtype="float32", L=32, E=16),
    case("host-bfloat16", dtype="bfloat16", L=32, E=16),
]


def _inputs(c, device):
    """Fresh random inputs from a generator seeded by the case's id (the same
    on every device), made on the CPU and moved."""
    g = torch.Generator().manual_seed(sum(map(ord, c["id"])) * 7919)
    dtype = getattr(torch, c["dtype"])
    B, H, KH, L, S, E = c["B"], c["H"], c["kv_heads"], c["L"], c["S"], c["E"]
    q = torch.randn(B, H, L, E, generator=g).to(dtype)
    k = torch.randn(B, KH, S, E, generator=g).to(dtype)
    v = torch.randn(B, KH, S, E, generator=g).to(dtype)
    grad_out = torch.randn(B, H, L, E, generator=g).to(dtype)
    mask = None
    if c["mask"] == "bool":
        mask = torch.rand(L, S, generator=g) > 0.3
        mask[:, 0] = True  # no row without a key (its softmax would be NaN)
    elif c["mask"] == "float":
        mask = torch.randn(B, H, L, S, generator=g).to(dtype)
    if not c["batched"]:
        q, k, v, grad_out = q[0], k[0], v[0], grad_out[0]
        if mask is not None and mask.dim() == 4:
            mask = mask[0]
    q, k, v, grad_out = (t.to(device) for t in (q, k, v, grad_out))
    if mask is not None:
        mask = mask.to(device)
    if c["grad"]:
        for t in (q, k, v):
            t.requires_grad_(True)
        if c["mask"] == "float":
            mask.requires_grad_(True)
    return q, k, v, mask, grad_out


def _seed(device, seed):
    # flagos draws dropout from its own generator: on the cuda driver that is
    # CUDA's default generator, seeded here through torch.flagos.
    if device == "cuda":
        torch.cuda.manual_seed(seed)
    elif device == "flagos":
        torch.flagos.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def run_case(c, device):
    q, k, v, mask, grad_out = _inputs(c, device)
    backend = contextlib.nullcontext() if c["backend"] == "default" else sdpa_kernel(BACKENDS[c["backend"]])
    _seed(device, 1234)
    try:
        with backend, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=c["dropout"],
                                                 is_causal=c["causal"], enable_gqa=c["gqa"])
            if c["grad"]:
                out.backward(grad_out)
    except RuntimeError as e:
        return {"error": type(e).__name__, "message": str(e).strip().splitlines()[-1][:300]}
    names = {e.name for e in prof.events() if _KERNEL_OP.match(e.name)}
    result = {"kernels": sorted(names - _FLAGOS_ONLY_OPS), "out": out.detach().cpu()}
    if c["grad"]:
        for name, t in (("q", q), ("k", k), ("v", v), ("mask", mask)):
            if t is not None and t.requires_grad:
                result["grad_" + name] = t.grad.cpu()
    return result


def run_all(device, cases, path):
    torch.save({c["id"]: run_case(c, device) for c in cases}, path)


if __name__ == "__main__":
    run_all(sys.argv[1], CUDA_CASES, sys.argv[2])
