"""test_dpo.py — DPO (`trainer: dpo`, models/preference_head.h, data/preference_dataset.h)
against TRL 1.16's DPOTrainer + PyTorch 2.13 on the same tiny Llama, tokenizer, pairs and batches.

A byte-level BPE tokenizer is trained here (eos <|endoftext|>, also the pad token); a tiny random
LlamaForCausalLM (GQA 2:1) is saved as the starting policy. 12 preference pairs (standard
prompt / chosen / rejected strings of different lengths) train for 6 steps of 2 pairs in file
order (train_sampling_strategy sequential), AdamW lr 1e-3, gradient clipping at 1.0, in float32
(DPOConfig's bf16 and gradient_checkpointing defaults turned off on both sides).
TRL's reference is a frozen copy of the policy (ref_model); onyx's is the same starting policy's
log-probabilities computed once before step 1.

Cases (one PASS / FAIL line each), each comparing every step's logged loss, grad_norm,
learning_rate and every metric TRL logs that onyx logs (rewards/chosen, rewards/rejected,
rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, logits/chosen,
logits/rejected, mean_token_accuracy, entropy) within 1e-4 relative — to the value, or where it is
a small difference of large operands, to their magnitude (rewards: β·|logps|; logits/*: 1, a mean
logit near zero is a mean of O(1) logits):
  <loss_type>       sigmoid, hinge, ipo, exo_pair (label_smoothing 0.1), nca_pair, robust
                    (label_smoothing 0.1), bco_pair, sppo_hard, apo_zero, apo_down, discopop,
                    sft, sigmoid_norm
  weighted-list     loss_type [sigmoid, sft] with loss_weights [1.0, 0.5]
  lora              LoRA (r 4 on q_proj, v_proj; PEFT's initial adapter, B = 0, as a
                    peft_config folder for onyx): TRL's reference is the base with the adapter
                    off; onyx's the starting policy (the same model while B = 0)
  ref-model         TRL's ref_model with other weights (another random init of the same Llama)
                    against onyx's `ref_model: FOLDER`, and onyx.DPOTrainer(ref_model=<model>)
  precompute        TRL's precompute_ref_log_probs (no reference model; 3 pairs per reference
                    batch) against onyx with the same keys
  gpt2              a tiny GPT2LMHeadModel: a tied LM head, Dropout layers (disable_dropout)
  ddp               mpirun -np 2 (2 pairs each) = one process with gradient_accumulation_steps 2:
                    every logged value, the metrics averaged over the processes as TRL gathers them
  resume            resumed from the step-3 checkpoint: steps 4-6 logged as the whole run's
  eval              evaluations every 3 steps (batches of 3 pairs): eval_loss and TRL's eval_
                    metrics (the mean over the eval batches) within the same tolerance
  errors            a ref_model of another shape, an unknown loss_type, loss_weights of another
                    length, preference data without trainer: dpo: exit 1 naming why, nothing
                    written

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_dpo.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import copy
import json
import os
import subprocess
import sys

import torch
import transformers as tr
import tiny_causal_lm
from case_runner import run_cases, with_shared

ONYX = os.environ.get("ONYX", "build/onyx")
TOL = 1e-4
STEPS, BATCH, LR = 6, 2, 1e-3
METRICS = ["loss", "grad_norm", "learning_rate", "rewards/chosen", "rewards/rejected",
           "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
           "logits/chosen", "logits/rejected", "mean_token_accuracy", "entropy", "num_tokens"]
torch.set_num_threads(1)

WORDS = ["cat", "dog", "tree", "river", "stone", "cloud", "light", "sound", "bread", "glass",
         "paper", "metal"]
PAIRS = [{"prompt": f"Define {w}:",
          "chosen": f" a {w} is a thing people name {w}" + " indeed" * (i % 3),
          "rejected": f" no idea" + " at all" * (i % 2)} for i, w in enumerate(WORDS)]


def write_config(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


class Setup:
    def __init__(self, tmp):
        self.tmp = tmp
        corpus = [p["prompt"] + p["chosen"] + p["rejected"] for p in PAIRS] * 4
        self.tok, self.tok_dir, self.base_dir = tiny_causal_lm.make(tmp, corpus)
        self.data = os.path.join(tmp, "pairs.jsonl")
        with open(self.data, "w") as f:
            for p in PAIRS:
                f.write(json.dumps(p) + "\n")


def trl_run(s, name, dpo, peft_dir=None, lr=LR, ref_copy=True, base=None, ref_dir=None):
    """TRL's per-step log entries (the reference: a frozen copy, the adapter off with peft_dir,
    or with ref_copy False TRL's precompute_ref_log_probs)."""
    import datasets
    from trl import DPOConfig, DPOTrainer
    datasets.disable_progress_bar()
    args = DPOConfig(output_dir=os.path.join(s.tmp, "trl-" + name), report_to=[], use_cpu=True,
                     per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=lr,
                     logging_steps=1, save_strategy="no", train_sampling_strategy="sequential",
                     dataset_num_proc=None, disable_tqdm=True, seed=0, bf16=False,
                     gradient_checkpointing=False, **dpo)
    # eager attention: PyTorch's CPU SDPA kernel in a training forward (with gradients) is less
    # exact than its float32 math (summed log-probabilities ~3e-5 relative from a float64 forward,
    # where onyx's and eager's are within 1e-7)
    base = base or s.base_dir
    model = tr.AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager")
    kw = {}
    if peft_dir:
        import peft
        model = peft.PeftModel.from_pretrained(model, peft_dir, is_trainable=True)
    elif ref_copy:
        kw["ref_model"] = tr.AutoModelForCausalLM.from_pretrained(ref_dir or base,
                                                                  attn_implementation="eager")
    trainer = DPOTrainer(model=model, args=args, processing_class=s.tok,
                         train_dataset=datasets.Dataset.from_json(s.data), **kw)
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


def onyx_run(s, name, dpo, extra=None, base=None):
    out = os.path.join(s.tmp, "onyx-" + name)
    cfg = {"model": base or s.base_dir, "trainer": "dpo",
           "train_data": {"type": "preference", "path": s.data, "tokenizer": s.tok_dir},
           "output_dir": out, "max_steps": STEPS, "per_device_train_batch_size": BATCH,
           "learning_rate": LR, "logging_steps": 1, "save_strategy": "no",
           "train_sampling_strategy": "sequential", "disable_tqdm": True, "seed": 0,
           "bf16": False, "gradient_checkpointing": False}
    cfg.update(dpo)
    cfg.update(extra or {})
    path = os.path.join(s.tmp, f"onyx-{name}.yaml")
    write_config(path, cfg)
    p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"onyx train exited {p.returncode}: {p.stderr[-800:]}")
    with open(os.path.join(out, "log_history.jsonl")) as f:
        return [e for e in map(json.loads, f) if "loss" in e]


def scale_of(k, t, beta):
    """The magnitude a metric is computed from: a value near zero made by cancellation (a log-ratio
    of two sums of log-probabilities, a mean logit) is compared relative to its operands'."""
    if k.startswith("rewards/") and k != "rewards/accuracies":
        return beta * max(abs(t["logps/chosen"]), abs(t["logps/rejected"]))
    if k.startswith("logits/"):
        return 1.0
    return 1e-2


def compare(theirs, ours, beta):
    """(ok, message): every step's metrics within TOL relative (to the value, or to the magnitude
    of its operands when it is smaller: scale_of)."""
    if len(theirs) != STEPS or len(ours) != STEPS:
        return False, f"{len(ours)} onyx log entries, {len(theirs)} TRL's (want {STEPS})"
    worst, where = 0.0, ""
    for step, (t, o) in enumerate(zip(theirs, ours), 1):
        for k in METRICS:
            if k not in t:
                continue
            if k not in o:
                return False, f"step {step}: onyx logs no '{k}'"
            err = abs(o[k] - t[k]) / max(abs(t[k]), scale_of(k, t, beta))
            if abs(o[k] - t[k]) > 1e-6 and err > worst:
                worst, where = err, f"{k} at step {step}: onyx {o[k]:.6g}, TRL {t[k]:.6g}"
    ok = worst < TOL
    return ok, (f"{STEPS} steps, {len(METRICS)} values each: loss {theirs[0]['loss']:.4f} -> "
                f"{theirs[-1]['loss']:.4f}, margins {theirs[-1]['rewards/margins']:.3g}; worst "
                f"rel err {worst:.1e}" + (f" ({where})" if worst else ""))


def loss_case(dpo):
    def case(s):
        name = "-".join(dpo["loss_type"]) if isinstance(dpo["loss_type"], list) else dpo["loss_type"]
        return compare(trl_run(s, name, dpo), onyx_run(s, name, dpo), dpo["beta"])
    return case


def case_lora(s):
    import peft
    base = tr.LlamaForCausalLM.from_pretrained(s.base_dir)
    torch.manual_seed(1)
    pm = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                   target_modules=["q_proj", "v_proj"],
                                                   task_type="CAUSAL_LM"))
    init = os.path.join(s.tmp, "init-adapter")
    pm.save_pretrained(init)
    dpo = {"loss_type": "sigmoid", "beta": 0.5}
    lr = {"learning_rate": 1e-2}
    theirs = trl_run(s, "lora", dpo, peft_dir=init, lr=1e-2)
    ours = onyx_run(s, "lora", dpo, dict(lr, peft_config=init))
    return compare(theirs, ours, dpo["beta"])


def case_eval(s):
    """Evaluations every 3 steps on the training pairs: eval_loss and TRL's eval_ metrics."""
    import datasets
    from trl import DPOConfig, DPOTrainer
    datasets.disable_progress_bar()
    dpo = {"loss_type": "sigmoid", "beta": 0.5}
    ev = {"eval_strategy": "steps", "eval_steps": 3, "per_device_eval_batch_size": 3}
    args = DPOConfig(output_dir=os.path.join(s.tmp, "trl-eval"), report_to=[], use_cpu=True,
                     per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=LR,
                     logging_steps=1, save_strategy="no", train_sampling_strategy="sequential",
                     dataset_num_proc=None, disable_tqdm=True, seed=0, bf16=False,
                     gradient_checkpointing=False, **dpo, **ev)
    pairs = datasets.Dataset.from_json(s.data)
    trainer = DPOTrainer(
        model=tr.LlamaForCausalLM.from_pretrained(s.base_dir, attn_implementation="eager"),
        ref_model=tr.LlamaForCausalLM.from_pretrained(s.base_dir, attn_implementation="eager"),
        args=args, processing_class=s.tok, train_dataset=pairs, eval_dataset=pairs)
    trainer.train()
    theirs = [e for e in trainer.state.log_history if "eval_loss" in e]
    out = os.path.join(s.tmp, "onyx-eval")
    onyx_run(s, "eval", dpo, dict(ev, eval_data={"type": "preference", "path": s.data,
                                                 "tokenizer": s.tok_dir}))
    with open(os.path.join(out, "log_history.jsonl")) as f:
        ours = [e for e in map(json.loads, f) if "eval_loss" in e][:2]  # (then `onyx train`'s own)
    keys = [k for k in theirs[0] if k.startswith("eval_") and not k.endswith(
        ("_runtime", "_per_second"))] if theirs else []
    if len(theirs) != 2 or len(ours) != 2:
        return False, f"{len(ours)} onyx evaluations, {len(theirs)} TRL's (want 2)"
    worst, where = 0.0, ""
    for t, o in zip(theirs, ours):
        for k in keys:
            if k not in o:
                return False, f"onyx logs no '{k}'"
            plain = {kk[5:]: v for kk, v in t.items() if kk.startswith("eval_")}
            err = abs(o[k] - t[k]) / max(abs(t[k]), scale_of(k[5:], plain, dpo["beta"]))
            if err > worst:
                worst, where = err, f"{k}: onyx {o[k]:.6g}, TRL {t[k]:.6g}"
    return worst < TOL, (f"2 evaluations, {len(keys)} values each ({', '.join(keys[:4])}, ...): "
                         f"worst rel err {worst:.1e}" + (f" ({where})" if worst else ""))


def case_gpt2(s):
    """GPT-2: a tied LM head (the embedding) and Dropout layers (disable_dropout)."""
    torch.manual_seed(0)
    base = os.path.join(s.tmp, "gpt2")
    tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=len(s.tok), n_embd=32, n_layer=2, n_head=2,
                                     n_positions=128)).save_pretrained(base)
    dpo = {"loss_type": "sigmoid", "beta": 0.5}
    return compare(trl_run(s, "gpt2", dpo, base=base), onyx_run(s, "gpt2", dpo, base=base),
                   dpo["beta"])


def case_precompute(s):
    dpo = {"loss_type": "sigmoid", "beta": 0.5, "precompute_ref_log_probs": True,
           "precompute_ref_batch_size": 3}
    return compare(trl_run(s, "precompute", dpo, ref_copy=False),
                   onyx_run(s, "precompute", dpo), dpo["beta"])


def case_errors(s):
    bad = []
    other = os.path.join(s.tmp, "other-arch")  # a reference of another shape
    cfg = tr.AutoConfig.from_pretrained(s.base_dir)
    cfg.hidden_size, cfg.intermediate_size = 16, 32
    tr.LlamaForCausalLM(cfg).save_pretrained(other)
    for tag, extra, want in (
            ("ref-arch", {"trainer": "dpo", "ref_model": other},
             "the reference must be the policy's architecture"),
            ("loss-type", {"trainer": "dpo", "loss_type": "kto"}, "is not a DPO loss"),
            ("weights", {"trainer": "dpo", "loss_type": ["sigmoid", "sft"], "loss_weights": [1]},
             "1 weights for 2 loss types"),
            ("no-trainer", {"trainer": "default"}, "train it with trainer: dpo")):
        out = os.path.join(s.tmp, "e-" + tag)
        cfg = {"model": s.base_dir,
               "train_data": {"type": "preference", "path": s.data, "tokenizer": s.tok_dir},
               "output_dir": out, "max_steps": 1, "disable_tqdm": True}
        cfg.update(extra)
        path = os.path.join(s.tmp, f"e-{tag}.yaml")
        write_config(path, cfg)
        p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=300)
        if p.returncode != 1 or want not in p.stderr or os.path.exists(out):
            bad.append(f"{tag}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
    return not bad, "; ".join(bad) or ("a ref_model of another shape, an unknown loss_type, "
                                       "loss_weights of another length and preference data "
                                       "without trainer: dpo all exit 1 naming why, nothing "
                                       "written")


def case_ddp(s):
    """mpirun -np 2 with 2 pairs per process = one process with 2 pairs and
    gradient_accumulation_steps 2: the same losses and metrics (each a mean over both processes'
    micro-batches, as TRL gathers them) and num_tokens over both."""
    import shutil
    if not shutil.which("mpirun"):
        return False, "mpirun is not installed (setup.sh installs OpenMPI)"
    dpo = {"loss_type": "sigmoid", "beta": 0.5}
    runs = {}
    for name, launch, extra in (("ddp", ["mpirun", "--oversubscribe", "--bind-to", "none",
                                         "--allow-run-as-root", "-np", "2"], {}),
                                ("ga", [], {"gradient_accumulation_steps": 2})):
        out = os.path.join(s.tmp, "onyx-" + name)
        cfg = {"model": s.base_dir, "trainer": "dpo",
               "train_data": {"type": "preference", "path": s.data, "tokenizer": s.tok_dir},
               "output_dir": out, "max_steps": 3, "per_device_train_batch_size": BATCH,
               "learning_rate": LR, "logging_steps": 1, "save_strategy": "no",
               "train_sampling_strategy": "sequential", "disable_tqdm": True, "seed": 0,
               "bf16": False, "gradient_checkpointing": False, **dpo, **extra}
        path = os.path.join(s.tmp, f"onyx-{name}.yaml")
        write_config(path, cfg)
        p = subprocess.run(launch + [ONYX, "train", path], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != 0:
            return False, f"{name}: exit {p.returncode}: {p.stderr[-500:]}"
        with open(os.path.join(out, "log_history.jsonl")) as f:
            runs[name] = [e for e in map(json.loads, f) if "loss" in e]
    a, b = runs["ddp"], runs["ga"]
    for step, (x, y) in enumerate(zip(a, b), 1):
        for k in METRICS:
            if k not in y or k not in x or abs(x[k] - y[k]) > 1e-6 * max(1.0, abs(y[k])):
                return False, f"step {step} {k}: 2 processes {x.get(k)}, one process {y.get(k)}"
    return len(a) == 3, (f"3 steps, {len(METRICS)} values each equal (loss {a[-1]['loss']:.4f}, "
                         f"num_tokens {a[-1]['num_tokens']:.0f})")


def case_resume(s):
    """A run resumed from its step-3 checkpoint logs steps 4 to 6 as the whole run did (the
    reference computed again from the starting policy, not the checkpoint)."""
    dpo = {"loss_type": "sigmoid", "beta": 0.5, "save_strategy": "steps", "save_steps": 3}
    onyx_run(s, "whole", dpo)
    whole = os.path.join(s.tmp, "onyx-whole")
    resumed = onyx_run(s, "resumed", dpo, {"resume_from_checkpoint":
                                           os.path.join(whole, "checkpoint-3")})
    with open(os.path.join(whole, "log_history.jsonl")) as f:
        first = {e["step"]: e for e in map(json.loads, f) if "loss" in e}
    again = {e["step"]: e for e in resumed}
    for step in (4, 5, 6):
        if first.get(step) != again.get(step):
            return False, f"step {step}: whole {first.get(step)}, resumed {again.get(step)}"
    return True, "steps 4-6 resumed from checkpoint-3 log the same 14 values each"


def case_ref_model(s):
    """TRL's ref_model with other weights than the policy's (another random init of the same
    Llama): `ref_model: FOLDER`, its log-probabilities computed once before step 1."""
    cfg = tr.AutoConfig.from_pretrained(s.base_dir)
    torch.manual_seed(7)
    ref_dir = os.path.join(s.tmp, "ref-model")
    tr.LlamaForCausalLM(cfg).save_pretrained(ref_dir)
    dpo = {"loss_type": "sigmoid", "beta": 0.5}
    theirs = trl_run(s, "ref-model", dpo, ref_dir=ref_dir)
    ours = onyx_run(s, "ref-model", dpo, {"ref_model": ref_dir})
    ok, msg = compare(theirs, ours, dpo["beta"])
    if not ok:
        return ok, msg
    # onyx.DPOTrainer(ref_model=<a model object>) logs what the config did
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "python"))
    import test_package
    test_package.build_package()
    sys.path.insert(0, test_package.TARGET)
    import datasets
    import onyx
    out = os.path.join(s.tmp, "onyx-py-ref-model")
    args = onyx.DPOConfig(output_dir=out, per_device_train_batch_size=BATCH, max_steps=STEPS,
                          learning_rate=LR, logging_steps=1, save_strategy="no",
                          train_sampling_strategy="sequential", disable_tqdm=True, seed=0,
                          bf16=False, gradient_checkpointing=False, report_to="none", **dpo)
    onyx.DPOTrainer(model=tr.AutoModelForCausalLM.from_pretrained(s.base_dir),
                    ref_model=tr.AutoModelForCausalLM.from_pretrained(ref_dir), args=args,
                    processing_class=s.tok,
                    train_dataset=datasets.Dataset.from_json(s.data)).train()
    with open(os.path.join(out, "log_history.jsonl")) as f:
        py = [e for e in map(json.loads, f) if "loss" in e]
    ok2, msg2 = compare(theirs, py, dpo["beta"])
    return ok2, msg + ("; onyx.DPOTrainer(ref_model=model) too" if ok2 else "; Python: " + msg2)


def main():
    with_setup = with_shared(Setup)
    cases = []
    for lt in ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair",
               "sppo_hard", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"):
        dpo = {"loss_type": lt, "beta": 0.5}
        if lt in ("exo_pair", "robust"):
            dpo["label_smoothing"] = 0.1
        cases.append((lt, with_setup(loss_case(dpo))))
    cases.append(("weighted-list", with_setup(loss_case(
        {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "beta": 0.5}))))
    cases.append(("lora", with_setup(case_lora)))
    cases.append(("precompute", with_setup(case_precompute)))
    cases.append(("ref-model", with_setup(case_ref_model)))
    cases.append(("ddp", with_setup(case_ddp)))
    cases.append(("resume", with_setup(case_resume)))
    cases.append(("gpt2", with_setup(case_gpt2)))
    cases.append(("eval", with_setup(case_eval)))
    cases.append(("errors", with_setup(case_errors)))
    return run_cases(cases, "onyx-test-dpo-")


if __name__ == "__main__":
    sys.exit(main())
