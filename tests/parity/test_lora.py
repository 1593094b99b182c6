"""test_lora.py — LoRA in PEFT's format (src/models/lora.cc) against PEFT 0.21 + PyTorch 2.13.

A tiny LlamaForCausalLM (random, GQA 2:1) is the base. PEFT's get_peft_model wraps a copy with
LoraConfig(r=4, lora_alpha=8, target_modules=[q_proj, v_proj, down_proj]) and saves that initial
adapter; `onyx train` starts from it (`peft_config: FOLDER`), PyTorch trains the PEFT model the
way onyx does (sequential batches of 4, AdamW lr 1e-2 without weight decay, linear decay, gradient
clipping at 1.0) for 20 steps.

Cases (one PASS / FAIL line each):
  adapters-equal   onyx's adapter_model.safetensors has PEFT's tensor names and, after 20
                   steps, every adapter tensor within 1e-4 (relative Frobenius error; no element
                   off by more than 1e-3 of the tensor's largest) of
                   PEFT's; every logged loss within 1e-4
  peft-loads       peft.PeftModel.from_pretrained(base, onyx's output_dir) gives the logits of the
                   PyTorch-trained PEFT model (1e-4), and its adapter_config.json is PEFT's
  base-frozen      onyx's model.safetensors is the base model (adapters only in the adapter file),
                   bit for bit;
                   the optimizer state holds the adapters only (its length is their element count
                   plus 16-element alignment)
  merge-export     `onyx export OUT --merge-lora --output DIR` (a Hugging Face folder that
                   transformers' AutoModelForCausalLM loads), `--merge-lora --output m.onnx` and
                   the unmerged `--output a.onnx` (adapters as nodes), the ONNX files run by
                   onnxruntime: each gives the PEFT model's logits (1e-4)
  resume           a run resumed from checkpoint-10 of a 20-step run ends with its adapters, bit
                   for bit
  lora-errors      target_modules matching nothing: exit 1 naming the model's linear layers; an
                   adapter file with a tensor no module has: exit 1 naming it;
                   model_init_kwargs.dtype float16, and bfloat16 without LoRA (nothing frozen):
                   exit 1 saying why, nothing written
  bf16-base        the same run with `model_init_kwargs: {dtype: bfloat16}` (the frozen linear
                   weights stored in bf16, multiplied with bf16 inputs and float32 accumulation)
                   against PyTorch doing exactly that: the PEFT model with its frozen Linear
                   weights (lm_head too) rounded to bf16, their inputs rounded to bf16 in the
                   forward and their output gradients in the backward. The first two losses (the
                   forward, then the first update) within 2e-6; after 20 steps every adapter within
                   1e-2 (relative Frobenius) and every loss within 1e-3 — float32 summation-order
                   differences flip single bf16 roundings, which later steps amplify; and against
                   the float32 run, losses within 1e-2; `onyx plan` reports the frozen weights at about half their
                   float32 bytes; model.safetensors holds them as BF16 (= the rounded base), every
                   other tensor as the base has it
  bf16-mixed       the same run with `bf16: true` (mixed precision: bf16 GEMM inputs, float32
                   master weights) against PEFT trained the same way under CPU autocast bf16
                   (Transformers' bf16=True on a CPU): every loss within 1e-3; the adapters
                   closer to autocast's than autocast's are to float32's (relative Frobenius,
                   worst tensor), onyx's distance from its float32 run within 0.5-2x autocast's;
                   and not the float32 run (losses differ, by less than 1e-2)

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_lora.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import copy
import json
import os
import shutil
import subprocess
import sys

import re

import numpy as np
import torch
import transformers as tr
from case_runner import run_cases, with_shared
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as load_torch
from torch_train import train_like_onyx

ONYX = os.environ.get("ONYX", "build/onyx")
TOL = 1e-4
STEPS, BATCH, LR = 20, 4, 1e-2
torch.set_num_threads(1)


def base_model(intermediate_size=96):
    cfg = tr.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=intermediate_size,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return tr.LlamaForCausalLM(cfg)


def write_config(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


class RoundGrad(torch.autograd.Function):
    """Identity forward; the incoming gradient rounded to bfloat16 (what onyx's dX GEMM reads)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.bfloat16().float()


def bf16_frozen_linears(model):
    """onyx's bf16 storage of frozen Linear weights, in PyTorch: each frozen nn.Linear's weight
    rounded to bf16, its input rounded to bf16 and its output's gradient rounded to bf16 (the
    products are then exact in float32; only the float32 summation order differs). Returns the
    rounded modules' names."""
    names = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or mod.weight.requires_grad:
            continue
        with torch.no_grad():
            mod.weight.copy_(mod.weight.bfloat16().float())
        # rounded forward, identity backward (a cast's backward would round dX too)
        mod.register_forward_pre_hook(
            lambda m, a: (a[0] + (a[0].bfloat16().float() - a[0]).detach(),) + tuple(a[1:]))
        mod.register_forward_hook(lambda m, a, out: RoundGrad.apply(out))
        names.append(name)
    return names


class Run:
    def __init__(self, tmp):
        import peft
        self.tmp = tmp
        self.base = base_model()
        self.base_dir = os.path.join(tmp, "base")
        self.base.save_pretrained(self.base_dir)
        lc = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                             target_modules=["q_proj", "v_proj", "down_proj"],
                             task_type="CAUSAL_LM")
        torch.manual_seed(1)
        self.pm = peft.get_peft_model(copy.deepcopy(self.base), lc)
        with torch.no_grad():  # B starts at zero in PEFT; nonzero here so A trains from step 1
            for n, p in self.pm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
        self.init_dir = os.path.join(tmp, "init-adapter")
        self.pm.save_pretrained(self.init_dir)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 97, (16, 12)).astype(np.int64)
        self.data = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}
        self.data_path = os.path.join(tmp, "train.safetensors")
        save_file(self.data, self.data_path)
        # onyx
        self.out = os.path.join(tmp, "out")
        cfg = {"model": self.base_dir, "peft_config": self.init_dir, "train_data": self.data_path,
               "output_dir": self.out, "max_steps": STEPS, "per_device_train_batch_size": BATCH,
               "learning_rate": LR, "weight_decay": 0.0, "max_grad_norm": 1.0,
               "logging_steps": 1, "save_strategy": "steps", "save_steps": STEPS,
               "train_sampling_strategy": "sequential", "disable_tqdm": True}
        write_config(os.path.join(tmp, "cfg.yaml"), cfg)
        p = subprocess.run([ONYX, "train", os.path.join(tmp, "cfg.yaml")], capture_output=True,
                           text=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError(f"onyx train exited {p.returncode}: {p.stderr[-800:]}")
        with open(os.path.join(self.out, "log_history.jsonl")) as f:
            self.onyx_losses = [json.loads(l)["loss"] for l in f if '"loss"' in l]
        self.cfg = cfg
        # PyTorch + PEFT, the same schedule
        self.torch_losses = train_like_onyx(self.pm, self.data, STEPS, BATCH, LR)


def adapter_errors(out, pm, onyx_losses, torch_losses, tol=TOL, loss_tol=TOL):
    """(ok, message): onyx's adapters and losses in `out` against the trained PEFT model `pm`:
    per tensor the relative Frobenius error within tol (no element off by more than 10 tol of the
    tensor's largest), every loss within loss_tol."""
    import peft
    got = load_file(os.path.join(out, "adapter_model.safetensors"))
    ref = {k: v.detach().numpy() for k, v in peft.get_peft_model_state_dict(pm).items()}
    if sorted(got) != sorted(ref):
        return False, f"tensor names {sorted(got)[:3]}... vs PEFT's {sorted(ref)[:3]}..."
    # Per tensor: the relative Frobenius error within 1e-4, and no element off by more than 1e-3
    # of the tensor's largest. (An element whose gradient stays near Adam's epsilon turns float
    # rounding into update noise — d(g / (|g| + eps)) / dg ~ 1 / eps — so one element may drift
    # past 1e-4 of the largest while the tensor agrees to 1e-5.)
    fro = max(float(np.linalg.norm(got[k] - ref[k]) / np.linalg.norm(ref[k])) for k in ref)
    worst = max(float(np.abs(got[k] - ref[k]).max() / np.abs(ref[k]).max()) for k in ref)
    lerr = max(abs(a - b) / abs(b) for a, b in zip(onyx_losses, torch_losses))
    ok = fro < tol and worst < 10 * tol and lerr < loss_tol and len(onyx_losses) == STEPS
    return ok, (f"{len(ref)} adapter tensors (PEFT's names) after {STEPS} steps: worst relative "
                f"Frobenius error {fro:.1e}, worst element {worst:.1e} of its tensor's largest; "
                f"losses {torch_losses[0]:.4f} -> {torch_losses[-1]:.4f}, worst rel {lerr:.1e}")


def case_adapters(r):
    return adapter_errors(r.out, r.pm, r.onyx_losses, r.torch_losses)


def train_variant(r, name, **over):
    """`onyx train` on r's config with `over` into r.tmp/out-<name>: (config path, output dir,
    logged losses, a fresh trainable PEFT model at the initial adapter), or raises."""
    import peft
    out = os.path.join(r.tmp, "out-" + name)
    path = os.path.join(r.tmp, name + ".yaml")
    write_config(path, dict(r.cfg, output_dir=out, **over))
    p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"onyx train exited {p.returncode}: {p.stderr[-500:]}")
    with open(os.path.join(out, "log_history.jsonl")) as f:
        losses = [json.loads(l)["loss"] for l in f if '"loss"' in l]
    pm = peft.PeftModel.from_pretrained(copy.deepcopy(r.base), r.init_dir, is_trainable=True)
    return path, out, losses, pm


def case_bf16_base(r):
    path, out, losses, pm = train_variant(r, "bf16", model_init_kwargs={"dtype": "bfloat16"})
    rounded = bf16_frozen_linears(pm)
    torch_losses = train_like_onyx(pm, r.data, STEPS, BATCH, LR)
    ok, msg = adapter_errors(out, pm, losses, torch_losses, tol=1e-2, loss_tol=1e-3)
    first = max(abs(a - b) / abs(b) for a, b in zip(losses[:2], torch_losses[:2]))
    ok = ok and first < 2e-6
    msg += f"; first two losses rel {first:.1e}"
    vs_f32 = max(abs(a - b) / abs(b) for a, b in zip(losses, r.onyx_losses))
    # memory: `onyx plan` reports the frozen weights at about half their float32 bytes
    pl = subprocess.run([ONYX, "plan", path], capture_output=True, text=True)
    m = re.search(r"frozen weights +([\d.]+) MiB +\(([\d.]+) MiB of them bf16; ([\d.]+) MiB as "
                  r"float32\)", pl.stdout)
    # the saved base: the rounded linear weights as BF16, everything else as the base has it
    saved = load_torch(os.path.join(out, "model.safetensors"))
    base = load_torch(os.path.join(r.base_dir, "model.safetensors"))
    bf16_names = [k for k, v in saved.items() if v.dtype == torch.bfloat16]
    rounded_w = {n.replace("base_model.model.", "").replace(".base_layer", "") + ".weight"
                 for n in rounded}
    same = all(k in saved and torch.equal(saved[k], base[k].bfloat16() if k in rounded_w
                                          else base[k]) for k in base)
    ok = ok and vs_f32 < 1e-2 and m is not None and float(m[1]) < 0.8 * float(m[3]) and \
        sorted(bf16_names) == sorted(rounded_w) and same
    return ok, (msg + f"; vs the float32 run: losses rel {vs_f32:.1e}; plan: "
                f"{m[0] if m else 'no frozen-weights line: ' + pl.stdout[-300:]}; "
                f"{len(bf16_names)} BF16 tensors saved (= the {len(rounded)} rounded Linears: "
                f"{sorted(bf16_names) == sorted(rounded_w)}), base otherwise unchanged: {same}")


def case_bf16_mixed(r):
    """`bf16: true` (mixed precision) on a LoRA run: the adapters and losses against PEFT trained
    the same way under CPU autocast bf16 (Transformers' bf16=True on a CPU), and not the float32
    run's."""
    import peft
    _, out, losses, pm = train_variant(r, "bf16-mixed", bf16=True)
    torch_losses = train_like_onyx(pm, r.data, STEPS, BATCH, LR, autocast_dtype=torch.bfloat16)
    # bf16 moves adapters trained this briefly by a few percent (Adam turns the rounding of
    # small gradients into update noise), in PyTorch as in onyx, and two bf16 runs that round at
    # different places (autocast also keeps every Linear output bf16) differ by as much: the
    # adapters are checked against that effect's own size rather than a fixed bound.
    got = load_file(os.path.join(out, "adapter_model.safetensors"))
    f32 = load_file(os.path.join(r.out, "adapter_model.safetensors"))
    ac = {k: v.detach().numpy() for k, v in peft.get_peft_model_state_dict(pm).items()}
    pf = {k: v.detach().numpy() for k, v in peft.get_peft_model_state_dict(r.pm).items()}
    if sorted(got) != sorted(ac):
        return False, f"tensor names {sorted(got)[:3]}... vs PEFT's {sorted(ac)[:3]}..."

    def fro(a, b):
        return max(float(np.linalg.norm(a[k] - b[k]) / np.linalg.norm(b[k])) for k in b)

    vs_ac, effect_torch, effect_onyx = fro(got, ac), fro(ac, pf), fro(got, f32)
    lerr = max(abs(a - b) / abs(b) for a, b in zip(losses, torch_losses))
    vs_f32 = max(abs(a - b) / abs(b) for a, b in zip(losses, r.onyx_losses))
    ok = (len(losses) == STEPS and lerr < 1e-3 and 0 < vs_f32 < 1e-2 and vs_ac < effect_torch
          and 0.5 <= effect_onyx / effect_torch <= 2)
    return ok, (f"{len(ac)} adapters after {STEPS} steps: vs PEFT under autocast bf16 "
                f"{vs_ac:.1e} (relative Frobenius, worst tensor), less than autocast's own "
                f"distance from float32 {effect_torch:.1e}; onyx's bf16 effect {effect_onyx:.1e} "
                f"(ratio {effect_onyx / effect_torch:.2f}); losses {losses[0]:.4f} -> "
                f"{losses[-1]:.4f}, vs autocast's worst rel {lerr:.1e}, vs onyx float32 {vs_f32:.1e}")


def case_peft_loads(r):
    import peft
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(r.base), r.out).eval()
    r.pm.eval()
    x = torch.tensor(r.data["input_ids"][:3])
    with torch.no_grad():
        a = loaded(input_ids=x).logits.numpy()
        b = r.pm(input_ids=x).logits.numpy()
    err = float(np.abs(a - b).max() / np.abs(b).max())
    cfg = peft.PeftConfig.from_pretrained(r.out)
    ok = err < TOL and cfg.r == 4 and sorted(cfg.target_modules) == ["down_proj", "q_proj", "v_proj"]
    return ok, (f"PeftModel.from_pretrained(base, onyx output): logits rel {err:.1e} of the "
                f"PyTorch-trained model; PeftConfig r={cfg.r}, targets {sorted(cfg.target_modules)}")


def case_base_frozen(r):
    w = load_file(os.path.join(r.out, "model.safetensors"))
    base = load_file(os.path.join(r.base_dir, "model.safetensors"))
    same = all(np.array_equal(w[k], base[k]) for k in base if k in w)
    missing = [k for k in base if k not in w]
    adapters = load_file(os.path.join(r.out, "adapter_model.safetensors"))
    n_adapter = sum(v.size for v in adapters.values())
    opt = load_file(os.path.join(r.out, f"checkpoint-{STEPS}", "optimizer.safetensors"))
    n_state = opt["exp_avg"].size
    ok = same and not missing and n_adapter <= n_state <= n_adapter + 16 * len(adapters)
    return ok, (f"{len(base)} base tensors unchanged bit for bit; optimizer state {n_state} "
                f"elements for {n_adapter} adapter elements ({len(adapters)} tensors)")


def case_merge_export(r):
    """onyx export of the LoRA output: merged into a Hugging Face folder (transformers loads it),
    merged into ONNX, and unmerged (the adapters as graph nodes): all give the PEFT model's logits."""
    import onnxruntime as ort
    merged_dir = os.path.join(r.tmp, "merged")
    x = r.data["input_ids"][:3]
    r.pm.eval()
    with torch.no_grad():
        ref = r.pm(input_ids=torch.tensor(x)).logits.numpy()
    errs = {}
    p = subprocess.run([ONYX, "export", r.out, "--merge-lora", "--output", merged_dir],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return False, f"export --merge-lora (folder) exited {p.returncode}: {p.stderr[-300:]}"
    hf = tr.AutoModelForCausalLM.from_pretrained(merged_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        errs["HF folder (transformers)"] = hf(input_ids=torch.tensor(x)).logits.numpy()
    for tag, extra in (("merged ONNX (onnxruntime)", ["--merge-lora"]),
                       ("unmerged ONNX (onnxruntime)", [])):
        path = os.path.join(r.tmp, f"{len(errs)}.onnx")
        p = subprocess.run([ONYX, "export", r.out, "--output", path] + extra, capture_output=True,
                           text=True)
        if p.returncode != 0:
            return False, f"export {extra} exited {p.returncode}: {p.stderr[-300:]}"
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {"input_ids": x, "attention_mask": np.ones_like(x),
                 "position_ids": np.tile(np.arange(x.shape[1], dtype=np.int64), (x.shape[0], 1))}
        feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
        errs[tag] = sess.run(["logits"], feeds)[0]
    rel = {k: float(np.abs(v - ref).max() / np.abs(ref).max()) for k, v in errs.items()}
    ok = all(e < TOL for e in rel.values())
    return ok, "; ".join(f"{k}: logits rel {e:.1e}" for k, e in rel.items())


def case_resume(r):
    """A 20-step LoRA run saved at step 10; a second run resumed from checkpoint-10 ends with the
    same adapters bit for bit (read back from the checkpoint's adapter_model.safetensors)."""
    cfg = {"model": r.base_dir, "peft_config": r.init_dir, "train_data": r.data_path,
           "output_dir": os.path.join(r.tmp, "res"), "max_steps": STEPS,
           "per_device_train_batch_size": BATCH, "learning_rate": LR, "weight_decay": 0.0,
           "logging_steps": 1, "save_strategy": "steps", "save_steps": 10,
           "train_sampling_strategy": "sequential", "disable_tqdm": True}
    write_config(os.path.join(r.tmp, "res.yaml"), cfg)
    p = subprocess.run([ONYX, "train", os.path.join(r.tmp, "res.yaml")], capture_output=True,
                       text=True)
    ck = os.path.join(r.tmp, "res", "checkpoint-10")
    p2 = subprocess.run([ONYX, "train", os.path.join(r.tmp, "res.yaml"), "--output_dir",
                         os.path.join(r.tmp, "res2"), "--resume_from_checkpoint", ck],
                        capture_output=True, text=True)
    if p.returncode or p2.returncode:
        return False, f"exit {p.returncode}/{p2.returncode}: {(p.stderr + p2.stderr)[-400:]}"
    a = load_file(os.path.join(r.tmp, "res2", "adapter_model.safetensors"))
    b = load_file(os.path.join(r.tmp, "res", "adapter_model.safetensors"))
    ok = sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in b)
    return ok, ("resumed from checkpoint-10 of a 20-step run: the same final adapters bit for "
                "bit" if ok else "resumed adapters differ")


def case_errors(r):
    bad = []
    cfg = {"model": r.base_dir, "train_data": r.data_path, "output_dir": os.path.join(r.tmp, "e1"),
           "max_steps": 1, "lora": {"r": 4, "target_modules": ["query"]}}
    write_config(os.path.join(r.tmp, "e1.yaml"), cfg)
    p = subprocess.run([ONYX, "train", os.path.join(r.tmp, "e1.yaml")], capture_output=True, text=True)
    if p.returncode != 1 or "match no linear layer" not in p.stderr or "q_proj" not in p.stderr:
        bad.append(f"no-match: {p.returncode} {p.stderr.strip()[-200:]}")
    d = os.path.join(r.tmp, "bad-adapter")
    shutil.copytree(r.init_dir, d)
    t = load_file(os.path.join(d, "adapter_model.safetensors"))
    t["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"] = np.zeros((4, 64), np.float32)
    save_file(t, os.path.join(d, "adapter_model.safetensors"))
    cfg = dict(cfg, lora=None, peft_config=d, output_dir=os.path.join(r.tmp, "e2"))
    del cfg["lora"]
    write_config(os.path.join(r.tmp, "e2.yaml"), cfg)
    p = subprocess.run([ONYX, "train", os.path.join(r.tmp, "e2.yaml")], capture_output=True, text=True)
    if p.returncode != 1 or "up_proj.lora_A.weight" not in p.stderr:
        bad.append(f"extra tensor: {p.returncode} {p.stderr.strip()[-200:]}")
    # model_init_kwargs: a dtype the CPUs cannot multiply in, and bf16 with nothing frozen
    for tag, extra, want in (("float16", {"lora": {"r": 4, "target_modules": ["q_proj"]},
                                          "model_init_kwargs": {"dtype": "float16"}},
                              "must be bfloat16, float32 or auto"),
                             ("nothing-frozen", {"model_init_kwargs": {"torch_dtype": "bfloat16"}},
                              "no frozen linear weight")):
        c = {k: v for k, v in cfg.items() if k not in ("lora", "peft_config")}
        c.update(extra, output_dir=os.path.join(r.tmp, "e-" + tag))
        write_config(os.path.join(r.tmp, f"e-{tag}.yaml"), c)
        p = subprocess.run([ONYX, "train", os.path.join(r.tmp, f"e-{tag}.yaml")],
                           capture_output=True, text=True)
        if p.returncode != 1 or want not in p.stderr or os.path.exists(c["output_dir"]):
            bad.append(f"{tag}: {p.returncode} {p.stderr.strip()[-200:]}")
    return not bad, "; ".join(bad) or ("all fail with exit 1 and write nothing: no matching layer "
                                       "(naming the layers), an adapter tensor no module has, "
                                       "model_init_kwargs dtype float16, bf16 with nothing frozen")


def main():
    # One training run (Run) serves every case: made by the first case, its failure each case's.
    with_run = with_shared(Run)

    cases = [("adapters-equal", case_adapters), ("peft-loads", case_peft_loads),
             ("base-frozen", case_base_frozen), ("merge-export", case_merge_export),
             ("resume", case_resume), ("lora-errors", case_errors), ("bf16-base", case_bf16_base),
             ("bf16-mixed", case_bf16_mixed)]
    return run_cases([(n, with_run(f)) for n, f in cases], "onyx-test-lora-")


if __name__ == "__main__":
    sys.exit(main())
