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
dtypes = set()
model.lm_head.register_forward_hook(lambda m, i, o: dtypes.add(str(o.dtype)))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=__USE_CPU__, bf16=__BF16__, report_to=[],
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
                  "param_device": str(weight.device), "losses": losses, "dtypes": sorted(dtypes),
                  "mixed_precision": trainer.accelerator.mixed_precision,
                  "weight": weight.detach().cpu().double().sum().item()}))
"""


def run(run_py, use_cpu, bf16=False):
    child = CHILD.replace("__USE_CPU__", str(use_cpu)).replace("__BF16__", str(bf16))
    rc, out, err = run_py(child, timeout=300)
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


def test_trainer_trains_in_bf16_on_flagos(run_py):
    # TrainingArguments refused bf16=True on flagos ("Your setup doesn't
    # support bf16/gpu"): transformers knows bf16 devices by type name.
    fp32, bf16 = run(run_py, False), run(run_py, False, bf16=True)
    assert bf16["args_device"] == "flagos:0" and bf16["param_device"] == "flagos:0", bf16
    assert bf16["mixed_precision"] == "bf16" and bf16["dtypes"] == ["torch.bfloat16"], bf16
    assert fp32["mixed_precision"] == "no" and fp32["dtypes"] == ["torch.float32"], fp32
    # Autocast rounds to bfloat16 (CUDA's operator lists): near the fp32 run, not equal to it.
    assert len(bf16["losses"]) == 4 and bf16["losses"] != fp32["losses"]
    assert bf16["losses"] == pytest.approx(fp32["losses"], rel=3e-2)


RESUME = r"""
import json, os, sys, tempfile
import torch, torch_fl
import transformers as T

class Data(torch.utils.data.Dataset):
    def __len__(self): return 32
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 128, (12,), generator=g), "labels": torch.tensor(i % 2)}

def train(out, max_steps, resume=None):
    torch.manual_seed(0)
    # Dropout draws from the model's device generator in every step.
    model = T.BertForSequenceClassification(T.BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_labels=2, hidden_dropout_prob=0.3))
    args = T.TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=max_steps,
                               save_steps=2, save_strategy="steps", logging_steps=1, report_to=[],
                               learning_rate=1e-3, seed=1, lr_scheduler_type="constant",
                               disable_tqdm=True)
    trainer = T.Trainer(model=model, args=args, train_dataset=Data())
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, model.classifier.weight.detach().cpu().double().sum().item(), str(model.device)

whole, halves = tempfile.mkdtemp(), tempfile.mkdtemp()
losses, weight, device = train(whole, 4)
train(halves, 2)
checkpoint = os.path.join(halves, "checkpoint-2")
resumed, resumed_weight, _ = train(halves, 4, resume=checkpoint)
keys = sorted(torch.load(os.path.join(checkpoint, "rng_state.pth"), weights_only=False))
print(json.dumps({"device": device, "losses": losses, "resumed": resumed, "weight": weight,
                  "resumed_weight": resumed_weight, "keys": keys}))
"""


def test_trainer_resumes_with_the_flagos_random_state(run_py):
    # transformers saves and restores the generators of the device types it
    # lists; flagos' joins them, so a resumed run draws the same dropout masks.
    rc, out, err = run_py(RESUME, timeout=300)
    assert rc == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["device"] == "flagos:0", got
    assert "flagos" in got["keys"], got
    assert len(got["losses"]) == 4 and got["resumed"][-2:] == got["losses"][-2:], got
    assert got["resumed_weight"] == got["weight"], got


PIPELINE = r"""
import json
import torch, torch_fl
import transformers as T
from tokenizers import Tokenizer, models, pre_tokenizers, processors

words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + "the a cat dog sat on mat good bad movie".split()
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                   special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
tokenizer = T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                      cls_token="[CLS]", sep_token="[SEP]")
torch.manual_seed(0)
model = T.BertForSequenceClassification(T.BertConfig(
    vocab_size=len(words), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, num_labels=3)).eval()
texts = ["the cat sat on the mat", "a bad movie", "good dog"]
want = T.pipeline("text-classification", model=model, tokenizer=tokenizer, device="cpu",
                  top_k=None)(texts)
got = {}
for name, kwargs in {"none": {}, "index": {"device": 0}, "name": {"device": "flagos"}}.items():
    model.to("flagos")
    pipe = T.pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=None, **kwargs)
    got[name] = {"pipe": str(pipe.device), "model": str(model.device), "out": pipe(texts)}
print(json.dumps({"want": want, "got": got}))
"""


def test_pipeline_keeps_a_flagos_model_on_flagos(run_py):
    # transformers maps "no device" and an index to an accelerator from a
    # fixed list, else to the CPU: a flagos model was moved to the CPU.
    rc, out, err = run_py(PIPELINE, timeout=300)
    assert rc == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    for name, got in result["got"].items():
        assert got["model"] == "flagos:0", (name, got)
        # device="flagos" stays unindexed, as device="cuda" does.
        assert got["pipe"] == ("flagos" if name == "name" else "flagos:0"), (name, got)
        # The host driver runs the CPU's kernels: the same scores, bit for bit.
        assert got["out"] == result["want"], (name, got)
