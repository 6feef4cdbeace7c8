"""The workload a profile-guided build of torch_fl trains on (cmake/pgo.cmake,
scripts/pgo_build.sh): what eager PyTorch programs do on the flagos device, in
torch alone, so that it runs wherever torch_fl builds.

A small decoder-only language model, written with torch.nn: training steps
(forward, backward, AdamW over the parameter lists, a clipped gradient norm), in
float32 and, where the device has it, under bf16 autocast; greedy decoding with
a KV cache grown by `cat`; and a tail of tensor code that models do around
them (views, in-place updates, indexing, reductions, copies to and from the
CPU). Every operator runs on the driver's own kernels, which the caller sets up
(FLAGOS_BACKEND_CONFIG): the profile is of the routing path, not of a provider.

    python scripts/pgo_workload.py [--steps N] [--tokens N]
"""

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 2 * 3 * dim, bias=False)
        self.down = nn.Linear(3 * dim, dim, bias=False)

    def forward(self, x, cos, sin, cache=None):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Decoder(nn.Module):
    def __init__(self, vocab=512, dim=64, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.1)  # tied to the output: logits of a few units
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head_dim = dim // heads

    def rope(self, positions, device):
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
        freqs = torch.outer(positions.float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def forward(self, ids, start=0, caches=None):
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        cos, sin = self.rope(positions, ids.device)
        x = self.embed(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, cos.to(x.dtype), sin.to(x.dtype), None if caches is None else caches[i])
        return F.linear(self.norm(x), self.embed.weight)


def train(model, device, steps, autocast_dtype=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 512, (4, 33), generator=gen).to(device)
        ctx = (torch.autocast(device_type=device, dtype=autocast_dtype) if autocast_dtype
               else torch.autocast(device_type=device, enabled=False))
        with ctx:
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return loss.item()


@torch.no_grad()
def generate(model, device, tokens, batch):
    ids = torch.randint(0, 512, (batch, 8), generator=torch.Generator().manual_seed(2)).to(device)
    caches = [[] for _ in model.blocks]
    logits = model(ids, 0, caches)
    out = [ids]
    for step in range(tokens):
        nxt = logits[:, -1].float().softmax(-1).argmax(-1, keepdim=True)
        out.append(nxt)
        logits = model(nxt, ids.shape[1] + step, caches)
    return torch.cat(out, dim=1).cpu()


def tensor_code(device, rounds):
    """What programs do around a model: views, in-place updates, indexing, reductions, copies."""
    g = torch.Generator().manual_seed(3)
    for _ in range(rounds):
        a = torch.randn(64, 32, generator=g).to(device)
        b = torch.rand(32, 64, device=device)
        c = (a @ b).relu_().add_(1).mul(0.5)
        idx = torch.randint(0, 64, (16,), device=device)
        d = c.index_select(0, idx)[:, ::2].contiguous()
        c[idx] = 0
        m = c > c.mean()
        e = torch.where(m, c, torch.zeros_like(c)).sum(dim=1)
        f = F.layer_norm(d, d.shape[-1:]).softmax(-1).max(dim=-1).values
        g2 = torch.stack([e[:16], f]).T.clone().flip(0).cumsum(0)
        h = torch.nn.functional.gelu(g2).exp().log1p().sqrt().clamp(0, 3)
        _ = (h.norm(), h.std(), h.topk(2, dim=0).indices, h.sort(dim=0).values, h.float().cpu())
        _ = torch.empty_like(a).copy_(a).t().reshape(-1).narrow(0, 3, 100).masked_fill(m.flatten()[:100], 1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tokens", type=int, default=24)
    a = p.parse_args()
    import torch_fl  # noqa: F401

    device = "flagos"
    start = time.perf_counter()
    torch.manual_seed(0)
    model = Decoder().to(device)
    loss = train(model, device, a.steps)
    # bf16 autocast where the device computes in bf16 at speed (the cuda driver); the host
    # driver follows the CPU, whose bf16 matmuls are slow on two cores.
    if torch_fl.driver() != "host":
        loss = train(model, device, a.steps, torch.bfloat16)
    model.eval()
    tokens = generate(model, device, a.tokens, batch=1)
    generate(model.to(torch.bfloat16) if torch_fl.driver() != "host" else model, device, a.tokens, batch=4)
    tensor_code(device, 4 * a.steps)
    torch.flagos.synchronize()
    print(f"pgo workload on {torch_fl.driver()}: loss {loss:.4f}, {tokens.shape[1]} tokens, "
          f"{time.perf_counter() - start:.1f} s")
    return 0 if math.isfinite(loss) else 1


if __name__ == "__main__":
    raise SystemExit(main())
