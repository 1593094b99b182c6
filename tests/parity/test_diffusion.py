"""test_diffusion.py — diffusers' UNet2DModel and DDPM/DDIM arithmetic against onyx.

Tiny UNet2DModel configs (random weights, fixed seeds) saved with save_pretrained; cases (one
PASS / FAIL line each):
  <config>-forward   `onyx run FOLDER` (sample, timestep, class_labels) against UNet2DModel's
                     output (float32, largest difference relative to the largest value <= 1e-4)
  <config>-grad      `onyx grad FOLDER` on pixel_values, noise and timesteps: the training loss of
                     diffusers' example scripts (DDPMScheduler.add_noise, the prediction target of
                     the folder's scheduler_config.json, F.mse_loss) and every parameter's gradient
                     within 1e-4 relative (each tensor's largest difference over its largest value,
                     floored at 1e-4 of the model's largest gradient)
  configs: cls     DownBlock2D + AttnDownBlock2D, class embeddings, epsilon, linear betas
           shift   resnet_time_scale_shift scale_shift (the mid-block attention has no group_norm),
                   downsample_padding 0, center_input_sample, odd time embedding width, three
                   blocks, v_prediction with squaredcos_cap_v2 betas
           attn    every block with attention, attention_head_dim null (one head per block),
                   mid_block_scale_factor 2, gelu, scaled_linear betas, sample prediction
  draws            the in-graph draws when a batch has no noise/timesteps: `onyx grad` twice with
                   one seed gives the same loss, another seed another loss

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_diffusion.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from case_runner import run_cases
from diffusers import DDPMScheduler, UNet2DModel
from safetensors.numpy import load_file, save_file

ONYX = os.environ.get("ONYX", "build/onyx")
TOL = 1e-4
torch.set_num_threads(1)

CONFIGS = {
    "cls": (dict(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                 down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), layers_per_block=1,
                 norm_num_groups=8, attention_head_dim=8, num_class_embeds=5),
            dict(prediction_type="epsilon")),
    "shift": (dict(sample_size=16, in_channels=2, out_channels=2, block_out_channels=(8, 16, 16),
                   down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                   up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"), layers_per_block=2,
                   norm_num_groups=4, attention_head_dim=4, resnet_time_scale_shift="scale_shift",
                   downsample_padding=0, center_input_sample=True, time_embedding_dim=36,
                   freq_shift=1, flip_sin_to_cos=False),
              dict(prediction_type="v_prediction", beta_schedule="squaredcos_cap_v2")),
    "attn": (dict(sample_size=8, in_channels=1, out_channels=1, block_out_channels=(8, 16),
                  down_block_types=("AttnDownBlock2D", "AttnDownBlock2D"),
                  up_block_types=("AttnUpBlock2D", "AttnUpBlock2D"), layers_per_block=1,
                  norm_num_groups=4, attention_head_dim=None, mid_block_scale_factor=2.0,
                  act_fn="gelu", num_class_embeds=3),
             dict(prediction_type="sample", beta_schedule="scaled_linear", beta_start=0.00085,
                  beta_end=0.012)),
}


def onyx(*args, check=True):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def make(tmp, name):
    """The config's model (random weights, biases and norms included) saved with its scheduler."""
    cfg, sched = CONFIGS[name]
    torch.manual_seed(len(name))
    model = UNet2DModel(**cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    d = os.path.join(tmp, name)
    model.save_pretrained(d)
    scheduler = DDPMScheduler(**sched)
    scheduler.save_pretrained(d)  # scheduler_config.json next to the weights
    return d, model, scheduler


def feeds(name, seed, with_draws=True):
    cfg, _ = CONFIGS[name]
    rng = np.random.default_rng(seed)
    b, c, s = 3, cfg["in_channels"], cfg["sample_size"]
    f = {"pixel_values": rng.uniform(-1, 1, (b, c, s, s)).astype(np.float32)}
    if with_draws:
        f["noise"] = rng.standard_normal((b, c, s, s)).astype(np.float32)
        f["timesteps"] = np.array([0, 517, 999], dtype=np.int64)
    if cfg.get("num_class_embeds"):
        f["class_labels"] = rng.integers(0, cfg["num_class_embeds"], b).astype(np.int64)
    return f


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def case_forward(tmp, name):
    d, model, _ = make(tmp, name)
    f = feeds(name, 1)
    inputs = {"sample": f["pixel_values"], "timestep": f["timesteps"]}
    if "class_labels" in f:
        inputs["class_labels"] = f["class_labels"]
    save_file(inputs, f"{d}/in.safetensors")
    onyx("run", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/out.safetensors")
    got = load_file(f"{d}/out.safetensors")["model_output"]
    with torch.no_grad():
        ref = model(torch.tensor(inputs["sample"]), torch.tensor(inputs["timestep"]),
                    class_labels=torch.tensor(f["class_labels"]) if "class_labels" in f else None
                    ).sample.numpy()
    if got.shape != ref.shape:
        return False, f"shape {got.shape} vs diffusers {ref.shape}"
    e = rel(got, ref)
    return e < TOL, f"model_output rel {e:.1e}"


def diffusers_loss(model, scheduler, f):
    """What train_unconditional.py / train_text_to_image.py compute for one batch."""
    x0, noise = torch.tensor(f["pixel_values"]), torch.tensor(f["noise"])
    t = torch.tensor(f["timesteps"])
    noisy = scheduler.add_noise(x0, noise, t)
    labels = torch.tensor(f["class_labels"]) if "class_labels" in f else None
    pred = model(noisy, t, class_labels=labels).sample
    pt = scheduler.config.prediction_type
    target = noise if pt == "epsilon" else x0 if pt == "sample" else scheduler.get_velocity(
        x0, noise, t)
    return F.mse_loss(pred.float(), target.float(), reduction="mean")


def case_grad(tmp, name):
    d, model, scheduler = make(tmp, name)
    f = feeds(name, 2)
    save_file(f, f"{d}/in.safetensors")
    onyx("grad", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/g.safetensors")
    g = load_file(f"{d}/g.safetensors")
    model.train()
    loss = diffusers_loss(model, scheduler, f)
    loss.backward()
    loss_err = abs(float(g["loss"]) - loss.item()) / abs(loss.item())
    floor = 1e-4 * max(float(p.grad.abs().max()) for p in model.parameters())
    worst, wn, missing = 0.0, "", []
    for n, p in model.named_parameters():
        if n not in g:
            missing.append(n)
            continue
        e = float(np.abs(g[n] - p.grad.numpy()).max() / max(float(p.grad.abs().max()), floor))
        if e > worst:
            worst, wn = e, n
    extra = sorted(set(g) - {"loss"} - {n for n, _ in model.named_parameters()})
    ok = loss_err < TOL and worst < TOL and not missing and not extra
    return ok, (f"loss rel {loss_err:.1e}, {len(g) - 1} gradients, worst rel {worst:.1e} ({wn})"
                + (f", missing {missing[:3]}" if missing else "")
                + (f", not in diffusers {extra[:3]}" if extra else ""))


def case_draws(tmp):
    d, _, _ = make(tmp, "cls")
    save_file(feeds("cls", 3, with_draws=False), f"{d}/in.safetensors")
    losses = []
    for seed in (5, 5, 6):
        onyx("grad", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/g.safetensors",
             "--seed", str(seed))
        losses.append(float(load_file(f"{d}/g.safetensors")["loss"]))
    ok = losses[0] == losses[1] and losses[0] != losses[2] and all(np.isfinite(losses))
    return ok, f"losses with seeds 5, 5, 6: {losses}"


def main():
    cases = []
    for name in CONFIGS:
        cases.append((f"{name}-forward", lambda t, n=name: case_forward(t, n)))
        cases.append((f"{name}-grad", lambda t, n=name: case_grad(t, n)))
    cases.append(("draws", case_draws))
    return run_cases(cases, "onyx-test-diffusion-")


if __name__ == "__main__":
    sys.exit(main())
