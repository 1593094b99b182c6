"""diffusion_bench.py — a diffusion training step (issue #41): diffusers' UNet2DModel, onyx against
PyTorch 2.13 eager and torch.compile running diffusers' own module, side by side in one run.

  build/venv/bin/python bench/diffusion_bench.py [--models fashion,sd-blocks] [--steps 3]
      [--warmup 2] [--threads 0] [--out build/bench-diffusion] [--bf16]

The models (diffusers' UNet2DModel, random init, saved with save_pretrained):
  fashion    examples/fashion_diffusion/unet/config.json — the example's class-conditional UNet
             (32/64/64 channels, attention at 14x14 and 7x7); batch 64 of 1x28x28 images
  sd-blocks  Stable Diffusion 1.5's UNet block stack at 32x32 latents: 4 latent channels,
             block_out_channels 320/640/1280/1280, 2 resnets per block, spatial self-attention
             in the first three down blocks and the last three up blocks and the mid block
             (attention_head_dim 40, 32 groups) — SD's channel widths and resolution pyramid,
             with self-attention where SD has its cross-attention transformers; batch 2
Every peer computes the training loss of diffusers' example scripts (DDPMScheduler.add_noise
with the batch's own noise and timesteps, epsilon target, F.mse_loss) and runs AdamW lr 1e-4 over
every parameter, clipping at 1.0, on the same batches in order. onyx's steady step time is the
difference of train_runtime between a run of warmup + steps optimizer steps and one of warmup
steps (graph building cancels out); PyTorch's is the median of the steps after the warmup ones
(for torch.compile, after its compilation in the warmup steps). Peak RSS: GNU time's maximum
resident set size. Also the float32 GEMM ceiling of this run (onyx_bench gemm_ceiling/f32) and
the convolution FLOPs of a step, to read the rates against. Prints a Markdown table and writes
OUT/diffusion_results.json. With --bf16 each model also runs in mixed precision: onyx with bf16: true
against PyTorch's CPU autocast to bfloat16 around the forward and the loss (what accelerate's
mixed_precision="bf16" does in diffusers' scripts), eager and compiled, with the bf16 GEMM ceiling
beside (a CPU without AVX512_BF16 or AMX runs bf16 emulated: compare it there as such).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench as tb  # noqa: E402
from seq2seq_bench import bench_setup, gemm_ceiling, peer_rows  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TORCH_SCRIPT = r"""
import json, statistics, sys, time, torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel
from safetensors.numpy import load_file
folder, data, steps, warmup, threads, compiled, B = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1", int(sys.argv[7])
bf16 = sys.argv[8:] == ["bf16"]
if threads > 0: torch.set_num_threads(threads)
m = UNet2DModel.from_pretrained(folder); m.train()
sched = DDPMScheduler()
d = load_file(data)
params = list(m.parameters())
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
fwd = torch.compile(m) if compiled else m
times, losses = [], []
for s in range(warmup + steps):
    b = {k: torch.tensor(v[s * B:(s + 1) * B]) for k, v in d.items()}
    t0 = time.perf_counter()
    noisy = sched.add_noise(b["pixel_values"], b["noise"], b["timesteps"])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        pred = fwd(noisy, b["timesteps"], class_labels=b.get("class_labels")).sample
        loss = F.mse_loss(pred.float(), b["noise"].float())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0); losses.append(loss.item())
print(json.dumps({"step_s": statistics.median(times[warmup:]), "losses": losses}))
"""


def model_config(kind):
    if kind == "fashion":
        with open(os.path.join(ROOT, "examples", "fashion_diffusion", "unet", "config.json")) as f:
            cfg = json.load(f)
        return {k: v for k, v in cfg.items() if not k.startswith("_")}, 64, \
            "batch 64 of 1x28x28 images, 10 classes"
    return dict(sample_size=32, in_channels=4, out_channels=4,
                block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                down_block_types=("AttnDownBlock2D",) * 3 + ("DownBlock2D",),
                up_block_types=("UpBlock2D",) + ("AttnUpBlock2D",) * 3,
                attention_head_dim=40, norm_num_groups=32), 2, "batch 2 of 4x32x32 latents"


def conv_flops(model, shape):
    """Multiply-adds x 2 of every Conv2d in one forward of a (shape) batch, times 3 for a step."""
    import torch
    total = [0]

    def hook(mod, inp, out):
        k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
        total[0] += 2 * k * out.numel()
    hs = [m.register_forward_hook(hook) for m in model.modules()
          if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        b = shape[0]
        labels = torch.zeros(b, dtype=torch.long) if model.config.num_class_embeds else None
        model(torch.zeros(shape), torch.zeros(b, dtype=torch.long), class_labels=labels)
    for h in hs:
        h.remove()
    return 3 * total[0]


def make_model(kind, tmp, total, rng):
    import numpy as np
    import torch
    from diffusers import UNet2DModel
    from safetensors.numpy import save_file
    torch.manual_seed(0)
    cfg, B, shape = model_config(kind)
    model = UNet2DModel(**cfg)
    folder = os.path.join(tmp, kind)
    model.save_pretrained(folder)
    c, s = cfg["in_channels"], cfg["sample_size"]
    data = {"pixel_values": rng.uniform(-1, 1, (B * total, c, s, s)).astype(np.float32),
            "noise": rng.standard_normal((B * total, c, s, s)).astype(np.float32),
            "timesteps": rng.integers(0, 1000, B * total).astype(np.int64)}
    if cfg.get("num_class_embeds"):
        data["class_labels"] = rng.integers(0, cfg["num_class_embeds"], B * total)
    path = os.path.join(tmp, kind + "-data.safetensors")
    save_file(data, path)
    flops = conv_flops(model, (B, c, s, s))
    return folder, path, B, sum(p.numel() for p in model.parameters()), shape, flops


def main():
    a, tmp, threads, env = bench_setup("diffusion", "fashion,sd-blocks",
                                       [("--bf16", dict(action="store_true"))])
    import numpy as np
    results = {}
    for kind in a.models.split(","):
        folder, data, B, n, shape, flops = make_model(kind, tmp, a.warmup + a.steps,
                                                      np.random.default_rng(0))
        rows = peer_rows(kind, folder, data, B, a, threads, env, tmp, TORCH_SCRIPT)
        best = min(rows[1]["step_s"], rows[2]["step_s"])
        results[kind] = {"params": n, "shape": shape, "rows": rows, "conv_gflop_per_step":
                         flops / 1e9, "speedup_vs_best_torch": best / rows[0]["step_s"]}
        if a.bf16:
            half = peer_rows(kind, folder, data, B, a, threads, env, tmp, TORCH_SCRIPT, bf16=True)
            results[kind]["rows"] += half
            results[kind]["bf16_speedup_vs_best_torch"] = (
                min(half[1]["step_s"], half[2]["step_s"]) / half[0]["step_s"])
            results[kind]["bf16_over_fp32"] = rows[0]["step_s"] / half[0]["step_s"]
    ceiling = tb.gemm_ceilings(os.path.join(ROOT, "build", "onyx_bench"),
                               "gemm_ceiling/(f32|bf16)/", env) if a.bf16 else gemm_ceiling(env)
    for kind, r in results.items():
        print(f"\n{kind}: {r['params'] / 1e6:.1f}M parameters, {r['shape']}, {threads} threads, "
              f"{a.steps} steady steps, {r['conv_gflop_per_step']:.1f} GFLOP of convolutions "
              f"per step\n")
        print("| peer | s/step | conv GFLOP/s | peak RSS (MiB) | loss step 1 → last |")
        print("|---|---|---|---|---|")
        for row in r["rows"]:
            print(f"| {row['peer']} | {row['step_s']:.3f} | "
                  f"{r['conv_gflop_per_step'] / row['step_s']:.0f} | {row['rss_mib']:.0f} | "
                  f"{row['losses'][0]:.4f} → {row['losses'][-1]:.4f} |")
        print(f"\nonyx vs the better of PyTorch eager and torch.compile: "
              f"{r['speedup_vs_best_torch']:.2f}× (> 1: onyx faster)")
        if "bf16_speedup_vs_best_torch" in r:
            print(f"onyx bf16 vs the better PyTorch autocast peer: "
                  f"{r['bf16_speedup_vs_best_torch']:.2f}×; onyx bf16 over onyx float32: "
                  f"{r['bf16_over_fp32']:.2f}×")
    if ceiling:
        print("\nGEMM ceilings this run (GFLOP/s): " +
              ", ".join(f"{k} {v:.0f}" for k, v in ceiling.items()))
    with open(os.path.join(a.out, "diffusion_results.json"), "w") as f:
        json.dump({"threads": threads, "models": results, "gemm_ceiling_gflops": ceiling}, f,
                  indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
