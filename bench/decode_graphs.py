"""Graphs and torch.compile on flagos against cuda: a Qwen3 decode step with a static
KV cache (0.6B shape, random weights, bf16, batch 1).

Rows (each one timed against ``cuda`` in the same process; CUDA's forward is
untouched by torch_fl):
- ``graph``: one decode step captured in a graph and replayed:
  ``torch.cuda.graph`` on cuda tensors, ``torch.flagos.graph`` on flagos tensors
  with every operator on CUDA's kernels (``* = cuda``) and with the default
  routing (FlagGems where it serves an operator);
- ``eager``: the same decode step run eagerly, for scale;
- ``compile``: greedy decoding of N tokens from the prefilled static cache, the
  decode step under ``torch.compile(mode="reduce-overhead", fullgraph=True)``
  (Inductor, then CUDA graphs), tokens per second; and the time of the first
  compiled decode (compilation included), per device. The loop is the
  benchmark's own rather than HF ``generate()``: transformers 5's generate
  reads a graph's output after the next replay has overwritten it
  ("accessing tensor output of CUDAGraphs that has been overwritten"), on
  cuda as on flagos.

Method: graph and eager rows: warm-up, then R rounds; in each round every side
runs its N steps, the first side rotating; ratio = median of per-round ratios
(cuda time / side time, so >1 means faster than cuda); an A/A row times cuda
against itself. Compile rows: one side after the other (each compiles its own
model), R timed decodes each; ratio of the median tokens per second.

    PYTHONPATH=. python bench/decode_graphs.py [--size 0.6b] [--rounds 7] [--skip compile]
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)
from qwen3 import run_meta  # noqa: E402  (bench/qwen3.py)


def decode_step_fn(model, cache, device, batch):
    """A static-cache decode step over fixed input tensors, and its inputs."""
    import torch

    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    pos = torch.zeros(1, dtype=torch.long, device=device)

    def step():
        out = model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
        return out.logits

    return step, ids, pos


def write_counters(cache):
    """The static cache's per-layer write counters: transformers 5 writes a
    step's keys at its own counter, which every step (and every replay)
    advances, not at the cache_position passed; 4.x has none."""
    import torch

    return [layer.cumulative_length for layer in getattr(cache, "layers", ())
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]


def rewind(cache, position):
    """Puts the cache's write position back to `position`, in place (a captured
    graph holds the counters' addresses)."""
    for counter in write_counters(cache):
        counter.fill_(position)


def build(size, device, prompt_len, max_len, batch):
    """The model, its static cache filled to prompt_len by the prefill, and the
    prefill's greedy next token [batch]."""
    import torch
    from transformers import StaticCache

    import qwen3_workload as wl

    model = wl.build_model(size, torch.bfloat16, device, seed=0)
    model.generation_config.pad_token_id = 0
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    prompt = wl.prompt_ids(model.config.vocab_size, batch, prompt_len, seed=0).to(device)
    with torch.no_grad():
        logits = model(input_ids=prompt, past_key_values=cache,
                       cache_position=torch.arange(prompt_len, device=device), use_cache=True).logits
    return model, cache, torch.argmax(logits[:, -1], -1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="0.6b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=50, help="decode steps per timed block")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per compiled decode")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--skip", choices=("graph", "eager", "compile", "flaggems"), action="append",
                   default=[])
    p.add_argument("--json")
    a = p.parse_args(argv)

    meta = run_meta(a)
    if meta is None:
        return 0
    import torch
    import torch_fl

    import qwen3_workload as wl

    if torch_fl.driver() != "cuda":
        print(f"skipped: torch_fl runs the {torch_fl.driver()!r} driver, not 'cuda'")
        return 0
    max_len = a.prompt_len + max(a.steps, a.new_tokens) + 8
    routes = {"flagos all-cuda": "cuda", "flagos": ""}
    if "flaggems" in a.skip or not torch_fl.is_flaggems_enabled():
        routes.pop("flagos")
    res = {"meta": {**meta, "flaggems": torch_fl.is_flaggems_enabled()}}
    print(f"Qwen3 {a.size} decode, bf16, batch {a.batch}, {meta['gpu']}, torch {torch.__version__}")
    med = statistics.median

    def compare(times):
        out = {}
        for side, ts in times.items():
            ratios = [c / t for c, t in zip(times["cuda"], ts)]
            out[side] = {"us_per_step": med(ts) * 1e6, "vs_cuda": med(ratios), "per_round": ratios}
        return out

    # ---- graph and eager decode steps --------------------------------------------
    if "graph" not in a.skip or "eager" not in a.skip:
        models = {"cuda": build(a.size, "cuda", a.prompt_len, max_len, a.batch)[:2]}
        # The prefill on CUDA's kernels: the all-cuda side's decode step then
        # starts from the cache CUDA's has, so its logits can be compared bit for bit.
        torch_fl.routing.set_route("*", "cuda")
        models["flagos"] = build(a.size, "flagos", a.prompt_len, max_len, a.batch)[:2]
        torch_fl.routing.set_route("*", "")
        sides = {"cuda": ("cuda", None), "cuda (A/A)": ("cuda", None)}
        sides.update({k: ("flagos", v) for k, v in routes.items()})
        steps, graphs, outs = {}, {}, {}
        for side, (key, route) in sides.items():
            model, cache = models[key]
            dev = key
            fn, ids, pos = decode_step_fn(model, cache, dev, a.batch)
            pos.fill_(a.prompt_len)
            rewind(cache, a.prompt_len)
            if route is not None:
                torch_fl.routing.set_route("*", route)
            with torch.no_grad():
                for _ in range(3):
                    fn()  # warm-up: kernels compiled, caches filled
                wl.synchronize(dev)
                mod = torch.get_device_module(dev)  # torch.cuda or torch.flagos
                g = torch.cuda.CUDAGraph() if dev == "cuda" else torch.flagos.FlagosGraph()
                s = mod.Stream()
                s.wait_stream(mod.current_stream())
                with mod.stream(s):
                    fn()
                wl.synchronize(dev)
                with mod.graph(g):  # records the step; runs nothing
                    out = fn()
                rewind(cache, a.prompt_len)
                eager_out = fn()
                rewind(cache, a.prompt_len)
                g.replay()
                try:  # the whole GPU: a device-side error is named with its side
                    torch.cuda.synchronize()
                except Exception as e:
                    raise RuntimeError(f"decode_graphs: the {side!r} side failed in its set-up") from e
                outs[side] = (out.float().cpu(), eager_out.float().cpu())
            steps[side], graphs[side] = (fn, route, cache), (g, route)

        def timed(side, kind):
            key, _ = sides[side]
            fn, route, cache = steps[side]
            if route is not None:
                torch_fl.routing.set_route("*", route)
            g = graphs[side][0]
            with torch.no_grad():
                rewind(cache, a.prompt_len)  # a block of steps writes positions prompt_len...
                wl.synchronize(key)
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    g.replay() if kind == "graph" else fn()
                wl.synchronize(key)
            return (time.perf_counter() - t0) / a.steps

        for kind in ("graph", "eager"):
            if kind in a.skip:
                continue
            times = {s: [] for s in sides}
            names = list(sides)
            for r in range(a.rounds):
                for side in names[r % len(names):] + names[:r % len(names)]:
                    times[side].append(timed(side, kind))
            res[kind] = compare(times)
        res["graph_equals_eager"] = {s: bool(torch.equal(o[0], o[1])) for s, o in outs.items()}
        res["equal_to_cuda"] = {s: bool(torch.equal(o[0], outs["cuda"][0])) for s, o in outs.items()}
        torch_fl.routing.set_route("*", "")
        del models, steps, graphs
        report(res, a, ("graph", "eager"))

    # ---- torch.compile(mode="reduce-overhead"): greedy decode over a static cache ----
    if "compile" not in a.skip:
        import torch._dynamo

        comp = {}
        for side, (dev, route) in {"cuda": ("cuda", None), "flagos all-cuda": ("flagos", "cuda")}.items():
            torch._dynamo.reset()
            if route is not None:
                torch_fl.routing.set_route("*", route)
            model, cache, first_ids = build(a.size, dev, a.prompt_len, max_len, a.batch)
            step, ids, pos = decode_step_fn(model, cache, dev, a.batch)
            for counter in write_counters(cache):  # mutated in the graph: static, or no CUDA graph
                torch._dynamo.mark_static_address(counter)
            compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)

            def decode():
                """a.new_tokens greedy steps from the prefilled cache: the compiled
                step (CUDA graphs under reduce-overhead) and an argmax per token."""
                with torch.no_grad():
                    rewind(cache, a.prompt_len)
                    ids.copy_(first_ids.view(a.batch, 1))
                    pos.fill_(a.prompt_len)
                    toks = []
                    wl.synchronize(dev)
                    t0 = time.perf_counter()
                    for _ in range(a.new_tokens):
                        torch.compiler.cudagraph_mark_step_begin()
                        nxt = torch.argmax(compiled()[:, -1], -1)
                        toks.append(nxt)
                        ids.copy_(nxt.view(a.batch, 1))
                        pos.add_(1)
                    wl.synchronize(dev)
                    return torch.stack(toks, 1).cpu(), time.perf_counter() - t0

            toks, first = decode()  # compiles (and records the graphs)
            times = [decode()[1] for _ in range(a.rounds)]
            comp[side] = {"first_decode_s": first, "tok_s": a.batch * a.new_tokens / med(times),
                          "times": times, "tokens": toks}
            print(f"  ({side}: first decode {first:.1f} s, {comp[side]['tok_s']:.1f} tok/s)", flush=True)
            torch_fl.routing.set_route("*", "")
            del model, cache, compiled
        base = comp["cuda"]
        res["compile"] = {s: {"first_decode_s": c["first_decode_s"], "tok_s": c["tok_s"],
                              "vs_cuda": c["tok_s"] / base["tok_s"],
                              "first_vs_cuda": c["first_decode_s"] / base["first_decode_s"],
                              "tokens_equal_cuda": bool(torch.equal(c["tokens"], base["tokens"]))}
                          for s, c in comp.items()}

        report(res, a, ("compile",))
    return 0


def report(res, a, sections):
    """Prints the finished sections and writes every result so far to --json, so
    that a run cut short by a time limit still leaves what it measured."""
    for kind in sections:
        if kind in ("graph", "eager") and kind in res:
            print(f"{kind} decode step ({a.steps} steps x {a.rounds} rounds; x cuda: >1 is faster)")
            for side, r in res[kind].items():
                print(f"  {side:<16} {r['us_per_step']:>9.1f} us/step  x cuda {r['vs_cuda']:5.3f}  per round "
                      + " ".join(f"{x:.3f}" for x in r["per_round"]))
    if "graph" in sections and "graph_equals_eager" in res:
        print(f"  replay == eager: {res['graph_equals_eager']}; logits == cuda's: {res['equal_to_cuda']}")
    if "compile" in sections and "compile" in res:
        print(f"torch.compile(mode='reduce-overhead') greedy decode, {a.new_tokens} tokens, static cache")
        for side, r in res["compile"].items():
            print(f"  {side:<16} {r['tok_s']:>9.1f} tok/s  x cuda {r['vs_cuda']:5.3f}  first decode "
                  f"{r['first_decode_s']:.1f} s (x cuda {r['first_vs_cuda']:.2f})  tokens == cuda: "
                  f"{r['tokens_equal_cuda']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
