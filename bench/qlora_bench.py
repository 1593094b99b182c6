"""qlora_bench.py — QLoRA's memory and speed (issue #38): a Llama-3-8B-shaped model (its config,
random weights) with LoRA r 16 on q/k/v/o, its other linear layers stored 4-bit (NF4, double
quantization), batch 1 x 512 tokens, gradient checkpointing — onyx's peak RSS and step time; the
same over onyx's bf16 base (model_init_kwargs.dtype: bfloat16, with bf16 mixed precision when the
compute dtype is bfloat16; its linear weights built bf16, so the 8B base takes ~16 GiB); and, on a
shape small enough for PyTorch to hold in float32 while bitsandbytes quantizes it, against PyTorch
2.13 + PEFT 0.21 + bitsandbytes 0.50 (its CPU backend, prepare_model_for_kbit_training), side by
side in one run.

  build/venv/bin/python bench/qlora_bench.py [--shape 8b] [--steps 2] [--torch-shape 1b]
      [--compute float32|bfloat16] [--bf16-base all|torch-shape] [--out build/bench-qlora]

Shapes: 8b = Llama 3 8B (hidden 4096, 32 layers, 32 heads over 8 key/value heads, intermediate
14336, vocab 128256); 1b = Llama 3.2 1B (hidden 2048, 16 layers, 32/8 heads, intermediate 8192,
vocab 128256); tiny (a smoke run). onyx builds the model from its config (`model: {arch, config}`)
with the 4-bit layers quantized as they are made, so the float32 model never exists whole; PyTorch
needs a saved float checkpoint to load 4-bit (from_pretrained with BitsAndBytesConfig), so its
peer runs where that fits. Each run is its own process: peak RSS is GNU time's maximum resident
set size; a step's time is the median step after the first, for both (onyx's: the time between
the log lines of successive steps, logging_steps 1, as they arrive on its stdout; PyTorch's timed
around each step); wall time includes building (and for onyx quantizing) the model. Prints a Markdown table and writes
OUT/qlora_results.json.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))
PY = sys.executable

SHAPES = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=128256),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256),
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=512, vocab_size=1024),
}


def llama_config(shape):
    return dict(SHAPES[shape], model_type="llama", architectures=["LlamaForCausalLM"],
                max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=500000.0, hidden_act="silu")


def timed(cmd, env=None, stamp=None):
    """(completed process, peak RSS in GiB, arrival times of the stdout lines containing `stamp`)
    of cmd under GNU time."""
    p = subprocess.Popen(["/usr/bin/time", "-v"] + cmd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    out, stamps = [], []
    for line in p.stdout:  # read as it comes, so each stamp is when the line was printed
        out.append(line)
        if stamp and stamp in line:
            stamps.append(time.time())
    err = p.stderr.read()
    p.wait()
    done = subprocess.CompletedProcess(p.args, p.returncode, "".join(out), err)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    return done, (int(m.group(1)) / 2**20 if m else float("nan")), stamps


def onyx_run(tmp, shape, steps, seq, compute, quantized=True):
    import numpy as np
    from safetensors.numpy import save_file
    V = SHAPES[shape]["vocab_size"]
    ids = np.random.default_rng(0).integers(0, V, (steps + 1, seq)).astype(np.int64)
    data = os.path.join(tmp, f"data-{shape}.safetensors")
    save_file({"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}, data)
    out = os.path.join(tmp, f"onyx-{shape}-{'4bit' if quantized else 'bf16'}")
    cfg = {"model": {"config": llama_config(shape), "task": "causal-lm"}, "train_data": data,
           "output_dir": out, "max_steps": steps + 1, "per_device_train_batch_size": 1,
           "learning_rate": 1e-4, "logging_steps": 1, "save_strategy": "no",
           "train_sampling_strategy": "sequential", "disable_tqdm": True,
           "gradient_checkpointing": True,
           "lora": {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj",
                                                                  "o_proj"]},
           "model_init_kwargs": {"quantization_config": {
               "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
               "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": compute}}}
    if not quantized:  # the bf16 base instead (model_init_kwargs.dtype), mixed precision with it
        cfg["model_init_kwargs"] = {"dtype": "bfloat16"}
        cfg["bf16"] = compute == "bfloat16"
    path = os.path.join(tmp, f"onyx-{shape}-{'4bit' if quantized else 'bf16'}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    t0 = time.time()
    p, rss, stamps = timed([ONYX, "train", path], stamp='"loss"')
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"onyx train exited {p.returncode}: {p.stderr[-1500:]}")
    logs = [json.loads(l) for l in open(os.path.join(out, "log_history.jsonl"))]
    runtime = [e for e in logs if "train_runtime" in e][0]["train_runtime"]
    # a step's time: between the log lines of successive steps (logging_steps 1), the first
    # step (which also optimizes the graph) left out, as PyTorch's median after the first
    between = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"peak_rss_gib": rss, "wall_s": wall, "train_runtime_s": runtime,
            "step_s": statistics.median(between) if between else runtime / (steps + 1),
            "losses": [e["loss"] for e in logs if "loss" in e]}


TORCH_SCRIPT = r'''
import json, sys, time, statistics, numpy as np, torch, transformers as tr, peft
folder, steps, seq, compute = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bnb = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                            bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=getattr(torch, compute))
m = tr.LlamaForCausalLM.from_pretrained(folder, quantization_config=bnb)
m = peft.prepare_model_for_kbit_training(m, use_gradient_checkpointing=True)
m = peft.get_peft_model(m, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
V = m.config.vocab_size
ids = torch.tensor(np.random.default_rng(0).integers(0, V, (steps + 1, seq)).astype(np.int64))
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
m.train()
times, losses = [], []
for s in range(steps + 1):
    t0 = time.time()
    loss = m(input_ids=ids[s:s + 1], labels=ids[s:s + 1]).loss
    loss.backward()
    opt.step(); opt.zero_grad()
    times.append(time.time() - t0); losses.append(loss.item())
print(json.dumps({"step_s": statistics.median(times[1:]), "losses": losses}))
'''


def torch_run(tmp, shape, steps, seq, compute):
    import torch
    import transformers as tr
    folder = os.path.join(tmp, f"torch-base-{shape}")
    cfg = tr.LlamaConfig(**{k: v for k, v in llama_config(shape).items()
                            if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    tr.LlamaForCausalLM(cfg).save_pretrained(folder)
    script = os.path.join(tmp, "torch_qlora.py")
    with open(script, "w") as f:
        f.write(TORCH_SCRIPT)
    p, rss, _ = timed([PY, script, folder, str(steps), str(seq), compute])
    if p.returncode != 0:
        return {"error": p.stderr[-800:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["peak_rss_gib"] = rss
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8b", choices=SHAPES)
    ap.add_argument("--torch-shape", default="1b", choices=list(SHAPES) + ["none"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--compute", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--bf16-base", default="all", choices=["all", "torch-shape"],
                    help="run onyx over the bf16 base on every shape, or on the torch shape only")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-qlora"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="onyx-qlora-bench-") as tmp:
        shapes = [a.shape] + ([a.torch_shape] if a.torch_shape not in ("none", a.shape) else [])
        for shape in shapes:
            r = onyx_run(tmp, shape, a.steps, a.seq, a.compute)
            results[f"onyx {shape}"] = r
            print(f"onyx {shape}: peak RSS {r['peak_rss_gib']:.2f} GiB, {r['step_s']:.1f} s/step "
                  f"(median after the first; train_runtime over {a.steps + 1} steps "
                  f"{r['train_runtime_s']:.1f} s), wall {r['wall_s']:.0f} s", flush=True)
        bf16_shapes = shapes if a.bf16_base == "all" else [s for s in shapes if s == a.torch_shape]
        for shape in bf16_shapes:
            r = onyx_run(tmp, shape, a.steps, a.seq, a.compute, quantized=False)
            results[f"onyx {shape} bf16 base"] = r
            print(f"onyx {shape} bf16 base: peak RSS {r['peak_rss_gib']:.2f} GiB, "
                  f"{r['step_s']:.1f} s/step", flush=True)
        if a.torch_shape != "none":
            r = torch_run(tmp, a.torch_shape, a.steps, a.seq, a.compute)
            results[f"torch {a.torch_shape}"] = r
            print(f"torch {a.torch_shape}: {r}", flush=True)
    print("\n| run | peak RSS (GiB) | s/step | tokens/s |\n|---|---|---|---|")
    for k, r in results.items():
        if "step_s" in r:
            print(f"| {k} | {r['peak_rss_gib']:.2f} | {r['step_s']:.2f} | {a.seq / r['step_s']:.1f} |")
    with open(os.path.join(a.out, "qlora_results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
