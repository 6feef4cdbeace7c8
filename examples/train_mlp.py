"""Main job: train a small MLP on the flagos device and on the CPU, from the
same initial weights and data, and check that the losses agree step by step.

    python examples/train_mlp.py [--steps N]
"""

import argparse
import time

import torch
import torch_fl  # noqa: F401  (registers the flagos device)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(),
        torch.nn.Linear(128, 128), torch.nn.LayerNorm(128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def train(device: str, steps: int, data, targets) -> list:
    model = make_model(0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = data.to(device), targets.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(1234)
    data = torch.randn(256, 64, generator=gen)
    targets = torch.randint(0, 10, (256,), generator=gen)

    print(f"torch {torch.__version__}, torch_fl {torch_fl.__version__}, "
          f"driver '{torch_fl.driver()}', {torch.flagos.device_count()} flagos device(s)")
    t0 = time.perf_counter()
    flagos_losses = train("flagos", args.steps, data, targets)
    t1 = time.perf_counter()
    cpu_losses = train("cpu", args.steps, data, targets)
    t2 = time.perf_counter()

    worst = max(abs(a - b) for a, b in zip(flagos_losses, cpu_losses))
    for i in range(0, args.steps, max(1, args.steps // 5)):
        print(f"step {i:3d}  loss flagos {flagos_losses[i]:.6f}  cpu {cpu_losses[i]:.6f}")
    print(f"final loss flagos {flagos_losses[-1]:.6f}  cpu {cpu_losses[-1]:.6f}  "
          f"max |diff| {worst:.2e}")
    print(f"time: flagos {t1 - t0:.2f}s, cpu {t2 - t1:.2f}s; "
          f"peak flagos memory {torch.flagos.max_memory_allocated() / 2**20:.2f} MiB")
    ok = worst <= 1e-4 and flagos_losses[-1] < flagos_losses[0]
    print("losses agree" if ok else "LOSSES DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
