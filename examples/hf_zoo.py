"""Tiny Hugging Face models of many architectures, run on one device and
compared with another: the loss of one forward, every parameter's gradient
after the backward, and greedy generate() tokens for generative models.

Used by tests/python/test_hf_models.py, and as a command:

    python examples/hf_zoo.py --ref cpu                  # flagos against the CPU
    python examples/hf_zoo.py --ref cuda --all-cuda      # every operator on CUDA's kernels
    python examples/hf_zoo.py --ref cuda --dtype bfloat16 bert gpt2

With --ref cuda the reference runs in a child process that never imports
torch_fl: in a process that registered flagos, PyTorch's autograd cannot run
a backward over cuda tensors (pytorch#161129, docs/gpu.md). --all-cuda routes
every operator to CUDA's kernels and then requires bit-equality; otherwise
(FlagGems where it serves) results must agree within the dtype's tolerance.
Exits non-zero when a model disagrees or fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch

V = 128  # vocabulary of every text model
B, L = 2, 12  # batch and sequence length of the inputs


def configs() -> dict:
    """name -> (config, model class, input kind); seconds each on two CPU cores."""
    import transformers as t

    dec = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4)
    enc_dec = dict(vocab_size=V, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   encoder_attention_heads=4, decoder_attention_heads=4)
    return {
        "gpt2": (t.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64),
                 t.GPT2LMHeadModel, "causal"),
        "llama": (t.LlamaConfig(**dec, num_key_value_heads=2), t.LlamaForCausalLM, "causal"),
        "mistral": (t.MistralConfig(**dec, num_key_value_heads=2, sliding_window=8),
                    t.MistralForCausalLM, "causal"),
        "gemma": (t.GemmaConfig(**dec, num_key_value_heads=1, head_dim=8), t.GemmaForCausalLM,
                  "causal"),
        "phi": (t.PhiConfig(**dec), t.PhiForCausalLM, "causal"),
        "opt": (t.OPTConfig(vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                            num_attention_heads=4, word_embed_proj_dim=32,
                            max_position_embeddings=64), t.OPTForCausalLM, "causal"),
        "bloom": (t.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4),
                  t.BloomForCausalLM, "causal"),
        "gpt_neox": (t.GPTNeoXConfig(**dec), t.GPTNeoXForCausalLM, "causal"),
        "falcon": (t.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4), t.FalconForCausalLM, "causal"),
        "mixtral": (t.MixtralConfig(**dec, num_key_value_heads=2, num_local_experts=4,
                                    num_experts_per_tok=2), t.MixtralForCausalLM, "causal"),
        "qwen2_moe": (t.Qwen2MoeConfig(**dec, num_key_value_heads=2, moe_intermediate_size=16,
                                       shared_expert_intermediate_size=32, num_experts=4,
                                       num_experts_per_tok=2), t.Qwen2MoeForCausalLM, "causal"),
        "mamba": (t.MambaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=8),
                  t.MambaForCausalLM, "causal"),
        "bert": (t.BertConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=64), t.BertForMaskedLM, "masked"),
        "roberta": (t.RobertaConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    max_position_embeddings=70), t.RobertaForMaskedLM, "masked"),
        "distilbert": (t.DistilBertConfig(vocab_size=V, dim=32, hidden_dim=64, n_layers=2,
                                          n_heads=4, max_position_embeddings=64),
                       t.DistilBertForMaskedLM, "masked"),
        "t5": (t.T5Config(vocab_size=V, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                          decoder_start_token_id=0), t.T5ForConditionalGeneration, "seq2seq"),
        "bart": (t.BartConfig(**enc_dec, encoder_layers=2, decoder_layers=2,
                              max_position_embeddings=64), t.BartForConditionalGeneration,
                 "seq2seq"),
        "whisper": (t.WhisperConfig(**enc_dec, encoder_layers=1, decoder_layers=1, num_mel_bins=16,
                                    max_source_positions=32, max_target_positions=32,
                                    decoder_start_token_id=1, pad_token_id=0),
                    t.WhisperForConditionalGeneration, "audio"),
        "vit": (t.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, image_size=32, patch_size=8, num_labels=5),
                t.ViTForImageClassification, "image"),
        "resnet": (t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                  num_labels=5), t.ResNetForImageClassification, "image"),
        "convnext": (t.ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
                                      num_labels=5), t.ConvNextForImageClassification, "image"),
        "clip": (t.CLIPConfig(text_config=dict(vocab_size=V, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4,
                                               max_position_embeddings=32),
                              vision_config=dict(hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=4,
                                                 image_size=32, patch_size=8),
                              projection_dim=16), t.CLIPModel, "text+image"),
    }


def inputs(kind: str, seed: int) -> dict:
    """CPU inputs (with labels) for a model of input kind `kind`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, L), generator=g)
    if kind == "causal":
        return dict(input_ids=ids, labels=ids)
    if kind == "masked":  # the last position padded: attention masks reach the kernels
        mask = torch.ones_like(ids)
        mask[:, -1] = 0
        return dict(input_ids=ids, attention_mask=mask, labels=ids)
    if kind == "seq2seq":
        return dict(input_ids=ids, labels=torch.randint(3, V, (B, 6), generator=g))
    if kind == "audio":
        return dict(input_features=torch.randn(B, 16, 64, generator=g),
                    labels=torch.randint(3, V, (B, 6), generator=g))
    images = torch.randn(B, 3, 32, 32, generator=g)
    if kind == "text+image":
        return dict(input_ids=ids, pixel_values=images, return_loss=True)
    return dict(pixel_values=images, labels=torch.randint(0, 5, (B,), generator=g))


def build(name: str, dtype=torch.float32):
    """Model `name` with seeded random weights, in eval mode (no dropout, so
    every device computes the same function), and its input kind."""
    config, cls, kind = configs()[name]
    torch.manual_seed(0)
    return cls(config).to(dtype).eval(), kind


def run_model(name: str, device: str, dtype=torch.float32) -> dict:
    """Loss (CPU float64), gradients (CPU float64, by parameter name) and greedy
    tokens (CPU; None for models that do not generate) of model `name` on
    `device`."""
    model, kind = build(name, dtype)
    model = model.to(device)
    x = {}
    for k, v in inputs(kind, seed=sum(map(ord, name))).items():
        if torch.is_tensor(v):
            v = v.to(device, dtype) if v.is_floating_point() else v.to(device)
        x[k] = v
    out = model(**x)
    out.loss.backward()
    grads = {n: p.grad.detach().cpu().double() for n, p in model.named_parameters()
             if p.grad is not None}
    tokens = None
    if kind in ("causal", "seq2seq"):
        prompt = x["input_ids"][:, :6]
        with torch.no_grad():
            tokens = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                    max_new_tokens=6, do_sample=False, pad_token_id=0).cpu()
    return dict(loss=out.loss.detach().cpu().double(), grads=grads, tokens=tokens)


def differences(got: dict, ref: dict) -> dict:
    """How far `got` is from `ref`: the loss's absolute difference; per gradient
    the largest error relative to the larger of that gradient's largest element
    and 1% of the model's largest gradient (some gradients are rounding noise
    around zero on every device: a key projection's bias, since softmax ignores
    a shift shared by all keys); whether everything is bit-equal; whether the
    tokens are equal."""
    assert got["grads"].keys() == ref["grads"].keys(), "different parameters have gradients"
    largest = max((g.abs().max().item() for g in ref["grads"].values()), default=0.0)
    worst, worst_name, exact = 0.0, "", torch.equal(got["loss"], ref["loss"])
    for n, g in got["grads"].items():
        r = ref["grads"][n]
        exact = exact and torch.equal(g, r)
        scale = max(r.abs().max().item(), 1e-2 * largest, 1e-12)
        err = (g - r).abs().max().item() / scale
        if not err <= worst:  # NaN counts as worst
            worst, worst_name = err, n
    tokens_equal = None if ref["tokens"] is None else torch.equal(got["tokens"], ref["tokens"])
    return dict(loss=(got["loss"] - ref["loss"]).abs().item(), grad=worst, grad_name=worst_name,
                exact=exact and tokens_equal is not False, tokens_equal=tokens_equal)


# Agreement required where other kernels run (FlagGems' against CUDA's or the CPU's).
TOLERANCE = {torch.float32: dict(loss=1e-4, grad=2e-3), torch.bfloat16: dict(loss=3e-2, grad=5e-2)}


def agrees(d: dict, dtype, exact: bool) -> bool:
    """Whether differences `d` pass: bit-equal where the same kernels ran
    (`exact`), else loss and gradients within TOLERANCE[dtype]."""
    if exact:
        return d["exact"]
    tol = TOLERANCE[dtype]
    return d["loss"] <= tol["loss"] and d["grad"] <= tol["grad"]


def _reference(names, dtype_name, path):
    """The child process of --ref cuda: no torch_fl, reference results saved."""
    dtype = getattr(torch, dtype_name)
    results = {}
    for name in names:
        try:
            results[name] = run_model(name, "cuda", dtype)
        except Exception as e:  # noqa: BLE001  (reported by the parent)
            results[name] = f"{type(e).__name__}: {e}"
    torch.save(results, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("models", nargs="*", help="architectures (default: all)")
    p.add_argument("--ref", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--all-cuda", action="store_true",
                   help="route every operator to CUDA's kernels and require bit-equality")
    p.add_argument("--_reference-to", dest="reference_to", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    known = configs()
    names = a.models or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if a.reference_to:
        _reference(names, a.dtype, a.reference_to)
        return 0
    dtype = getattr(torch, a.dtype)
    refs = {}
    if a.ref == "cuda":
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ref.pt")
            env = dict(os.environ, FLAGOS_AUTOLOAD="0")  # the child must not register flagos
            subprocess.run([sys.executable, os.path.abspath(__file__), *names, "--dtype", a.dtype,
                            "--_reference-to", path], env=env, check=True)
            refs = torch.load(path, weights_only=False)
    import torch_fl

    if a.all_cuda:
        torch_fl.routing.set_route("*", "cuda")
    bad = 0
    for name in names:
        try:
            ref = refs[name] if a.ref == "cuda" else run_model(name, "cpu", dtype)
            if isinstance(ref, str):
                raise RuntimeError(f"the {a.ref} reference failed: {ref}")
            d = differences(run_model(name, "flagos", dtype), ref)
        except Exception as e:  # noqa: BLE001  (one model's failure must not hide the others)
            bad += 1
            print(f"FAIL {name:10s} {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ok = agrees(d, dtype, exact=a.all_cuda)
        bad += not ok
        where = f" ({d['grad_name']})" if d["grad_name"] else ""
        print(f"{'ok  ' if ok else 'FAIL'} {name:10s} exact {str(d['exact']):5s} loss diff "
              f"{d['loss']:.2e}  worst gradient {d['grad']:.2e}{where}  tokens equal "
              f"{d['tokens_equal']}", flush=True)
    print(f"{len(names) - bad}/{len(names)} models agree with {a.ref} "
          f"({a.dtype}, {'all-cuda' if a.all_cuda else 'default routing'})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
