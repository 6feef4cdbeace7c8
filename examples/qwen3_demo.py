"""Main job: Qwen3 on the flagos device, compared with a reference device.

On the host driver (a CPU machine): the `small` model, reference cpu. On the
cuda driver (an NVIDIA GPU; FlagGems where enabled): the `0.6b` model
(Qwen3-0.6B's shape), reference native CUDA. Random weights, the same on both
devices (examples/qwen3_workload.py). It prints prefill and decode tokens/s on
both, how the greedy tokens and prefill logits agree, a few AdamW steps on
both, and which backend ran each operator. Exits 1 if they disagree.

    python examples/qwen3_demo.py [--size tiny|small|0.6b] [--dtype float32|bfloat16]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch_fl  # noqa: F401  (registers the flagos device)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_workload as w  # noqa: E402

# What "agree" means here. Host driver: the same CPU kernels, so equal. Cuda
# driver: FlagGems' kernels and CUDA's fused attention (the reference runs
# PyTorch's default SDPA) sum in other orders, so logits differ slightly and a
# greedy choice may flip only where the reference had a near tie.
AGREE = {
    ("host", "float32"): dict(max_logit=1e-5, loss_rel=1e-5),
    ("host", "bfloat16"): dict(max_logit=1e-2, loss_rel=1e-5),
    ("cuda", "float32"): dict(max_logit=1e-3, loss_rel=1e-3),
    ("cuda", "bfloat16"): dict(max_logit=0.5, loss_rel=1e-3),
}


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def reference_training(size: str, steps: int, batch: int, length: int, seed: int) -> dict:
    """Native-CUDA training in a process that never loads torch_fl (pytorch/pytorch#161129)."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ref.pt")
        cmd = [sys.executable, os.path.abspath(w.__file__), "--device", "cuda", "--mode", "train",
               "--size", size, "--steps", str(steps), "--batch", str(batch), "--prompt-len", str(length),
               "--seed", str(seed), "--out", out]
        p = subprocess.run(cmd, env=env, cwd=d, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"the CUDA reference failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        return torch.load(out, weights_only=True)


def routing_report(summary: dict, top: int = 6) -> list:
    lines = []
    per_backend = {}
    for s in summary["stats"]:
        for backend, n in s["calls"].items():
            per_backend.setdefault(backend, []).append((n, s["op"].split("::")[-1]))
    for backend, ops in sorted(per_backend.items(), key=lambda kv: -sum(n for n, _ in kv[1])):
        ops.sort(reverse=True)
        calls = sum(n for n, _ in ops)
        head = ", ".join(f"{op} {n:,}" for n, op in ops[:top])
        more = f", ... {len(ops) - top} more" if len(ops) > top else ""
        lines.append(f"  {backend:<9} {len(ops):3d} ops {calls:8,d} calls   {head}{more}")
    fallbacks = [(s["op"].split("::")[-1], s["cpu_fallbacks"]) for s in summary["stats"] if s["cpu_fallbacks"]]
    lines.append("  CPU fallbacks: " + (", ".join(f"{op} {n}" for op, n in fallbacks) if fallbacks else "none"))
    return lines


def main() -> int:
    driver = torch_fl.driver()
    on_cuda = driver == "cuda"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="0.6b" if on_cuda else "small", choices=tuple(w.SIZES))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    ref_dev = "cuda" if on_cuda else "cpu"
    crit = AGREE[(driver, a.dtype)]
    shape = w.SIZES[a.size]

    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, torch_fl {torch_fl.__version__}")
    print(f"driver '{driver}', {torch.flagos.device_count()} flagos device(s), FlagGems "
          f"{'enabled (' + str(len(torch_fl.flaggems.registered_ops())) + ' ops)' if torch_fl.is_flaggems_enabled() else 'off'}, "
          f"reference device {ref_dev}")
    print(f"model: Qwen3 '{a.size}' (random weights): {shape['num_hidden_layers']} layers, hidden "
          f"{shape['hidden_size']}, intermediate {shape['intermediate_size']}, {shape['num_attention_heads']} "
          f"heads / {shape['num_key_value_heads']} kv heads x {shape['head_dim']}, vocab {shape['vocab_size']}; "
          f"{a.dtype}, batch {a.batch}, prompt {a.prompt_len}, {a.new_tokens} new tokens")

    # Inference: greedy decoding over the KV cache, on flagos then on the reference.
    prompt = w.prompt_ids(shape["vocab_size"], a.batch, a.prompt_len, a.seed)
    t0 = time.perf_counter()
    model = w.build_model(a.size, a.dtype, "flagos", a.seed)
    print(f"parameters: {sum(q.numel() for q in model.parameters()) / 1e6:.1f} M (built in "
          f"{time.perf_counter() - t0:.1f} s)")
    torch_fl.routing.reset_stats()
    got = w.generate(model, prompt, a.new_tokens, "flagos")
    ref_model = w.build_model(a.size, a.dtype, ref_dev, a.seed)
    ref = w.generate(ref_model, prompt, a.new_tokens, ref_dev)
    agree = w.agreement(got, ref)

    # Training: a few AdamW steps (float32) on both, from the same initial
    # weights (inference left them unchanged).
    batches = w.train_batches(shape["vocab_size"], a.batch, a.prompt_len, a.seed)
    if a.dtype != "float32":
        model = w.build_model(a.size, "float32", "flagos", a.seed, train=True)
    tr = w.train(model, batches, a.train_steps, "flagos")
    del model
    if on_cuda:
        del ref_model
        print("training reference: native CUDA in a subprocess without torch_fl "
              "(CUDA autograd fails in a process with a PrivateUse1 backend, pytorch/pytorch#161129)")
        tr_ref = reference_training(a.size, a.train_steps, a.batch, a.prompt_len, a.seed)
    else:
        if a.dtype != "float32":
            ref_model = w.build_model(a.size, "float32", ref_dev, a.seed, train=True)
        tr_ref = w.train(ref_model, batches, a.train_steps, ref_dev)
        del ref_model
    summary = w.routing_summary()

    print()
    print(f"{'':10} {'prefill tok/s':>14} {'decode tok/s':>13} {'train step':>11}")
    for name, r, t in (("flagos", got, tr), (ref_dev, ref, tr_ref)):
        step = t["step_time_s"] if a.train_steps > 1 else t["first_step_s"]
        print(f"{name:10} {fmt_rate(r['timing']['prefill_tok_s']):>14} {fmt_rate(r['timing']['decode_tok_s']):>13} "
              f"{step * 1e3:>8.1f} ms")

    print()
    print(f"greedy tokens equal: {agree['tokens_equal']}/{agree['tokens_total']}; prefill logits "
          f"max |diff| {agree['max_logit_diff']:.2e} (mean {agree['mean_logit_diff']:.2e})")
    for d in agree["first_divergence"]:
        print(f"  sequence {d['seq']} parts at token {d['pos']} (reference top-1/top-2 margin {d['ref_margin']:.2e})")
    print(f"flagos tokens[0]: {got['tokens'][0].tolist()}")
    for i, (lf, lr) in enumerate(zip(tr["losses"], tr_ref["losses"])):
        print(f"train step {i}: loss flagos {lf:.6f}  {ref_dev} {lr:.6f}")
    loss_rel = max(abs(x - y) / abs(y) for x, y in zip(tr["losses"], tr_ref["losses"]))

    print()
    print("routing (torch_fl.routing.stats(), every flagos operator call of the demo):")
    for line in routing_report(summary):
        print(line)

    problems = []
    if agree["max_logit_diff"] > crit["max_logit"]:
        problems.append(f"prefill logits differ by {agree['max_logit_diff']:.2e} > {crit['max_logit']}")
    if a.dtype == "float32":
        # A flip is excused only at a near tie: a margin within a few times the logit difference.
        allowed = 0.0 if driver == "host" else max(1e-3, 10 * agree["max_logit_diff"])
        for d in agree["first_divergence"]:
            if d["ref_margin"] >= allowed:
                problems.append(f"sequence {d['seq']} parts from the reference at token {d['pos']} "
                                f"(margin {d['ref_margin']:.2e}, not a near tie)")
    if loss_rel > crit["loss_rel"]:
        problems.append(f"training losses differ by {loss_rel:.2e} relative > {crit['loss_rel']}")
    if sum(s["cpu_fallbacks"] for s in summary["stats"]):
        print("note: some operators fell back to the CPU (see above)")
    print()
    if problems:
        print("AGREEMENT FAILED: " + "; ".join(problems))
        return 1
    print(f"flagos agrees with {ref_dev}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
