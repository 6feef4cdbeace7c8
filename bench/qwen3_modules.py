"""Where a Qwen3-0.6B decode step's extra host time on flagos goes, module by module.

bench/cuda_overhead.py times each operator in a loop of its own, where the
code and data of flagos' routing path stay in the CPU's caches; bench/qwen3.py
times whole generate() calls. This benchmark sits between them: one decode
step of the model (bf16, batch 1 and 8, a 16-token KV cache, all-cuda routing)
and its parts, each called on both sides with the same inputs:

- the decode step (28 decoder layers, the final norm, lm_head; the cache is
  cropped back after each step), one decoder layer, its self-attention and
  MLP, one RMSNorm, the rotary embedding, lm_head with argmax, the embedding;
- single calls the model makes: a 1024 -> 3072 linear, `.to(float32)`,
  `pow(2).mean(-1)`, SDPA over a 17-token cache, a view/transpose chain, a
  multiply.

Method: cuda_overhead.compare (interleaved blocks, rounds alternating the
first side, Python's collector off; the ratio is the median of per-round
ratios), with an A/A row (CUDA's multiply against itself) per batch size. Each
row also gives the operators flagos routed in one call (torch_fl.routing
stats; copies such as `.to()` and views are not routed operators) and the
extra host time per routed operator.

    PYTHONPATH=. python bench/qwen3_modules.py [--rounds 7] [--batches 1 8] [--json out.json]

Without a GPU, or when torch_fl did not select the cuda driver, it prints
"skipped: ..." and exits with status 0.
"""

import argparse
import datetime
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from cuda_overhead import compare, no_cuda_driver  # noqa: E402

PROMPT = 16


def state(device, size, batch):
    """The model and the inputs of every case, made the same way on `device`."""
    import qwen3_workload as wl

    cfg = wl.SIZES[size]
    m = wl.build_model(size, torch.bfloat16, device, seed=0)
    ids = wl.prompt_ids(cfg["vocab_size"], batch, PROMPT, seed=batch).to(device)
    with torch.no_grad():
        out = m(input_ids=ids, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    h = m.model.embed_tokens(tok)
    pos = torch.full((batch, 1), PROMPT, dtype=torch.long, device=device)
    g = torch.Generator().manual_seed(batch)
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16).to(device)

    return dict(m=m, cache=out.past_key_values, tok=tok, h=h, pos=pos,
                pe=m.model.rotary_emb(h, pos), layer=m.model.layers[0],
                q=rnd(batch, heads, 1, dim), k=rnd(batch, heads, PROMPT + 1, dim),
                x=rnd(batch, 1, cfg["hidden_size"]),
                w=rnd(cfg["intermediate_size"], cfg["hidden_size"]),
                view=(batch, 1, kv, cfg["hidden_size"] // kv))


def step(s):
    r = s["m"](input_ids=s["tok"], past_key_values=s["cache"], use_cache=True)
    s["cache"].crop(-1)  # back to the prompt: every step sees the same cache
    return r


# name -> (fn(state), calls per timed block)
CASES = {
    "decode step": (step, 20),
    "decoder layer": (lambda s: s["layer"](s["h"], position_embeddings=s["pe"],
                                           attention_mask=None), 300),
    "self_attn": (lambda s: s["layer"].self_attn(s["h"], position_embeddings=s["pe"],
                                                 attention_mask=None), 500),
    "mlp": (lambda s: s["layer"].mlp(s["h"]), 1000),
    "rmsnorm": (lambda s: s["layer"].input_layernorm(s["h"]), 2000),
    "rotary_emb": (lambda s: s["m"].model.rotary_emb(s["h"], s["pos"]), 1000),
    "lm_head + argmax": (lambda s: s["m"].lm_head(s["h"]).argmax(-1), 500),
    "embedding": (lambda s: s["m"].model.embed_tokens(s["tok"]), 2000),
    "linear 1024->3072": (lambda s: F.linear(s["x"], s["w"]), 2000),
    "to(float32)": (lambda s: s["x"].to(torch.float32), 2000),
    "pow(2).mean(-1)": (lambda s: s["x"].pow(2).mean(-1, keepdim=True), 2000),
    "sdpa, 17-token cache": (lambda s: F.scaled_dot_product_attention(s["q"], s["k"], s["k"]),
                             2000),
    "view, transpose, contiguous": (lambda s: s["x"].view(s["view"]).transpose(1, 2)
                                    .contiguous(), 2000),
    "multiply": (lambda s: s["x"] * s["x"], 2000),
}


def bound(fn, s):
    def call():
        with torch.no_grad():
            return fn(s)
    return call


def routed_ops(call) -> int:
    import torch_fl

    torch_fl.routing.reset_stats()
    call()
    return sum(sum(st.calls.values()) for st in torch_fl.routing.stats())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--size", default="0.6b", help="examples/qwen3_workload.py SIZES")
    p.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    skip = no_cuda_driver()
    if skip:
        print(f"skipped: {skip}")
        return 0
    import torch_fl

    torch_fl.routing.set_route("*", "cuda")
    rows = []
    for batch in a.batches:
        sides = {d: state(d, a.size, batch) for d in ("flagos", "cuda")}
        aa = bound(CASES["multiply"][0], sides["cuda"])
        res = compare(aa, aa, a.rounds, CASES["multiply"][1])
        rows.append(dict(batch=batch, case="A/A: cuda multiply", **res, routed=None))
        for name in a.cases:
            fn, calls = CASES[name]
            fa, fb = bound(fn, sides["flagos"]), bound(fn, sides["cuda"])
            routed = routed_ops(fa)
            rows.append(dict(batch=batch, case=name, routed=routed,
                             **compare(fa, fb, a.rounds, calls)))
        del sides
    print("| batch | case | flagos µs | cuda µs | ratio | extra µs | routed ops | extra µs/op | rounds |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        extra = (r["a"] - r["b"]) * 1e6
        per = f"{extra / r['routed']:.2f}" if r["routed"] else ""
        print(f"| {r['batch']} | {r['case']} | {r['a'] * 1e6:.1f} | {r['b'] * 1e6:.1f} | "
              f"**{r['ratio']:.3f}** | {extra:.1f} | {r['routed'] if r['routed'] is not None else ''} | "
              f"{per} | {' '.join(f'{x:.2f}' for x in r['rounds'])} |")
    if a.json:
        meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
                    host=platform.node(), torch=torch.__version__,
                    gpu=torch.cuda.get_device_name(), rounds=a.rounds, size=a.size)
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
