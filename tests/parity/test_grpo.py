"""test_grpo.py — GRPO (`trainer: grpo`, onyx.GRPOTrainer; train/grpo.h, models/grpo_head.h)
against TRL 1.16's GRPOTrainer + PyTorch 2.13 on the same tiny Llama, tokenizer, prompts, reward
functions and completions.

A byte-level BPE tokenizer is trained here (eos <|endoftext|>, also the pad token); a tiny random
LlamaForCausalLM (GQA 2:1, eager attention) is the starting policy; 8 prompts ("Define cat:", ...,
with an "answer" column). The completions are held equal: both trainers get them from the same
rollout_func (TRL's rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs}),
which tokenizes each prompt as TRL does and draws each completion's tokens from a seeded RNG (the
call number and the row: lengths 1..8; some end with eos, the others are cut at
max_completion_length 8). Two reward functions with TRL's signature: reward_len (−|tokens − 4|)
and reward_answer (1 when the decoded completion contains the row's answer column's first
letter, None when the completion is a single token: TRL's unscored rows). 8 completions per step
(num_generations 4: two prompts), in file order (shuffle_dataset False), AdamW lr 1e-2 (the
policy moves enough for the clipping to act), float32 (GRPOConfig's bf16 and
gradient_checkpointing defaults off on both sides).

Cases (one PASS / FAIL line each), each comparing every step's logged loss, grad_norm,
learning_rate and the metrics TRL logs (reward, reward_std, rewards/<f>/mean and /std,
frac_reward_zero_std, completions/* lengths and clipped_ratio, num_tokens, entropy, kl with beta,
clip_ratio/low_mean, low_min, high_mean, high_max, region_mean) within 1e-4 relative (to the
value, or 1e-2 where it is near zero):
  <loss_type>-b<beta>-it<n>  dapo, grpo, bnpo, dr_grpo, each with beta 0 / num_iterations 1 and
                    beta 0.04 / num_iterations 2; dapo with beta 0.04 / num_iterations 1 and
                    grpo with beta 0 / num_iterations 2
  mask-truncated    dapo, beta 0.04, mask_truncated_completions (the cut completions carry no
                    loss)
  accumulation      dapo, gradient_accumulation_steps 2 (two micro-batches of 4 per step): loss,
                    grad_norm and the rollout metrics (TRL shuffles the generation batch before
                    splitting it with torch's RNG, so the per-micro-batch means differ)
  lora              LoRA (r 4 on q_proj, v_proj) with beta 0.04: TRL's reference is the base with
                    the adapter off; onyx's the starting adapters (B = 0: the same model)
  lora-generate     onyx's own sampling with LoRA (the adapters unmerged: the Trainer's weights
                    themselves, no copy): with non-zero adapters and temperature 1e-3, every
                    completion equals the PEFT model's greedy generate
  cli-generate      `onyx train` with trainer: grpo and the CLI's built-in rewards (length,
                    regex): onyx's own generator samples (8 completions per step, up to 8
                    tokens); every step logs TRL's metric names with finite values, some step
                    has a gradient, and `onyx plot` draws the reward panel
  cli-python-reward  reward_funcs {type: python, function: module.function}: the function beside
                    the config gets TRL's keyword arguments (columns, completion_ids,
                    trainer_state, log_metric) in a worker process; its values are logged (None as
                    NaN); a raising function, one past its timeout and a missing module stop the
                    run (exit 1) naming why
  bf16              bf16 with gradient checkpointing (GRPOConfig's defaults): step 1 samples the
                    same completions as float32 (from the float32 weights); loss and entropy within
                    bf16's precision (2e-2), every value finite
  qlora             LoRA on a 4-bit (NF4) base: the run finishes with finite values, the adapters
                    get gradients and are saved
  all-truncated     mask_truncated_completions with every completion cut: loss and gradient 0
                    each step (TRL's clamped count), and training goes on
  resume            the same run resumed from its step-2 checkpoint logs steps 3 and 4 exactly
                    as the whole run did (the same completions sampled again)
  ddp               mpirun -np 2: the rollout metrics count both processes' completions
  python-errors     onyx.GRPOConfig / GRPOTrainer refuse fields onyx does not build, a reward
                    model by name, reward_weights of another length, an empty dataset
  errors            CLI: an unknown reward type, prompts without trainer: grpo, a generation
                    batch that is not whole groups, an unknown GRPO key: exit 1 naming why

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_grpo.py [filter]
The Python cases build the package first (tests/python/test_package.py build_package:
incremental). Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import math
import os
import random
import subprocess
import sys

import torch
import transformers as tr
import tiny_causal_lm
from case_runner import run_cases, with_shared

ONYX = os.environ.get("ONYX", "build/onyx")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4
STEPS, LR, G, MAXLEN = 4, 1e-2, 4, 8
torch.set_num_threads(1)

WORDS = ["cat", "dog", "tree", "river", "stone", "cloud", "light", "sound"]
ROWS = [{"prompt": f"Define {w}:", "answer": w} for w in WORDS]
METRICS = ["loss", "grad_norm", "learning_rate", "reward", "reward_std",
           "rewards/reward_len/mean", "rewards/reward_len/std", "rewards/reward_answer/mean",
           "rewards/reward_answer/std", "frac_reward_zero_std", "completions/mean_length",
           "completions/min_length", "completions/max_length", "completions/clipped_ratio",
           "completions/mean_terminated_length", "completions/min_terminated_length",
           "completions/max_terminated_length", "num_tokens", "entropy", "kl",
           "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean",
           "clip_ratio/high_max", "clip_ratio/region_mean"]
ROLLOUT = {"reward", "reward_std", "frac_reward_zero_std", "num_tokens"}


def write_config(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


class Setup:
    def __init__(self, tmp):
        self.tmp = tmp
        corpus = [r["prompt"] + " a " + r["answer"] for r in ROWS] * 4
        self.tok, self.tok_dir, self.base_dir = tiny_causal_lm.make(tmp, corpus)
        self.data = os.path.join(tmp, "prompts.jsonl")
        with open(self.data, "w") as f:
            for r in ROWS:
                f.write(json.dumps(r) + "\n")


shared = with_shared(Setup)


def make_rollout(tok):
    """The same completions for both trainers: call k's row i draws from Random(1000 k + i)."""
    calls = [0]
    eos = tok.eos_token_id

    def rollout_func(prompts, trainer):
        k = calls[0]
        calls[0] += 1
        prompt_ids = tok(text=prompts)["input_ids"]
        completions = []
        for i in range(len(prompts)):
            rng = random.Random(1000 * k + i)
            n = rng.randint(1, MAXLEN)
            ids = [rng.randrange(1, len(tok)) for _ in range(n)]
            if n < MAXLEN and rng.random() < 0.6:
                ids[-1] = eos
            completions.append(ids)
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None}
    return rollout_func


def reward_len(completion_ids, **kwargs):
    return [-abs(len(c) - 4.0) for c in completion_ids]


def reward_answer(completions, completion_ids, answer, **kwargs):
    return [None if len(ids) == 1 else float(a[0] in c)
            for c, ids, a in zip(completions, completion_ids, answer)]


def grpo_args(GRPOConfig, out, grpo):
    kw = dict(output_dir=out, report_to=[], per_device_train_batch_size=8,
              num_generations=G, max_completion_length=MAXLEN, max_steps=STEPS,
              learning_rate=LR, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
              bf16=False, gradient_checkpointing=False, shuffle_dataset=False)
    kw.update(grpo)
    return GRPOConfig(**kw)


def policy(s, adapter=None):
    """The starting policy: the base model, or a PEFT model with the adapter saved at `adapter`."""
    model = tr.AutoModelForCausalLM.from_pretrained(s.base_dir, attn_implementation="eager")
    if adapter:
        import peft
        model = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    return model


def trl_run(s, name, grpo, adapter=None):
    import datasets
    from trl import GRPOConfig, GRPOTrainer
    datasets.disable_progress_bar()
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = grpo_args(GRPOConfig, os.path.join(s.tmp, "trl-" + name),
                     dict(grpo, use_cpu=True))
    trainer = GRPOTrainer(model=policy(s, adapter), reward_funcs=[reward_len, reward_answer],
                          args=args, train_dataset=datasets.Dataset.from_list(ROWS),
                          processing_class=s.tok, rollout_func=make_rollout(s.tok))
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


def import_onyx():
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    import test_package
    test_package.build_package()
    sys.path.insert(0, test_package.TARGET)
    import onyx
    return onyx


def onyx_run(s, name, grpo, adapter=None):
    onyx = import_onyx()
    out = os.path.join(s.tmp, "onyx-" + name)
    args = grpo_args(onyx.GRPOConfig, out, grpo)
    model = policy(s, adapter) if adapter else s.base_dir
    trainer = onyx.GRPOTrainer(model=model, reward_funcs=[reward_len, reward_answer], args=args,
                               train_dataset=ROWS, processing_class=s.tok,
                               rollout_func=make_rollout(s.tok))
    trainer.train()
    with open(os.path.join(out, "log_history.jsonl")) as f:
        return [e for e in map(json.loads, f) if "loss" in e]


def compare(theirs, ours, keys=METRICS):
    if len(theirs) != STEPS or len(ours) != STEPS:
        return False, f"{len(ours)} onyx log entries, {len(theirs)} TRL's (want {STEPS})"
    worst, where, n = 0.0, "", 0
    for step, (t, o) in enumerate(zip(theirs, ours), 1):
        for k in keys:
            if k not in t:
                continue
            if k not in o:
                return False, f"step {step}: onyx logs no '{k}'"
            n += 1
            nan = lambda v: v is None or math.isnan(v)  # NaN: null in onyx's JSON log
            if nan(t[k]) and nan(o[k]):
                continue
            if nan(t[k]) or nan(o[k]):
                return False, f"step {step} {k}: onyx {o[k]}, TRL {t[k]}"
            err = abs(o[k] - t[k]) / max(abs(t[k]), 1e-2)
            if abs(o[k] - t[k]) > 1e-6 and err > worst or math.isnan(err):
                worst, where = err, f"{k} at step {step}: onyx {o[k]:.6g}, TRL {t[k]:.6g}"
    ok = worst < TOL
    return ok, (f"{STEPS} steps, {n} values: loss {theirs[0]['loss']:.4g} -> "
                f"{theirs[-1]['loss']:.4g}, clip {max(t.get('clip_ratio/region_mean', 0) for t in theirs):.3g}"
                f"; worst rel err {worst:.1e}" + (f" ({where})" if worst else ""))


def loss_case(loss_type, beta, iterations, extra=None):
    def case(s):
        grpo = dict({"loss_type": loss_type, "beta": beta, "num_iterations": iterations},
                    **(extra or {}))
        name = f"{loss_type}-b{beta}-it{iterations}" + ("-extra" if extra else "")
        return compare(trl_run(s, name, grpo), onyx_run(s, name, grpo))
    return case


def case_accumulation(s):
    grpo = {"loss_type": "dapo", "beta": 0.04, "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2}
    keys = ["loss", "grad_norm", "learning_rate"] + [k for k in METRICS if k in ROLLOUT or
                                                     k.startswith(("rewards/", "completions/"))]
    return compare(trl_run(s, "ga", grpo), onyx_run(s, "ga", grpo), keys)


def case_lora(s):
    """The same initial adapter (PEFT's init, seeded) as a PeftModel on both sides."""
    import peft
    torch.manual_seed(1)
    pm = peft.get_peft_model(tr.LlamaForCausalLM.from_pretrained(s.base_dir),
                             peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    adapter = os.path.join(s.tmp, "init-adapter")
    pm.save_pretrained(adapter)
    grpo = {"loss_type": "dapo", "beta": 0.04}
    return compare(trl_run(s, "lora", grpo, adapter), onyx_run(s, "lora", grpo, adapter))


def cli_config(s, name, extra):
    """A `trainer: grpo` config with the CLI's reward functions; returns (its path, output_dir)."""
    out = os.path.join(s.tmp, "cli-" + name)
    cfg = {"model": s.base_dir, "trainer": "grpo",
           "train_data": {"type": "prompts", "path": s.data, "tokenizer": s.tok_dir},
           "reward_funcs": [{"type": "length", "target": 4},
                            {"type": "regex", "pattern": ".*a", "name": "has_a"}],
           "num_generations": G, "max_completion_length": MAXLEN, "output_dir": out,
           "max_steps": STEPS, "per_device_train_batch_size": 8, "learning_rate": LR,
           "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True, "seed": 0,
           "bf16": False, "gradient_checkpointing": False, "beta": 0.04}
    cfg.update(extra)
    path = os.path.join(s.tmp, f"cli-{name}.yaml")
    write_config(path, cfg)
    return path, out


def case_lora_generate(s):
    """onyx's sampler reads the Trainer's own weights with the LoRA adapters as nodes of their own
    (no merged copy): with non-zero adapters (PEFT's init_lora_weights=False) and temperature 1e-6
    (argmax in effect), each completion onyx samples equals the PEFT model's greedy generate."""
    import peft
    torch.manual_seed(2)
    pm = peft.get_peft_model(tr.LlamaForCausalLM.from_pretrained(s.base_dir),
                             peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj", "gate_proj"],
                                             init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter = os.path.join(s.tmp, "random-adapter")
    pm.save_pretrained(adapter)
    seen = []

    def record(prompts, completion_ids, **kwargs):
        seen.extend(zip(prompts, completion_ids))
        return [float(len(c)) for c in completion_ids]
    onyx = import_onyx()
    args = grpo_args(onyx.GRPOConfig, os.path.join(s.tmp, "onyx-lora-generate"),
                     {"per_device_train_batch_size": 16, "num_generations": 2, "max_steps": 1,
                      "temperature": 1e-6, "learning_rate": 0.0})
    onyx.GRPOTrainer(model=policy(s, adapter), reward_funcs=record, args=args,
                     train_dataset=ROWS, processing_class=s.tok).train()
    model = policy(s, adapter).eval()
    bad = []
    for prompt, ids in seen:
        x = s.tok(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**x, do_sample=False, max_new_tokens=MAXLEN,
                                 eos_token_id=s.tok.eos_token_id, pad_token_id=s.tok.eos_token_id)
        want = out[0, x["input_ids"].shape[1]:].tolist()
        if list(ids) != want:
            bad.append(f"{prompt!r}: onyx {list(ids)}, PEFT {want}")
    if len(seen) != 16 or bad:
        return False, f"{len(seen)} completions; " + "; ".join(bad[:2])
    return True, f"16 completions of 8 prompts = the PEFT model's greedy ones"


def run_cli(s, name, extra):
    path, out = cli_config(s, name, extra)
    p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=600)
    return p, out


def case_cli_generate(s):
    p, out = run_cli(s, "generate", {})
    if p.returncode != 0:
        return False, f"onyx train exited {p.returncode}: {p.stderr[-600:]}"
    with open(os.path.join(out, "log_history.jsonl")) as f:
        logs = [e for e in map(json.loads, f) if "loss" in e]
    want = ["reward", "reward_std", "rewards/length/mean", "rewards/has_a/mean", "kl", "entropy",
            "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean",
            "frac_reward_zero_std", "num_tokens"]
    if len(logs) != STEPS:
        return False, f"{len(logs)} log entries (want {STEPS})"
    for e in logs:
        for k in want:
            if k not in e or not math.isfinite(e[k]):
                return False, f"step {e['step']}: '{k}' missing or not finite: {e.get(k)}"
    if not any(e["grad_norm"] > 0 for e in logs):
        return False, "no step had a gradient (every group's rewards equal?)"
    png = os.path.join(out, "curves.png")
    p = subprocess.run([ONYX, "plot", out, "--output", png], capture_output=True, text=True)
    if p.returncode != 0 or "(4 panels)" not in p.stdout:
        return False, f"onyx plot: {p.stdout.strip()} {p.stderr[-300:]} (want 4 panels: reward)"
    return True, (f"{STEPS} steps sampled by onyx: reward {logs[0]['reward']:.3g} -> "
                  f"{logs[-1]['reward']:.3g}, mean length {logs[0]['completions/mean_length']:.3g}"
                  "; onyx plot draws the reward panel")


REWARDS_PY = """
import time

def reward_len(completions, completion_ids, answer, trainer_state, log_metric, **kwargs):
    assert all(isinstance(c, str) for c in completions) and len(answer) == len(completions)
    print(1.0)  # a function's own output goes to stderr, not mistaken for an answer
    log_metric("calls", 1.0)
    return [float(len(ids)) for ids in completion_ids]

def reward_none(completion_ids, **kwargs):
    return [None] * len(completion_ids)

def reward_raises(**kwargs):
    raise KeyError("no such column")

def reward_sleeps(completion_ids, **kwargs):
    time.sleep(30)
"""


def case_cli_python_reward(s):
    """{type: python, function: module.function}: the function beside the config, called with
    TRL's keyword arguments in a worker process; its rewards and log_metric values are logged.
    A function that raises, one that does not answer within its timeout and a module that is not
    there stop the run (exit 1) naming why."""
    with open(os.path.join(s.tmp, "my_rewards.py"), "w") as f:
        f.write(REWARDS_PY)
    p, out = run_cli(s, "python-reward", {"reward_funcs": [
        {"type": "python", "function": "my_rewards.reward_len", "python": sys.executable},
        {"type": "python", "function": "my_rewards:reward_none", "python": sys.executable}],
        "max_steps": 2})
    if p.returncode != 0:
        return False, f"onyx train exited {p.returncode}: {p.stderr[-800:]}"
    with open(os.path.join(out, "log_history.jsonl")) as f:
        logs = [e for e in map(json.loads, f) if "loss" in e]
    for e in logs:  # reward_len is each completion's length
        if abs(e["rewards/reward_len/mean"] - e["completions/mean_length"]) > 1e-9:
            return False, f"step {e['step']}: rewards/reward_len/mean {e['rewards/reward_len/mean']}"
        none = e.get("rewards/reward_none/mean", 0.0)  # NaN (null in the JSON log)
        if e.get("calls") != 1.0 or not (none is None or math.isnan(none)):
            return False, f"step {e['step']}: calls {e.get('calls')}, reward_none {e.get('rewards/reward_none/mean')}"
    for fn, extra, want in (("reward_raises", {}, "KeyError: 'no such column'"),
                            ("reward_sleeps", {"timeout": 1}, "did not answer within 1 s"),
                            ("no_module.f", {}, "cannot load no_module.f")):
        spec = {"type": "python", "function": fn if "." in fn else "my_rewards." + fn,
                "python": sys.executable}
        spec.update(extra)
        p, _ = run_cli(s, "python-" + fn, {"reward_funcs": [spec], "max_steps": 1})
        if p.returncode != 1 or want not in p.stderr:
            return False, f"{fn}: exit {p.returncode}, stderr {p.stderr[-400:]!r} (want '{want}')"
    return True, (f"{len(logs)} steps: reward_len = completions/mean_length "
                  f"({logs[0]['completions/mean_length']:.3g}), log_metric logged, None -> NaN; "
                  "raising, hanging and missing functions stop the run naming why")


def case_bf16(s):
    """GRPOConfig's defaults bf16 and gradient checkpointing: the first step samples from the
    same float32 weights as a float32 run (the same completions and rewards); its loss and
    entropy agree to bf16's precision, and every value is finite."""
    p32, out32 = run_cli(s, "f32", {"max_steps": 2})
    p16, out16 = run_cli(s, "bf16", {"max_steps": 2, "bf16": True, "gradient_checkpointing": True})
    if p32.returncode != 0 or p16.returncode != 0:
        return False, f"onyx train exited {p32.returncode} / {p16.returncode}: {p16.stderr[-600:]}"

    def first(out):
        with open(os.path.join(out, "log_history.jsonl")) as f:
            return [e for e in map(json.loads, f) if "loss" in e]
    a, b = first(out32), first(out16)
    if any(v is None or not math.isfinite(v) for e in b for k, v in e.items() if k != "epoch"):
        return False, f"a bf16 value is not finite: {b}"
    if a[0]["reward"] != b[0]["reward"] or a[0]["num_tokens"] != b[0]["num_tokens"]:
        return False, f"step 1 sampled differently: reward {a[0]['reward']} vs {b[0]['reward']}"
    for k, tol in (("loss", 2e-2), ("entropy", 2e-2)):
        if abs(a[0][k] - b[0][k]) > tol * max(1.0, abs(a[0][k])):
            return False, f"step 1 {k}: float32 {a[0][k]:.5g}, bf16 {b[0][k]:.5g}"
    return True, (f"step 1: the same rewards; loss {a[0]['loss']:.5g} (float32) vs "
                  f"{b[0]['loss']:.5g} (bf16 + gradient checkpointing)")


def case_qlora(s):
    """QLoRA: the base stored 4-bit (bitsandbytes' NF4), LoRA adapters trained; the sampler reads
    the 4-bit weights and the adapters themselves. The run finishes with finite values and the
    adapters get gradients."""
    p, out = run_cli(s, "qlora", {
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "model_init_kwargs": {"quantization_config": {"load_in_4bit": True,
                                                      "bnb_4bit_quant_type": "nf4"}}})
    if p.returncode != 0:
        return False, f"onyx train exited {p.returncode}: {p.stderr[-600:]}"
    with open(os.path.join(out, "log_history.jsonl")) as f:
        logs = [e for e in map(json.loads, f) if "loss" in e]
    if len(logs) != STEPS or any(v is None or not math.isfinite(v) for e in logs
                                 for k, v in e.items() if k != "epoch"):
        return False, f"{len(logs)} log entries, or a value not finite: {logs[-1:]}"
    if not any(e["grad_norm"] > 0 for e in logs):
        return False, "the adapters got no gradient"
    if not os.path.exists(os.path.join(out, "adapter_model.safetensors")):
        return False, "no adapter_model.safetensors saved"
    return True, f"{STEPS} steps on a 4-bit base: kl {logs[-1]['kl']:.3g}, adapters saved"


def case_all_truncated(s):
    """mask_truncated_completions when every completion is cut at max_completion_length (a random
    model never samples eos in 8 tokens): no token carries loss, so each step's loss and gradient
    are 0, as TRL's (dapo divides by the clamped token count), and training goes on."""
    p, out = run_cli(s, "all-truncated", {"mask_truncated_completions": True, "max_steps": 2})
    if p.returncode != 0:
        return False, f"onyx train exited {p.returncode}: {p.stderr[-600:]}"
    with open(os.path.join(out, "log_history.jsonl")) as f:
        logs = [e for e in map(json.loads, f) if "loss" in e]
    if len(logs) != 2 or any(e["completions/clipped_ratio"] != 1.0 for e in logs):
        return False, f"want 2 steps of only truncated completions: {logs}"
    if any(e["loss"] != 0.0 or e["grad_norm"] != 0.0 for e in logs):
        return False, f"loss / grad_norm not 0: {[(e['loss'], e['grad_norm']) for e in logs]}"
    return True, "2 steps of masked completions: loss 0, grad_norm 0"


def case_resume(s):
    """A run resumed from its step-2 checkpoint samples the same completions (the sampling seed
    follows the step, the weights are restored bit for bit) and logs what the whole run logged."""
    p, out = run_cli(s, "whole", {"save_strategy": "steps", "save_steps": 2})
    if p.returncode != 0:
        return False, f"onyx train exited {p.returncode}: {p.stderr[-600:]}"
    p, again = run_cli(s, "resumed", {"save_strategy": "steps", "save_steps": 2,
                                      "resume_from_checkpoint": os.path.join(out, "checkpoint-2")})
    if p.returncode != 0:
        return False, f"the resumed run exited {p.returncode}: {p.stderr[-600:]}"

    def steps(folder):
        with open(os.path.join(folder, "log_history.jsonl")) as f:
            return {e["step"]: e for e in map(json.loads, f) if "loss" in e}
    whole, resumed = steps(out), steps(again)
    for step in (3, 4):
        a, b = whole.get(step), resumed.get(step)
        if a is None or b is None:
            return False, f"step {step} is missing from a log"
        if a != b:
            diff = [k for k in a if a.get(k) != b.get(k)]
            return False, f"step {step} differs after resuming: {diff}"
    return True, (f"steps 3 and 4 resumed from checkpoint-2 log the same {len(whole[4])} values "
                  f"(num_tokens {whole[4]['num_tokens']:.0f} restored)")


def case_ddp(s):
    """mpirun -np 2: each process samples its own micro-batch's completions; the rewards of both
    are gathered (groups whole), the rollout metrics count all 16 rows, and the processes stay in
    step (rank 0 saves the model)."""
    import shutil
    if not shutil.which("mpirun"):
        return False, "mpirun is not installed (setup.sh installs OpenMPI)"
    cfg_path, out = cli_config(s, "ddp", {"max_steps": 2})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "--allow-run-as-root",
                        "-np", "2", ONYX, "train", cfg_path], capture_output=True, text=True,
                       timeout=600, env=env)
    if p.returncode != 0:
        return False, f"mpirun exited {p.returncode}: {p.stderr[-600:]}"
    with open(os.path.join(out, "log_history.jsonl")) as f:
        logs = [e for e in map(json.loads, f) if "loss" in e]
    if len(logs) != 2:
        return False, f"{len(logs)} log entries (want 2)"
    # 16 rows per step (2 processes x 8), every prompt as long ("Define cat:", ...)
    prompt_lengths = {len(s.tok(r["prompt"])["input_ids"]) for r in ROWS}
    if len(prompt_lengths) != 1:
        return False, f"the test's prompts have different lengths {prompt_lengths}"
    tokens = logs[0]["num_tokens"]
    want = 16 * (logs[0]["completions/mean_length"] + prompt_lengths.pop())
    if abs(tokens - want) > 1e-6:
        return False, f"num_tokens {tokens}: not 16 completions' and prompts' tokens ({want})"
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        return False, "no model saved"
    return True, (f"2 processes × 8 completions per step: reward {logs[0]['reward']:.3g}, "
                  f"num_tokens {tokens:.0f} over both")


def case_python_errors(s):
    """onyx.GRPOConfig / GRPOTrainer refuse what onyx does not build, naming it, before any
    training: GRPOConfig fields away from their defaults (use_vllm, log_completions), a reward
    model given by name, reward_weights of another length, a dataset without rows."""
    onyx = import_onyx()
    checks = []
    for kw, want in (({"use_vllm": True}, "use_vllm=True: onyx implements use_vllm=False only"),
                     ({"log_completions": True}, "log_completions=True")):
        try:
            onyx.GRPOConfig(output_dir=os.path.join(s.tmp, "x"), **kw)
            checks.append(f"GRPOConfig({kw}) was accepted")
        except ValueError as e:
            if want not in str(e):
                checks.append(f"GRPOConfig({kw}): {e}")
    args = onyx.GRPOConfig(output_dir=os.path.join(s.tmp, "x"), num_generations=2,
                           per_device_train_batch_size=2, bf16=False)
    for kw, exc, want in (({"reward_funcs": "my-org/reward-model"}, NotImplementedError,
                           "a reward model is not supported"),
                          ({"reward_funcs": [reward_len],
                            "args": onyx.GRPOConfig(output_dir=os.path.join(s.tmp, "x"),
                                                    reward_weights=[1.0, 2.0], bf16=False)},
                           ValueError, "Number of reward weights (2)"),
                          ({"reward_funcs": reward_len, "train_dataset": []}, ValueError,
                           "train_dataset has no rows")):
        kw = dict({"args": args, "train_dataset": ROWS}, **kw)
        try:
            onyx.GRPOTrainer(model=s.base_dir, processing_class=s.tok, **kw)
            checks.append(f"{want}: accepted")
        except exc as e:
            if want not in str(e):
                checks.append(f"{want}: {e}")
    return not checks, "; ".join(checks) or "5 misuses refused naming why"


def case_errors(s):
    bad = [("reward type", {"reward_funcs": [{"type": "bleu"}]}, "unknown reward type 'bleu'"),
           ("no trainer", {"trainer": "default", "reward_funcs": None, "beta": None,
                           "num_generations": None, "max_completion_length": None},
            "type prompts is GRPO's data"),
           ("groups", {"num_generations": 3}, "multiple of num_generations 3"),
           ("key", {"num_generation": 4}, "unknown key 'num_generation'"),
           ("loss", {"loss_type": "sapo"}, "loss_type 'sapo' is not built")]
    for name, extra, want in bad:
        cfg_path, _ = cli_config(s, "err-" + name.replace(" ", "-"), {})
        with open(cfg_path) as f:
            cfg = {k: json.loads(v) for k, v in (l.split(": ", 1) for l in f.read().splitlines())}
        for k, v in extra.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        cfg["output_dir"] = os.path.join(s.tmp, "err-out-" + name.replace(" ", "-"))
        write_config(cfg_path, cfg)
        p = subprocess.run([ONYX, "train", cfg_path], capture_output=True, text=True, timeout=120)
        if p.returncode != 1 or want not in p.stderr:
            return False, f"{name}: exit {p.returncode}, stderr {p.stderr[-300:]!r} (want '{want}')"
    return True, f"{len(bad)} bad configs: exit 1 naming why"


CASES = [(f"{lt}-b{b}-it{n}", shared(loss_case(lt, b, n)))
         for lt in ("dapo", "grpo", "bnpo", "dr_grpo") for b, n in ((0.0, 1), (0.04, 2))]
CASES += [("dapo-b0.04-it1", shared(loss_case("dapo", 0.04, 1))),
          ("mask-truncated", shared(loss_case("dapo", 0.04, 1,
                                              {"mask_truncated_completions": True}))),
          ("grpo-b0.0-it2", shared(loss_case("grpo", 0.0, 2))),
          ("accumulation", shared(case_accumulation)), ("lora", shared(case_lora)),
          ("lora-generate", shared(case_lora_generate)),
          ("cli-generate", shared(case_cli_generate)),
          ("cli-python-reward", shared(case_cli_python_reward)), ("bf16", shared(case_bf16)),
          ("qlora", shared(case_qlora)), ("all-truncated", shared(case_all_truncated)),
          ("resume", shared(case_resume)),
          ("ddp", shared(case_ddp)), ("python-errors", shared(case_python_errors)),
          ("errors", shared(case_errors))]

if __name__ == "__main__":
    sys.exit(run_cases(CASES, "onyx-grpo-"))
