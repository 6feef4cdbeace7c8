"""Hugging Face Trainer on flagos, as a program that never names a device runs it.

With torch_fl loaded on a torch without CUDA, accelerate places the model on
the machine's accelerator (flagos); TrainingArguments.device must agree
(torch_fl/_transformers.py). Each run is a fresh process: accelerate keeps its
device in process-wide state.
"""

import json

import pytest

pytest.importorskip("accelerate")

pytestmark = pytest.mark.host_only  # a CUDA build: transformers and accelerate both pick cuda

CHILD = r"""
import json, sys, tempfile
import torch, torch_fl
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

class Data(torch.utils.data.Dataset):
    def __len__(self): return 16
    def __getitem__(self, i):
        ids = (torch.arange(12) * (i + 3)) % 256
        return {"input_ids": ids, "labels": ids}

torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(LlamaConfig(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=256))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=__USE_CPU__, report_to=[],
                         max_steps=4, per_device_train_batch_size=4, save_strategy="no",
                         disable_tqdm=True, learning_rate=1e-3, seed=1)
trainer = Trainer(model=model, args=args, train_dataset=Data())
losses = []
class Record(__import__("transformers").TrainerCallback):
    def on_log(self, a, state, control, logs=None, **kw):
        if logs and "loss" in logs: losses.append(logs["loss"])
trainer.add_callback(Record())
args.logging_steps = 1
trainer.train()
weight = model.model.layers[1].mlp.down_proj.weight
print(json.dumps({"args_device": str(args.device), "accelerator": str(trainer.accelerator.device),
                  "param_device": str(weight.device), "losses": losses,
                  "weight": weight.detach().cpu().double().sum().item()}))
"""


def run(run_py, use_cpu):
    rc, out, err = run_py(CHILD.replace("__USE_CPU__", str(use_cpu)), timeout=300)
    assert rc == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_trainer_trains_on_flagos_as_on_the_cpu(run_py):
    flagos, cpu = run(run_py, False), run(run_py, True)
    assert flagos["args_device"] == "flagos:0", flagos
    assert flagos["param_device"] == "flagos:0", flagos
    assert flagos["accelerator"].startswith("flagos"), flagos
    assert cpu["args_device"] == "cpu" and cpu["param_device"] == "cpu", cpu
    # The host driver runs the CPU's kernels: the same losses and weights, bit for bit.
    assert len(flagos["losses"]) == 4
    assert flagos["losses"] == cpu["losses"]
    assert flagos["weight"] == cpu["weight"]
