"""The Qwen3 workload: one definition of the model, greedy decoding and AdamW
training, run on flagos or on a reference device (cpu, cuda).

Random weights (nothing is downloaded): the model is built on the CPU in
float32 from a seed, so its weights are identical on every device, then
converted and moved. Tests, the demo and benchmarks import this file by path
(examples/ on sys.path); as a program it runs one workload and saves the
result with torch.save:

    python examples/qwen3_workload.py --device flagos --size tiny --mode infer --out r.pt

torch_fl is imported only for --device flagos: a native-CUDA training
reference runs with TORCH_DEVICE_BACKEND_AUTOLOAD=0 and must never load it
(autograd refuses CUDA backward once PrivateUse1 is registered,
pytorch/pytorch#161129).
"""

import argparse
import contextlib
import sys
import time

import torch

SIZES = {
    # CI on two CPU cores: seconds.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=512, initializer_range=0.2),
    # The CPU demo: well under a minute on two cores.
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                  max_position_embeddings=2048, initializer_range=0.1),
    # Qwen3-0.6B's shape.
    "0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 max_position_embeddings=40960, initializer_range=0.05),
}
# initializer_range is above Qwen3's 0.02 on purpose: with small random
# weights the residual stream is mostly the current token's embedding, the
# tied lm_head maps it back to that token, and greedy decoding repeats the
# last prompt token forever, a check that passes even with broken attention.
# These values give context-dependent tokens with clear top-1 margins.
COMMON = dict(rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
              tie_word_embeddings=True, hidden_act="silu", attention_dropout=0.0)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# "sdpa_math" is SDPA restricted to its math path (matmuls and softmax), the
# path flagos' SDPA takes on the cuda driver: a reference pinned to it runs
# the same kernels as flagos' all-cuda routing.
ATTENTION = ("sdpa", "eager", "sdpa_math")

# Parameters saved in full at the first and last training step: all of them
# up to this many elements, else the first and last decoder layers and the
# final norm (the 0.6b model: ~126 MB per step in float32).
FULL_GRADS_MAX_NUMEL = 50_000_000


def config(size: str, attn: str = "sdpa"):
    from transformers import Qwen3Config

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}: choose from {', '.join(SIZES)}")
    if attn not in ATTENTION:
        raise ValueError(f"unknown attention {attn!r}: choose from {', '.join(ATTENTION)}")
    impl = "sdpa" if attn == "sdpa_math" else attn
    return Qwen3Config(**SIZES[size], **COMMON, attn_implementation=impl)


def attention_context(attn: str):
    """The context every forward and backward of the workload runs in."""
    if attn == "sdpa_math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def build_model(size: str, dtype=torch.float32, device="cpu", seed: int = 0, attn: str = "sdpa",
                train: bool = False):
    """Qwen3ForCausalLM with seeded random weights, built on the CPU in float32
    (identical on every device), then converted to ``dtype`` and moved."""
    from transformers import Qwen3ForCausalLM

    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    cfg = config(size, attn)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            model = Qwen3ForCausalLM(cfg)
        finally:
            torch.set_default_dtype(prev)
    model = model.to(dtype=dtype).to(device)
    return model.train(train)


def synchronize(device) -> None:
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "flagos":
        torch.flagos.synchronize()


def prompt_ids(vocab_size: int, batch: int, length: int, seed: int) -> torch.Tensor:
    """Fixed random token ids (CPU), the same on every device."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab_size, (batch, length), generator=g)


def _greedy(model, ids, new_tokens: int, device, attn: str, all_logits: bool):
    # Prefill the prompt into the KV cache, then one token per step; never
    # stops at an EOS. The margin (top-1 minus top-2 logit) of each choice says
    # how close a tie it was.
    tokens, margins = [], []
    with torch.no_grad(), attention_context(attn):
        synchronize(device)
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        logits = out.logits
        nxt = logits[:, -1].argmax(-1)
        top = logits[:, -1].float().topk(2, dim=-1).values
        tokens.append(nxt)
        margins.append(top[:, 0] - top[:, 1])
        synchronize(device)
        t1 = time.perf_counter()
        cache = out.past_key_values
        for _ in range(new_tokens - 1):
            out = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step = out.logits[:, -1]
            nxt = step.argmax(-1)
            top = step.float().topk(2, dim=-1).values
            tokens.append(nxt)
            margins.append(top[:, 0] - top[:, 1])
        synchronize(device)
        t2 = time.perf_counter()
        prefill_logits = (logits if all_logits else logits[:, -1]).float().cpu()
    return (torch.stack(tokens, 1).cpu(), torch.stack(margins, 1).cpu(), prefill_logits,
            t1 - t0, t2 - t1)


def generate(model, prompt: torch.Tensor, new_tokens: int, device, attn: str = "sdpa",
             warmup: int = 1, all_logits: bool = True) -> dict:
    """Greedy decoding of ``new_tokens`` tokens after ``prompt`` (CPU ids).

    ``warmup`` untimed runs of the same shapes come first (kernel compilation
    and autotuning belong to them). Returns the generated ids [B, N], the
    margins [B, N], the prefill logits (CPU float32; [B, P, V], or [B, V] for
    the last position only) and timings: prefill tokens/s counts the prompt
    tokens, decode tokens/s the B * (N - 1) tokens of the decode steps.
    """
    if new_tokens < 1:
        raise ValueError("new_tokens must be at least 1")
    ids = prompt.to(device)
    for _ in range(warmup):
        _greedy(model, ids, new_tokens, device, attn, False)
    tokens, margins, logits, prefill_s, decode_s = _greedy(model, ids, new_tokens, device, attn, all_logits)
    b, p = prompt.shape
    decoded = b * (new_tokens - 1)
    return {
        "tokens": tokens,
        "margins": margins,
        "prefill_logits": logits,
        "timing": {
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "prefill_tok_s": b * p / prefill_s if prefill_s > 0 else float("inf"),
            "decode_tok_s": decoded / decode_s if decode_s > 0 else float("nan"),
        },
    }


def saved_param_names(model) -> list:
    """The parameters whose full gradients :func:`train` keeps."""
    named = list(model.named_parameters())
    if sum(p.numel() for _, p in named) <= FULL_GRADS_MAX_NUMEL:
        return [n for n, _ in named]
    last = model.config.num_hidden_layers - 1
    keep = ("model.layers.0.", f"model.layers.{last}.", "model.norm.")
    return [n for n, _ in named if n.startswith(keep)]


def train_batches(vocab_size: int, batch: int, length: int, seed: int, count: int = 2) -> torch.Tensor:
    """``count`` fixed random token batches [count, B, L] (CPU); step i uses i % count."""
    g = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, vocab_size, (count, batch, length), generator=g)


def train(model, batches: torch.Tensor, steps: int, device, attn: str = "sdpa",
          lr: float = 1e-3) -> dict:
    """``steps`` AdamW steps (foreach on every device, so every device runs the
    same algorithm) on the model's own causal LM loss, labels = inputs.

    Returns the losses, the gradient norm of every parameter at every step
    ([steps, n_params], CPU float32), full CPU float32 gradients of
    :func:`saved_param_names` at the first and last step, every step's time
    and their mean after the first step (forward, backward, optimizer step; norms and
    copies are outside the timed region).
    """
    model.train()
    named = list(model.named_parameters())
    names = [n for n, _ in named]
    keep = set(saved_param_names(model))
    opt = torch.optim.AdamW([p for _, p in named], lr=lr, foreach=True)
    data = batches.to(device)
    losses, norms, times = [], [], []
    grads_first = grads_last = None
    for step in range(steps):
        x = data[step % data.shape[0]]
        synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with attention_context(attn):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
            loss.backward()
        opt.step()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        with torch.no_grad():
            norms.append(torch.stack([torch.linalg.vector_norm(p.grad.float()) for _, p in named]).cpu())
            if step in (0, steps - 1):
                grads = {n: p.grad.detach().float().cpu() for n, p in named if n in keep}
                if step == 0:
                    grads_first = grads
                if step == steps - 1:
                    grads_last = grads
    later = times[1:]
    return {
        "losses": losses,
        "param_names": names,
        "grad_norms": torch.stack(norms) if norms else torch.empty(0, len(names)),
        "grads_first": grads_first or {},
        "grads_last": grads_last or {},
        "step_time_s": sum(later) / len(later) if later else float("nan"),
        "step_times_s": times,
        "first_step_s": times[0] if times else float("nan"),
    }


def routing_summary() -> dict:
    """torch_fl's routing state as plain data (loads anywhere, weights_only)."""
    import torch_fl

    return {
        "driver": torch_fl.driver(),
        "flaggems_enabled": torch_fl.is_flaggems_enabled(),
        "flaggems_ops": sorted(set(torch_fl.flaggems.registered_ops()) | set(torch_fl.flaggems.cpp_ops())),
        "flaggems_cpp": torch_fl.flaggems.cpp_stats() if torch_fl.flaggems.cpp_ops() else None,
        "config": torch_fl.routing.config_path(),
        "stats": [{"op": s.op, "calls": dict(s.calls), "cpu_fallbacks": int(s.cpu_fallbacks)}
                  for s in torch_fl.routing.stats()],
    }


def calls_by_backend(summary: dict) -> dict:
    """backend -> (number of ops, number of calls); CPU fallbacks under 'cpu fallback'."""
    out = {}
    for s in summary["stats"]:
        for backend, n in s["calls"].items():
            ops, calls = out.get(backend, (0, 0))
            out[backend] = (ops + 1, calls + n)
        if s["cpu_fallbacks"]:
            ops, calls = out.get("cpu fallback", (0, 0))
            out["cpu fallback"] = (ops + 1, calls + s["cpu_fallbacks"])
    return out


def agreement(got: dict, ref: dict) -> dict:
    """How two :func:`generate` results agree: equal tokens, the first
    divergence (per sequence) with the reference's margin there, and the
    largest prefill-logit difference."""
    g, r = got["tokens"], ref["tokens"]
    equal = int((g == r).sum())
    first = []
    for i in range(r.shape[0]):
        diff = (g[i] != r[i]).nonzero()
        if len(diff):
            j = int(diff[0])
            first.append({"seq": i, "pos": j, "ref_margin": float(ref["margins"][i, j])})
    d = (got["prefill_logits"] - ref["prefill_logits"]).abs()
    return {"tokens_equal": equal, "tokens_total": r.numel(), "first_divergence": first,
            "max_logit_diff": float(d.max()), "mean_logit_diff": float(d.mean())}


def run(device: str, size: str, dtype: str, mode: str, batch: int = 2, prompt_len: int = 32,
        new_tokens: int = 16, steps: int = 10, seed: int = 0, attn: str = "sdpa",
        lr: float = 1e-3, warmup: int = 1) -> dict:
    """One workload, as the CLI runs it; returns the result dict (CPU tensors, plain data)."""
    if device.startswith("flagos"):
        import torch_fl  # noqa: F401  (registers the flagos device)

        torch_fl.routing.reset_stats()
    if mode == "train" and dtype != "float32":
        raise ValueError("training runs in float32")
    cfg = SIZES[size]
    result = {"meta": dict(device=device, size=size, dtype=dtype, mode=mode, batch=batch,
                           prompt_len=prompt_len, new_tokens=new_tokens, steps=steps, seed=seed,
                           attn=attn, lr=lr, torch=str(torch.__version__), shape=dict(cfg))}
    t0 = time.perf_counter()
    model = build_model(size, dtype, device, seed, attn, train=(mode == "train"))
    result["meta"]["build_s"] = time.perf_counter() - t0
    result["meta"]["params"] = sum(p.numel() for p in model.parameters())
    if device.startswith("flagos"):
        import torch_fl

        torch_fl.routing.reset_stats()  # count the workload, not the build
    if mode == "infer":
        prompt = prompt_ids(cfg["vocab_size"], batch, prompt_len, seed)
        result.update(generate(model, prompt, new_tokens, device, attn, warmup))
    elif mode == "train":
        batches = train_batches(cfg["vocab_size"], batch, prompt_len, seed)
        result.update(train(model, batches, steps, device, attn, lr))
    else:
        raise ValueError(f"unknown mode {mode!r}")
    if device.startswith("flagos"):
        result["routing"] = routing_summary()
    result["torch_fl_loaded"] = "torch_fl" in sys.modules
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="flagos", choices=("flagos", "cuda", "cpu"))
    p.add_argument("--size", default="tiny", choices=tuple(SIZES))
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    p.add_argument("--mode", default="infer", choices=("infer", "train"))
    p.add_argument("--attn", default="sdpa", choices=ATTENTION)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=32, help="prompt length; training sequence length")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1, help="untimed inference runs before the timed one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="torch.save the result here")
    a = p.parse_args(argv)
    result = run(a.device, a.size, a.dtype, a.mode, a.batch, a.prompt_len, a.new_tokens, a.steps,
                 a.seed, a.attn, a.lr, a.warmup)
    if a.out:
        torch.save(result, a.out)
    if a.mode == "infer":
        t = result["timing"]
        print(f"{a.device} {a.size} {a.dtype}: prefill {t['prefill_tok_s']:.1f} tok/s, "
              f"decode {t['decode_tok_s']:.1f} tok/s; tokens[0] {result['tokens'][0].tolist()}")
    else:
        print(f"{a.device} {a.size}: losses {[round(x, 5) for x in result['losses']]}, "
              f"step {result['step_time_s'] * 1e3:.1f} ms")
    if "routing" in result:
        per = calls_by_backend(result["routing"])
        print("routing: " + ", ".join(f"{b} {ops} ops/{calls} calls" for b, (ops, calls) in sorted(per.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
