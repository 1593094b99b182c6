"""test_diffusion.py — diffusers' UNet2DModel, UNet2DConditionModel, DiTTransformer2DModel and
DDPM/DDIM arithmetic against onyx (issue #41).

Tiny configs (random weights, fixed seeds) saved with save_pretrained; cases (one
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
           cond    UNet2DConditionModel (Stable Diffusion's): CrossAttnDownBlock2D / UpBlock2D,
                   UNetMidBlock2DCrossAttn, cross-attention on encoder_hidden_states (B, 7, 24),
                   SD's attention_head_dim meaning heads, 1x1-conv projections
           cond-linear  three blocks, heads per block (a list), 2 transformer layers in the
                   lower blocks, use_linear_projection, class embeddings, gelu, v_prediction
           dit     DiTTransformer2DModel: patch embedding with sin-cos positions, adaLN-Zero
                   blocks (each its own timestep + label embedding), learned sigma (the loss on
                   the first C of 2C output channels), labels including the null class; diffusers
                   in eval mode (its LabelEmbedding drops labels at random in train mode; onyx
                   grad runs without that dropout)
           dit-gelu  gelu feed-forward, affine norm3, no attention biases, patch 3, 12x12,
                   v_prediction
  ddpm-pipeline    `onyx sample FOLDER --noise` (the starting latents and every step's noise that
                   DDPMPipeline drew, captured) against DDPMPipeline(shift's UNet, its scheduler)
                   (num_inference_steps 12, output_type np): final images within 1e-4 absolute
  ddim-pipeline    the same for DDIMPipeline (DDIMScheduler.from_config of the same scheduler,
                   eta 0, 10 steps, trailing timestep spacing)
  ddim-eta-pipeline DDIMPipeline with eta 0.6: `onyx sample --eta 0.6 --noise` with the latents and
                   the variance noise DDIMScheduler.step drew at every step: the same images (1e-4)
  ddim-classes     cls's class-conditional UNet: `onyx sample --class_labels` against
                   DDIMPipeline's loop with the class labels passed to the UNet (8 steps): within
                   1e-4 of it, or of its float64 run as ddim-guidance (8 steps carry rounding:
                   onyx's Winograd convolutions on AVX-512 ended 1.1e-4 from diffusers' float32)
  ddim-guidance    cond's UNet2DConditionModel: `onyx sample --encoder_hidden_states` (prompt and
                   negative hidden states) with guidance_scale 4 against Stable Diffusion's
                   pipeline loop (the UNet on [negative, prompt], uncond + 4 (text - uncond),
                   DDIMScheduler.step; 6 steps): final images within 1e-4 absolute of it, or
                   (guidance multiplies rounding: diffusers' float32 run is itself ~2e-4 from its
                   float64 one on this random UNet) within 1e-4 or 1.5x diffusers float32's own
                   error of the float64 run
  train-ema-snr    10 steps of `onyx train` on cls's folder (batches of 4 in order from a
                   safetensors dataset carrying each sample's noise and timestep, snr_gamma 5,
                   use_ema with warmup, AdamW betas (0.95, 0.999), weight decay 1e-6 on every
                   parameter, cosine schedule with 2 warmup steps, max_grad_norm 1) against the
                   loop of diffusers' train_unconditional.py / train_text_to_image.py on the same
                   batches (torch.optim.AdamW over unet.parameters(), get_scheduler,
                   clip_grad_norm_, compute_snr's weights, EMAModel.step after every step):
                   every logged loss within 1e-4 relative; the saved model (EMA weights, opened
                   by UNet2DModel.from_pretrained) and checkpoint-10/ema within 1e-4 of
                   EMAModel's shadow (each tensor's largest difference over its largest value;
                   not the attention key biases, whose gradient is rounding noise that AdamW
                   turns into lr-sized steps on either side)
  train-cond-ema-snr  the same for cond's UNet2DConditionModel, the batches carrying
                   encoder_hidden_states (B, 5, 24) (opened by UNet2DConditionModel)
  train-dit-ema-snr  the same for dit's DiTTransformer2DModel (class_dropout_prob 0; diffusers in
                   eval mode, which does not drop labels; the loss on the first C channels)
  dit-guidance     dit: `onyx sample --class_labels --guidance_scale 1.5` (DDIM, 6 steps) against
                   DiTPipeline's loop (the model on [x, x] with [labels, null class], the first C
                   output channels guided, DDIMScheduler.step), the ddim-guidance criterion
  train-resume     the same run with the noise and timesteps drawn in the graph, checkpoint-4
                   resumed: the final weights and EMA bit-identical to the uninterrupted run's
  lora             PEFT's LoRA on the attention projections (to_q, to_k, to_v, to_out.0; r 4,
                   alpha 8, init_lora_weights False so every adapter starts non-zero) of cls's
                   UNet, saved by PEFT and trained 6 steps by `onyx train` (peft_config: that
                   folder) and by the scripts' loop over the PeftModel (AdamW over the adapters):
                   every loss within 1e-4; the adapter onyx writes (adapter_model.safetensors,
                   task_type null) loads with PeftModel.from_pretrained onto
                   UNet2DModel.from_pretrained(output_dir) and that model's output equals the
                   PyTorch-trained one's (1e-4 relative)
  draws            the in-graph draws when a batch has no noise/timesteps: `onyx grad` twice with
                   one seed gives the same loss, another seed another loss

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_diffusion.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import diffusers
import torch.nn.functional as F
from case_runner import run_cases
from diffusers import DDPMScheduler, DiTTransformer2DModel, UNet2DConditionModel, UNet2DModel
from safetensors.numpy import load_file, save_file

ONYX = os.environ.get("ONYX", "build/onyx")
TOL = 1e-4
torch.set_num_threads(1)
diffusers.utils.logging.set_verbosity_error()  # (its note on casting a model to float64)

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
    # UNet2DConditionModel: cross-attention on encoder_hidden_states (B, 7, 24)
    "cond": (dict(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32),
                  down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=1,
                  norm_num_groups=8, cross_attention_dim=24, attention_head_dim=2),
             dict(prediction_type="epsilon", beta_schedule="scaled_linear", beta_start=0.00085,
                  beta_end=0.012)),
    "cond-linear": (dict(sample_size=8, in_channels=3, out_channels=3,
                         block_out_channels=(16, 32, 32),
                         down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                           "DownBlock2D"),
                         up_block_types=("UpBlock2D", "CrossAttnUpBlock2D",
                                         "CrossAttnUpBlock2D"),
                         layers_per_block=2, norm_num_groups=8, cross_attention_dim=24,
                         attention_head_dim=(2, 4, 4), transformer_layers_per_block=(1, 2, 2),
                         use_linear_projection=True, num_class_embeds=3, act_fn="gelu"),
                    dict(prediction_type="v_prediction")),
    # DiTTransformer2DModel: adaLN-Zero blocks; learned sigma (out_channels 2C)
    "dit": (dict(num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=6,
                 num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=5),
            dict(prediction_type="epsilon")),
    "dit-gelu": (dict(num_attention_heads=4, attention_head_dim=4, in_channels=2, num_layers=1,
                      sample_size=12, patch_size=3, num_embeds_ada_norm=3, activation_fn="gelu",
                      norm_elementwise_affine=True, attention_bias=False),
                 dict(prediction_type="v_prediction", beta_schedule="squaredcos_cap_v2")),
}


def is_dit(name):
    return name.startswith("dit")


def onyx(*args, check=True):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def make(tmp, name):
    """The config's model (random weights, biases and norms included) saved with its scheduler."""
    cfg, sched = CONFIGS[name]
    torch.manual_seed(len(name))
    cls = (DiTTransformer2DModel if is_dit(name) else
           UNet2DConditionModel if name.startswith("cond") else UNet2DModel)
    model = cls(**cfg)
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
    b, c, s = 4, cfg["in_channels"], cfg["sample_size"]
    f = {"pixel_values": rng.uniform(-1, 1, (b, c, s, s)).astype(np.float32)}
    if with_draws:
        f["noise"] = rng.standard_normal((b, c, s, s)).astype(np.float32)
        f["timesteps"] = np.array([0, 517, 999, 3], dtype=np.int64)
    classes = cfg.get("num_class_embeds") or cfg.get("num_embeds_ada_norm")
    if classes:  # (DiT: the last row is the null class of guidance)
        f["class_labels"] = rng.integers(0, classes + is_dit(name), b).astype(np.int64)
    if cfg.get("cross_attention_dim"):
        f["encoder_hidden_states"] = rng.standard_normal(
            (b, 7, cfg["cross_attention_dim"])).astype(np.float32)
    return f


def conditions(f):
    """The UNet's keyword inputs among the feeds: class_labels, encoder_hidden_states."""
    return {k: torch.tensor(f[k]) for k in ("class_labels", "encoder_hidden_states") if k in f}


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def case_forward(tmp, name):
    d, model, _ = make(tmp, name)
    f = feeds(name, 1)
    inputs = {"sample": f["pixel_values"], "timestep": f["timesteps"]}
    inputs.update({k: v.numpy() for k, v in conditions(f).items()})
    save_file(inputs, f"{d}/in.safetensors")
    onyx("run", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/out.safetensors")
    got = load_file(f"{d}/out.safetensors")["model_output"]
    model.eval()  # (DiT: no label dropout)
    with torch.no_grad():
        ref = model(torch.tensor(inputs["sample"]), torch.tensor(inputs["timestep"]),
                    **conditions(f)).sample.numpy()
    if got.shape != ref.shape:
        return False, f"shape {got.shape} vs diffusers {ref.shape}"
    e = rel(got, ref)
    return e < TOL, f"model_output rel {e:.1e}"


def diffusers_loss(model, scheduler, f):
    """What train_unconditional.py / train_text_to_image.py compute for one batch."""
    x0, noise = torch.tensor(f["pixel_values"]), torch.tensor(f["noise"])
    t = torch.tensor(f["timesteps"])
    noisy = scheduler.add_noise(x0, noise, t)
    pred = model(noisy, t, **conditions(f)).sample
    pred = pred[:, :x0.shape[1]]  # learned sigma: the prediction is the first C channels
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
    if is_dit(name):
        model.eval()  # LabelEmbedding drops labels at random in train mode; onyx grad does not
    loss = diffusers_loss(model, scheduler, f)
    loss.backward()
    loss_err = abs(float(g["loss"]) - loss.item()) / abs(loss.item())
    # a key projection's bias gets a zero gradient (it adds the same to every score of a query):
    # rounding noise on both sides (~1e-8 of the largest gradient, DiT's to_k.bias), measured
    # against 1e-3 of the model's largest gradient — an absolute 1e-7 of it, float32's epsilon
    floor = 1e-3 * max(float(p.grad.abs().max()) for p in model.parameters())
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


class CapturedNoise:
    """Records every randn_tensor a pipeline or scheduler draws (the draws it makes are kept)."""

    def __init__(self, *modules):
        self.modules, self.draws = modules, []

    def __enter__(self):
        self.saved = [m.randn_tensor for m in self.modules]
        def draw(*a, _orig=self.saved[0], **k):
            t = _orig(*a, **k)
            self.draws.append(t.clone())
            return t
        for m in self.modules:
            m.randn_tensor = draw
        return self

    def __exit__(self, *exc):
        for m, f in zip(self.modules, self.saved):
            m.randn_tensor = f


def sample_with_onyx(d, draws, steps, scheduler, extra=()):
    noise = {"latents": draws[0].numpy()}
    if len(draws) > 1:
        noise["step_noise"] = np.stack([t.numpy() for t in draws[1:]])
    save_file(noise, f"{d}/noise.safetensors")
    onyx("sample", d, "--noise", f"{d}/noise.safetensors", "--scheduler", scheduler,
         "--num_inference_steps", str(steps), "--tensors", f"{d}/images.safetensors", *extra)
    return load_file(f"{d}/images.safetensors")["images"]


def case_pipeline(tmp, kind):
    import diffusers.pipelines.ddim.pipeline_ddim as pddim
    import diffusers.pipelines.ddpm.pipeline_ddpm as pddpm
    import diffusers.schedulers.scheduling_ddim as sddim
    import diffusers.schedulers.scheduling_ddpm as sddpm
    from diffusers import DDIMPipeline, DDIMScheduler, DDPMPipeline
    d, model, scheduler = make(tmp, "shift")
    model.eval()
    if kind == "ddpm":
        pipe, steps, mods = DDPMPipeline(unet=model, scheduler=scheduler), 12, (pddpm, sddpm)
        extra, eta = (), {}
    else:  # ddim, or ddim-eta: DDIMPipeline's eta 0.6, the scheduler's variance noise captured
        ddim = DDIMScheduler.from_config(scheduler.config, timestep_spacing="trailing")
        with open(f"{d}/ddim.json", "w") as f:
            json.dump(dict(ddim.config), f)
        pipe, steps, mods = DDIMPipeline(unet=model, scheduler=ddim), 10, (pddim, sddim)
        extra = ("--scheduler_config", f"{d}/ddim.json")
        eta = {"eta": 0.6} if kind == "ddim-eta" else {}
        extra += ("--eta", "0.6") if eta else ()
    pipe.set_progress_bar_config(disable=True)
    with CapturedNoise(*mods) as cap, torch.no_grad():
        ref = pipe(batch_size=3, generator=torch.Generator().manual_seed(0),
                   num_inference_steps=steps, output_type="np", **eta).images  # (N,H,W,C)
    # DDPM draws no noise at t = 0; DDIM with eta > 0 at every step
    want = 1 + (steps - 1 if kind == "ddpm" else steps if eta else 0)
    if len(cap.draws) != want:
        return False, f"captured {len(cap.draws)} draws, expected {want}"
    if kind == "ddpm":
        cap.draws.append(torch.zeros_like(cap.draws[0]))  # the last step's (unused) noise
    got = sample_with_onyx(d, cap.draws, steps, kind.split("-")[0], extra).transpose(0, 2, 3, 1)
    e = float(np.abs(got - ref).max())
    return e <= TOL, f"{steps} steps, 3 images, largest absolute difference {e:.1e}"


def case_ddim_classes(tmp):
    from diffusers import DDIMScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    ddim = DDIMScheduler.from_config(scheduler.config)
    ddim.set_timesteps(8)
    labels = torch.tensor([4, 0, 2, 2])
    g = torch.Generator().manual_seed(1)
    latents = torch.randn((4, 3, 16, 16), generator=g)
    refs, _ = scheduler_loop_refs(model, ddim, latents, 8, labels)
    got = sample_with_onyx(d, [latents], 8, "ddim", ("--class_labels", "4,0,2,2"))
    return against_references(got, refs[0], refs[1], "8 steps, classes 4,0,2,2")


def scheduler_loop_refs(model, sched, latents, steps, labels, noise_module=None):
    """A pipeline's loop with `sched` on the class-conditional model from `latents`, in float32
    and in float64 (the rounding-free answer): the latents times init_noise_sigma, each input
    through scale_model_input (both the identity but for the Euler schedulers), the step. With
    `noise_module` (a scheduler module drawing per-step noise) the float32 run's draws are
    captured and given again to the float64 run. Returns ([images32, images64], the draws)."""
    refs, draws = [], None
    for dtype in (torch.float32, torch.float64):
        sched.set_timesteps(steps)
        m, x = model.to(dtype), latents.to(dtype) * sched.init_noise_sigma
        noise = iter(draws or [])
        kw = {"generator": torch.Generator().manual_seed(7)} if noise_module else {}
        cap = CapturedNoise(noise_module) if noise_module else None
        with cap or contextlib.nullcontext(), torch.no_grad():
            if noise_module and dtype == torch.float64:  # the float32 run's draws again
                noise_module.randn_tensor = lambda *a, **k: next(noise).to(torch.float64)
            for t in sched.timesteps:
                out = m(sched.scale_model_input(x, t), t, class_labels=labels).sample
                x = sched.step(out, t, x, **kw).prev_sample
        draws = draws or (cap.draws if cap else [])
        refs.append((x / 2 + 0.5).clamp(0, 1).float().numpy())
    model.float()
    return refs, draws


def scheduler_variant(d, cls, base, cfg, name, extra):
    """The scheduler of one variant and onyx's flags for it: `cfg` None is the model folder's
    file (as from_pretrained reads it), else `cls(**base, **cfg)` saved to d/name."""
    if cfg is None:
        return cls.from_pretrained(d), extra
    sched = cls(**dict(base, **cfg))
    sched.save_pretrained(f"{d}/{name}")
    return sched, extra + ("--scheduler_config", f"{d}/{name}/scheduler_config.json")


def compare_variants(d, model, cls, base, variants, labels, seed, scheduler, count_calls=False):
    """Each (name, cfg, steps) variant of the deterministic scheduler `cls` (scheduler_variant)
    sampled by `onyx sample --scheduler <scheduler>` and by diffusers' loop from the same latents:
    (all within bounds, the messages)."""
    msgs, ok = [], True
    flag = ",".join(str(int(v)) for v in labels)
    for k, (name, cfg, steps) in enumerate(variants):
        sched, extra = scheduler_variant(d, cls, base, cfg, f"{scheduler}{k}",
                                         ("--class_labels", flag))
        latents = torch.randn((3, 3, 16, 16), generator=torch.Generator().manual_seed(seed + k))
        refs, _ = scheduler_loop_refs(model, sched, latents, steps, labels)
        got = sample_with_onyx(d, [latents], steps, scheduler, extra)
        what = f"{len(sched.timesteps)} UNet calls" if count_calls else f"{steps} steps"
        good, msg = against_references(got, refs[0], refs[1], f"{name}, {what}")
        ok &= good
        msgs.append(msg)
    return ok, msgs


def case_dpmsolver(tmp):
    """`onyx sample --scheduler dpmsolver`: DPMSolverMultistepScheduler's loop from the same
    latents. Its configurations: from the model's DDPM config as from_config makes it (DPM-Solver++
    2M, midpoint, leading spacing), and from scheduler_config.json files DPMSolverMultistepScheduler
    saved ("lambda_min_clipped": -Infinity): order 3 with Heun over 16 linspace steps, order 2
    trailing, DPM-Solver (noise prediction) with sigma_min as the final sigma, Karras sigmas
    (use_karras_sigmas: "DPM++ 2M Karras") with orders 2 and 3, and the SDE variants ("DPM++ 2M
    SDE Karras", order 3 Heun, sde-dpmsolver) with each step's noise captured and given again,
    and exponential sigmas (their timesteps truncated: the noise table must be torch's exactly)."""
    import diffusers.schedulers.scheduling_dpmsolver_multistep as sdpm
    from diffusers import DPMSolverMultistepScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    base = {key: scheduler.config[key] for key in ("num_train_timesteps", "beta_schedule",
                                                  "beta_start", "beta_end")}
    variants = [("2M leading", None, 10),
                ("3 heun linspace", dict(solver_order=3, solver_type="heun"), 16),
                ("2M trailing", dict(timestep_spacing="trailing"), 7),
                ("dpmsolver sigma_min", dict(algorithm_type="dpmsolver", final_sigmas_type="sigma_min",
                                             prediction_type="v_prediction"), 9),
                ("2M Karras (the folder's file, --use_karras_sigmas)", "karras", 12),
                ("3 heun Karras sigma_min", dict(use_karras_sigmas=True, solver_order=3,
                                                 solver_type="heun", final_sigmas_type="sigma_min"), 8),
                ("2M SDE Karras", dict(algorithm_type="sde-dpmsolver++", use_karras_sigmas=True), 10),
                ("3 SDE heun", dict(algorithm_type="sde-dpmsolver++", solver_order=3,
                                    solver_type="heun"), 8),
                ("sde-dpmsolver sigma_min", dict(algorithm_type="sde-dpmsolver",
                                                 final_sigmas_type="sigma_min"), 7),
                ("2M exponential", dict(use_exponential_sigmas=True), 9)]
    labels = torch.tensor([4, 0, 2])
    msgs, ok = [], True
    for k, (name, cfg, steps) in enumerate(variants):
        extra = ("--class_labels", "4,0,2")
        if cfg == "karras":  # the folder's file with use_karras_sigmas, given on the command line
            sched = DPMSolverMultistepScheduler.from_pretrained(d, use_karras_sigmas=True)
            extra += ("--use_karras_sigmas",)
        else:  # (None: the folder's file, as from_pretrained reads it: leading spacing)
            sched, extra = scheduler_variant(d, DPMSolverMultistepScheduler, base, cfg, f"dpm{k}",
                                             extra)
        sde = sched.config.algorithm_type.startswith("sde-")
        latents = torch.randn((3, 3, 16, 16), generator=torch.Generator().manual_seed(k))
        refs, draws = scheduler_loop_refs(model, sched, latents, steps, labels,
                                          sdpm if sde else None)
        got = sample_with_onyx(d, [latents] + [t.float() for t in draws], steps, "dpmsolver",
                               extra)
        good, msg = against_references(got, refs[0], refs[1], f"{name}, {steps} steps")
        ok &= good
        msgs.append(msg)
    return ok, "; ".join(msgs)


def case_euler(tmp):
    """`onyx sample --scheduler euler | euler_ancestral`: EulerDiscreteScheduler's and
    EulerAncestralDiscreteScheduler's loop as the pipelines run it (latents times
    init_noise_sigma, scale_model_input, the UNet on float32 timesteps — fractional with linspace
    spacing, their default — and the step; the ancestral step's noise captured) from the same
    draws: linspace (fractional timesteps), the model folder's DDPM file (leading), trailing with
    v-prediction and sigma_min, Karras sigmas (their timesteps fractional in any spacing; a
    configured sigma_max)."""
    import diffusers.schedulers.scheduling_euler_ancestral_discrete as sanc
    from diffusers import EulerAncestralDiscreteScheduler, EulerDiscreteScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    base = {key: scheduler.config[key] for key in ("num_train_timesteps", "beta_schedule",
                                                  "beta_start", "beta_end")}
    variants = [("euler linspace", EulerDiscreteScheduler, {}, 9),
                ("euler leading (the folder's file)", EulerDiscreteScheduler, None, 8),
                ("euler trailing v sigma_min", EulerDiscreteScheduler,
                 dict(timestep_spacing="trailing", prediction_type="v_prediction",
                      final_sigmas_type="sigma_min"), 7),
                ("euler Karras", EulerDiscreteScheduler, dict(use_karras_sigmas=True), 9),
                ("euler Karras leading sigma_max 9", EulerDiscreteScheduler,
                 dict(use_karras_sigmas=True, timestep_spacing="leading", sigma_max=9.0), 6),
                ("euler exponential", EulerDiscreteScheduler, dict(use_exponential_sigmas=True), 7),
                ("euler_ancestral linspace", EulerAncestralDiscreteScheduler, {}, 9),
                ("euler_ancestral leading v", EulerAncestralDiscreteScheduler,
                 dict(timestep_spacing="leading", steps_offset=1, prediction_type="v_prediction"), 6)]
    labels = torch.tensor([1, 3, 4])
    msgs, ok = [], True
    for k, (name, cls, cfg, steps) in enumerate(variants):
        sched, extra = scheduler_variant(d, cls, base, cfg, f"euler{k}",
                                         ("--class_labels", "1,3,4"))
        latents = torch.randn((3, 3, 16, 16), generator=torch.Generator().manual_seed(10 + k))
        refs, draws = scheduler_loop_refs(model, sched, latents, steps, labels, sanc)
        scheduler_name = "euler_ancestral" if cls is EulerAncestralDiscreteScheduler else "euler"
        got = sample_with_onyx(d, [latents] + [t.float() for t in draws], steps, scheduler_name,
                               extra)
        good, msg = against_references(got, refs[0], refs[1], f"{name}, {steps} steps")
        ok &= good
        msgs.append(msg)
    return ok, "; ".join(msgs)


def case_heun(tmp):
    """`onyx sample --scheduler heun`: HeunDiscreteScheduler's loop (two UNet calls a step, the
    last step one: 2k - 1 calls at float32 timesteps, the derivatives of a step's two calls
    averaged) from the same latents: linspace, Karras sigmas with v-prediction, and the model
    folder's DDPM file (leading spacing, clip_sample true there, so clipped as from_config makes
    it)."""
    from diffusers import HeunDiscreteScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    base = {key: scheduler.config[key] for key in ("num_train_timesteps", "beta_schedule",
                                                  "beta_start", "beta_end")}
    variants = [("heun linspace", {}, 6),
                ("heun Karras v", dict(use_karras_sigmas=True, prediction_type="v_prediction"), 5),
                ("heun (the folder's DDPM file)", None, 4),
                ("heun exponential leading", dict(use_exponential_sigmas=True,
                                                  timestep_spacing="leading"), 4)]
    ok, msgs = compare_variants(d, model, HeunDiscreteScheduler, base, variants,
                                torch.tensor([3, 1, 0]), 30, "heun", count_calls=True)
    return ok, "; ".join(msgs)


def case_unipc(tmp):
    """`onyx sample --scheduler unipc`: UniPCMultistepScheduler's loop from the same latents (the
    corrector with each new output, then the predictor): the folder's DDPM file (leading), bh1 of
    order 3, order 3 on Karras sigmas with sigma_min, the noise prediction (predict_x0 false) with
    v-prediction and trailing spacing, disable_corrector on exponential sigmas, and order 1; bh1
    or predict_x0 false with the zero final sigma (NaN images in diffusers) refused, exit 1."""
    from diffusers import UniPCMultistepScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    base = {key: scheduler.config[key] for key in ("num_train_timesteps", "beta_schedule",
                                                  "beta_start", "beta_end")}
    variants = [("bh2 2 (the folder's file)", None, 10),
                ("bh1 3 linspace sigma_min", dict(solver_order=3, solver_type="bh1",
                                                  final_sigmas_type="sigma_min"), 12),
                ("bh2 3 Karras sigma_min", dict(solver_order=3, use_karras_sigmas=True,
                                                final_sigmas_type="sigma_min"), 8),
                ("noise prediction v trailing sigma_min", dict(
                    predict_x0=False, timestep_spacing="trailing", prediction_type="v_prediction",
                    final_sigmas_type="sigma_min"), 7),
                ("disable_corrector [0, 2] exponential", dict(disable_corrector=[0, 2],
                                                              use_exponential_sigmas=True), 9),
                ("order 1", dict(solver_order=1), 6)]
    ok, msgs = compare_variants(d, model, UniPCMultistepScheduler, base, variants,
                                torch.tensor([1, 3, 2]), 40, "unipc")
    UniPCMultistepScheduler(**dict(base, solver_type="bh1")).save_pretrained(f"{d}/unipc-nan")
    p = subprocess.run([ONYX, "sample", d, "--scheduler", "unipc", "--scheduler_config",
                        f"{d}/unipc-nan/scheduler_config.json", "--num_inference_steps", "4",
                        "--class_labels", "1", "--output", f"{d}/nan.png"],
                       capture_output=True, text=True, timeout=300)
    refused = p.returncode == 1 and "sigma_min" in p.stderr and not os.path.exists(f"{d}/nan.png")
    ok &= refused
    msgs.append(f"bh1 with the zero final sigma: exit {p.returncode}")
    return ok, "; ".join(msgs)


def case_lms(tmp):
    """`onyx sample --scheduler lms`: LMSDiscreteScheduler's loop (Euler's sigmas and scaling, the
    step on the last four derivatives weighted by their Lagrange polynomials' integrals, which
    diffusers takes from scipy's quad) from the same latents: linspace (fractional timesteps),
    the folder's DDPM file (leading), Karras sigmas with v-prediction, trailing with
    sample-prediction."""
    from diffusers import LMSDiscreteScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    base = {key: scheduler.config[key] for key in ("num_train_timesteps", "beta_schedule",
                                                  "beta_start", "beta_end")}
    variants = [("lms linspace", {}, 9),
                ("lms (the folder's DDPM file)", None, 8),
                ("lms Karras v", dict(use_karras_sigmas=True, prediction_type="v_prediction"), 7),
                ("lms trailing sample", dict(timestep_spacing="trailing",
                                             prediction_type="sample"), 6)]
    ok, msgs = compare_variants(d, model, LMSDiscreteScheduler, base, variants,
                                torch.tensor([2, 0, 3]), 50, "lms")
    return ok, "; ".join(msgs)


def case_pndm(tmp):
    """`onyx sample --scheduler pndm`: PNDMScheduler with skip_prk_steps (PLMS, Stable Diffusion
    1.x's folders' scheduler: steps_offset 1, set_alpha_to_one false) against its loop from the
    same latents, epsilon and v-prediction; without skip_prk_steps (the class's default: the
    Runge-Kutta warm-up, 12 UNet calls, then PLMS) leading and v-prediction linspace; and the
    scheduler a folder's config names picked without --scheduler."""
    from diffusers import PNDMScheduler
    d, model, scheduler = make(tmp, "cls")
    model.eval()
    base = {key: scheduler.config[key] for key in ("num_train_timesteps", "beta_schedule",
                                                  "beta_start", "beta_end")}
    variants = [("plms leading", dict(skip_prk_steps=True, steps_offset=1), 12),
                ("plms v trailing", dict(skip_prk_steps=True, prediction_type="v_prediction",
                                         timestep_spacing="trailing", set_alpha_to_one=True), 5),
                ("prk warm-up leading (the class's default)", dict(steps_offset=1), 10),
                ("prk v linspace", dict(prediction_type="v_prediction",
                                        timestep_spacing="linspace"), 6)]
    labels = torch.tensor([0, 2, 4])
    msgs, ok = [], True
    for k, (name, cfg, steps) in enumerate(variants):
        sched = PNDMScheduler(**dict(base, **cfg))
        sched.save_pretrained(f"{d}/pndm{k}")
        latents = torch.randn((3, 3, 16, 16), generator=torch.Generator().manual_seed(20 + k))
        refs, _ = scheduler_loop_refs(model, sched, latents, steps, labels)
        extra = ("--class_labels", "0,2,4", "--scheduler_config",
                 f"{d}/pndm{k}/scheduler_config.json")
        got = sample_with_onyx(d, [latents], steps, "pndm", extra)
        good, msg = against_references(got, refs[0], refs[1],
                                       f"{name}, {len(sched.timesteps)} UNet calls")
        ok &= good
        msgs.append(msg)
    # no --scheduler: the config's _class_name (PNDMScheduler) picks it
    save_file({"latents": latents.numpy()}, f"{d}/noise.safetensors")
    p = onyx("sample", d, "--noise", f"{d}/noise.safetensors", "--class_labels", "0,2,4",
             "--num_inference_steps", str(steps), "--scheduler_config",
             f"{d}/pndm{len(variants) - 1}/scheduler_config.json", "--tensors",
             f"{d}/named.safetensors")
    same = np.array_equal(load_file(f"{d}/named.safetensors")["images"], got)
    ok &= "(pndm)" in p.stdout and same
    return ok, "; ".join(msgs) + f"; picked by the config's _class_name: {same}"


TRAIN = dict(per_device_train_batch_size=4, max_steps=10, learning_rate=2e-3, adam_beta1=0.95,
             adam_beta2=0.999, weight_decay=1e-6, lr_scheduler_type="cosine", warmup_steps=2,
             max_grad_norm=1.0, logging_steps=1, train_sampling_strategy="sequential",
             snr_gamma=5.0, use_ema=True, ema_max_decay=0.999, ema_use_warmup=True,
             ema_power=0.75, ema_inv_gamma=1.0, disable_tqdm=True, seed=3, report_to="none")


def onyx_train(d, data, out, **over):
    cfg = dict(TRAIN, model=d, train_data=data, output_dir=out, **over)
    with open(f"{out}.json", "w") as f:
        json.dump(cfg, f)
    onyx("train", f"{out}.json")
    with open(f"{out}/log_history.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def reference_run(model, scheduler, data, steps):
    """The loop of diffusers' training scripts on `data`'s batches in order."""
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel, compute_snr
    model.train()
    if isinstance(model, DiTTransformer2DModel):
        model.eval()  # its labels are not dropped: onyx trains it with class_dropout_prob 0
    ema = EMAModel(model.parameters(), decay=TRAIN["ema_max_decay"], use_ema_warmup=True,
                   inv_gamma=TRAIN["ema_inv_gamma"], power=TRAIN["ema_power"])
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["learning_rate"],
                            betas=(TRAIN["adam_beta1"], TRAIN["adam_beta2"]),
                            weight_decay=TRAIN["weight_decay"], eps=1e-8)
    sched = get_scheduler("cosine", optimizer=opt, num_warmup_steps=TRAIN["warmup_steps"],
                          num_training_steps=steps)
    bs, n, losses = TRAIN["per_device_train_batch_size"], len(data["pixel_values"]), []
    for step in range(steps):
        i = (step * bs) % n
        batch = {k: torch.tensor(v[i:i + bs]) for k, v in data.items()}
        x0, noise, t = batch["pixel_values"], batch["noise"], batch["timesteps"]
        extra = {k: batch[k] for k in ("class_labels", "encoder_hidden_states") if k in batch}
        pred = model(scheduler.add_noise(x0, noise, t), t, **extra).sample[:, :x0.shape[1]]
        snr = compute_snr(scheduler, t)
        w = torch.stack([snr, TRAIN["snr_gamma"] * torch.ones_like(t)], dim=1).min(dim=1)[0] / snr
        loss = F.mse_loss(pred.float(), noise.float(), reduction="none")
        loss = (loss.mean(dim=list(range(1, len(loss.shape)))) * w).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["max_grad_norm"])
        opt.step()
        sched.step()
        opt.zero_grad()
        ema.step(model.parameters())
        losses.append(loss.item())
    names = [n for n, _ in model.named_parameters()]
    return losses, dict(zip(names, [p.detach().numpy() for p in ema.shadow_params]))


def worst_tensor(got, want):
    """Largest relative difference over the tensors, the attention key biases left out: their
    gradient is zero up to rounding (a key bias adds the same to every score of a query), and
    AdamW turns that noise into steps of size lr in either implementation."""
    worst, wn = 0.0, ""
    for n, w in want.items():
        if n.endswith("to_k.bias"):
            continue
        e = float(np.abs(got[n] - w).max() / max(np.abs(w).max(), 1e-30))
        if e > worst:
            worst, wn = e, n
    return worst, wn


def case_train(tmp, name):
    d, model, scheduler = make(tmp, name)
    cfg = CONFIGS[name][0]
    rng = np.random.default_rng(5)
    c, sz = cfg["in_channels"], cfg["sample_size"]
    data = {"pixel_values": rng.uniform(-1, 1, (16, c, sz, sz)).astype(np.float32),
            "noise": rng.standard_normal((16, c, sz, sz)).astype(np.float32),
            "timesteps": rng.integers(0, 1000, 16).astype(np.int64)}
    classes = cfg.get("num_class_embeds") or cfg.get("num_embeds_ada_norm")
    if classes:
        data["class_labels"] = rng.integers(0, classes, 16).astype(np.int64)
    if cfg.get("cross_attention_dim"):
        data["encoder_hidden_states"] = rng.standard_normal(
            (16, 5, cfg["cross_attention_dim"])).astype(np.float32)
    tmp = os.path.join(tmp, name)
    os.makedirs(tmp, exist_ok=True)
    save_file(data, f"{tmp}/train.safetensors")
    over = {"class_dropout_prob": 0.0} if is_dit(name) else {}
    logs = onyx_train(d, f"{tmp}/train.safetensors", f"{tmp}/out-train", save_steps=10, **over)
    got = [e["loss"] for e in logs if "loss" in e]
    ref, shadow = reference_run(model, scheduler, data, 10)
    if len(got) != len(ref):
        return False, f"{len(got)} logged losses, expected {len(ref)}"
    lerr = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    saved = type(model).from_pretrained(f"{tmp}/out-train")
    w_final, n_final = worst_tensor({n: p.detach().numpy() for n, p in saved.named_parameters()},
                                    shadow)
    w_ck, n_ck = worst_tensor(load_file(
        f"{tmp}/out-train/checkpoint-10/ema/diffusion_pytorch_model.safetensors"), shadow)
    ok = lerr < TOL and w_final < TOL and w_ck < TOL
    return ok, (f"losses {got[0]:.4f} -> {got[-1]:.4f}, worst rel {lerr:.1e}; saved EMA weights "
                f"worst rel {w_final:.1e} ({n_final}), checkpoint ema/ {w_ck:.1e}")


def tiny_clip_pipeline(tmp, unet_dir):
    """A pipeline folder around the "cond" UNet: unet/, a tiny random CLIPTextModel (hidden size
    24, the UNet's cross_attention_dim) in text_encoder/ and a CLIP tokenizer (the byte alphabet,
    a few merges, model_max_length 12) in tokenizer/, as Stable Diffusion's folders hold them."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    from tokenizers import pre_tokenizers
    pipe = tempfile.mkdtemp(dir=tmp, prefix="pipe-")  # (each case its own)
    shutil.copytree(unet_dir, os.path.join(pipe, "unet"))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("s", "h"), ("i", "r"), ("sh", "ir"), ("shir", "t</w>"), ("o", "o"), ("b", "oo")]
    tokens = alphabet + [a + "</w>" for a in alphabet] + [a + b for a, b in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=12)
    tok.save_pretrained(os.path.join(pipe, "tokenizer"))
    torch.manual_seed(7)
    enc = CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=24, intermediate_size=40,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       max_position_embeddings=16,
                                       bos_token_id=vocab["<|startoftext|>"],
                                       eos_token_id=vocab["<|endoftext|>"])).eval()
    enc.save_pretrained(os.path.join(pipe, "text_encoder"))
    return pipe, tok, enc


def clip_hidden(tok, enc, texts):
    """The text encoder's last hidden state of texts as the scripts and the pipeline make it."""
    ids = tok(texts, padding="max_length", truncation=True, max_length=tok.model_max_length,
              return_tensors="pt").input_ids
    with torch.no_grad():
        return enc(ids)[0]


def against_loop(logs, model, scheduler, ref_data, out):
    """onyx's logged losses and output_dir's (EMA) weights against reference_run on ref_data:
    (losses, worst loss rel, worst weight rel, its tensor), or a message when the counts differ."""
    got = [e["loss"] for e in logs if "loss" in e]
    ref, shadow = reference_run(model, scheduler, ref_data, 10)
    if len(got) != len(ref):
        return f"{len(got)} logged losses, expected {len(ref)}"
    lerr = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    saved = type(model).from_pretrained(out)
    w, wn = worst_tensor({n: p.detach().numpy() for n, p in saved.named_parameters()}, shadow)
    return got, lerr, w, wn


def case_train_text(tmp):
    """train_text_to_image.py's step: captions per class label through the frozen text encoder
    of the pipeline folder (tokenized to model_max_length, no attention mask), the UNet trained
    on its last hidden state; losses and EMA weights as the PyTorch loop; output_dir gets the
    text_encoder/ and tokenizer/ folders."""
    d, model, scheduler = make(tmp, "cond")
    pipe, tok, enc = tiny_clip_pipeline(tmp, d)
    captions = ["a photo of a shirt", "a red dress, long", "two boots!"]
    rng = np.random.default_rng(6)
    data = {"pixel_values": rng.uniform(-1, 1, (16, 4, 16, 16)).astype(np.float32),
            "noise": rng.standard_normal((16, 4, 16, 16)).astype(np.float32),
            "timesteps": rng.integers(0, 1000, 16).astype(np.int64),
            "labels": rng.integers(0, 3, 16).astype(np.int64)}
    save_file(data, f"{tmp}/text.safetensors")
    out = f"{tmp}/out-text"
    logs = onyx_train(os.path.join(pipe, "unet"), f"{tmp}/text.safetensors", out, captions=captions)
    hidden = clip_hidden(tok, enc, [captions[k] for k in data["labels"]])
    ref_data = {k: v for k, v in data.items() if k != "labels"}
    ref_data["encoder_hidden_states"] = hidden.numpy()
    r = against_loop(logs, model, scheduler, ref_data, out)
    if isinstance(r, str):
        return False, r
    got, lerr, w, wn = r
    copied = all(os.path.exists(os.path.join(out, f)) for f in
                 ("text_encoder/config.json", "tokenizer/tokenizer_config.json"))
    # proportion_empty_prompts 1: every caption is the empty prompt
    model2 = type(model).from_pretrained(os.path.join(pipe, "unet"))
    logs = onyx_train(os.path.join(pipe, "unet"), f"{tmp}/text.safetensors", f"{out}-empty",
                      captions=captions, proportion_empty_prompts=1.0)
    ref_data["encoder_hidden_states"] = clip_hidden(tok, enc, [""] * 16).numpy()
    ref_empty, _ = reference_run(model2, scheduler, ref_data, 10)
    got_empty = [e["loss"] for e in logs if "loss" in e]
    eerr = max(abs(a - b) / abs(b) for a, b in zip(got_empty, ref_empty))
    return (lerr < TOL and w < TOL and copied and eerr < TOL,
            f"hidden {tuple(hidden.shape)}, losses {got[0]:.4f} -> {got[-1]:.4f}, worst rel {lerr:.1e}; "
            f"EMA weights worst rel {w:.1e} ({wn}); text_encoder/ and tokenizer/ in output_dir: "
            f"{copied}; proportion_empty_prompts 1 as the loop on empty prompts: {eerr:.1e}")


def case_lora_diffusers_file(tmp):
    """LoRA on a UNet2DConditionModel (lora_alpha 8 over r 4): output_dir also holds
    pytorch_lora_weights.safetensors as diffusers' LoRA scripts save it, which diffusers'
    load_lora_adapter (what StableDiffusionPipeline.load_lora_weights calls for the UNet) opens on
    the base folder: its output equals PEFT's loading of onyx's adapter_model.safetensors."""
    from peft import PeftModel
    d, model, scheduler = make(tmp, "cond")
    rng = np.random.default_rng(12)
    data = {"pixel_values": rng.uniform(-1, 1, (8, 4, 16, 16)).astype(np.float32),
            "encoder_hidden_states": rng.standard_normal((8, 5, 24)).astype(np.float32)}
    save_file(data, f"{tmp}/lora-cond.safetensors")
    out = f"{tmp}/out-lora-cond"
    onyx_train(d, f"{tmp}/lora-cond.safetensors", out, snr_gamma=0.0, use_ema=False, max_steps=4,
               lora={"r": 4, "lora_alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]})
    diff = UNet2DConditionModel.from_pretrained(d).eval()
    diff.load_lora_adapter(out, prefix="unet", weight_name="pytorch_lora_weights.safetensors")
    peft = PeftModel.from_pretrained(UNet2DConditionModel.from_pretrained(out), out).eval()
    f = feeds("cond", 13)
    args = (torch.tensor(f["pixel_values"]), torch.tensor(f["timesteps"]),
            torch.tensor(f["encoder_hidden_states"]))
    with torch.no_grad():
        want, have = peft(*args).sample.numpy(), diff(*args).sample.numpy()
        base = UNet2DConditionModel.from_pretrained(d).eval()(*args).sample.numpy()
    e, moved = rel(have, want), rel(base, want)
    return e < TOL and moved > 1e-3, (f"diffusers-loaded vs PEFT-loaded output rel {e:.1e} (the "
                                      f"adapters move the output by {moved:.1e})")


def case_resume(tmp):
    d, _, _ = make(tmp, "cls")
    rng = np.random.default_rng(6)
    data = {"pixel_values": rng.uniform(-1, 1, (16, 3, 16, 16)).astype(np.float32),
            "labels": rng.integers(0, 5, 16).astype(np.int64)}  # the classes as a classifier's
    save_file(data, f"{tmp}/draw.safetensors")
    onyx_train(d, f"{tmp}/draw.safetensors", f"{tmp}/full", save_steps=4)
    onyx_train(d, f"{tmp}/draw.safetensors", f"{tmp}/resumed", save_steps=4,
               resume_from_checkpoint=f"{tmp}/full/checkpoint-4")
    same = []
    for f in ("diffusion_pytorch_model.safetensors", "checkpoint-8/ema/diffusion_pytorch_model.safetensors",
              "checkpoint-8/diffusion_pytorch_model.safetensors"):
        a, b = load_file(f"{tmp}/full/{f}"), load_file(f"{tmp}/resumed/{f}")
        same.append(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a))
    return all(same), f"final EMA model, checkpoint-8 EMA, checkpoint-8 weights identical: {same}"


def case_lora(tmp):
    from peft import LoraConfig, PeftModel, get_peft_model
    d, model, scheduler = make(tmp, "cls")
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                     init_lora_weights=False)
    torch.manual_seed(9)
    peft_model = get_peft_model(model, cfg)
    peft_model.save_pretrained(f"{tmp}/adapter-start")
    rng = np.random.default_rng(8)
    data = {"pixel_values": rng.uniform(-1, 1, (12, 3, 16, 16)).astype(np.float32),
            "class_labels": rng.integers(0, 5, 12).astype(np.int64),
            "noise": rng.standard_normal((12, 3, 16, 16)).astype(np.float32),
            "timesteps": rng.integers(0, 1000, 12).astype(np.int64)}
    save_file(data, f"{tmp}/lora.safetensors")
    over = dict(snr_gamma=0.0, use_ema=False, max_steps=6, lr_scheduler_type="constant",
                warmup_steps=0, peft_config=f"{tmp}/adapter-start")
    logs = onyx_train(d, f"{tmp}/lora.safetensors", f"{tmp}/out-lora", **over)
    got = [e["loss"] for e in logs if "loss" in e]
    peft_model.train()
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=TRAIN["learning_rate"],
                            betas=(TRAIN["adam_beta1"], TRAIN["adam_beta2"]),
                            weight_decay=TRAIN["weight_decay"], eps=1e-8)
    ref = []
    for step in range(6):
        b = {k: torch.tensor(v[step * 4 % 12:step * 4 % 12 + 4]) for k, v in data.items()}
        pred = peft_model(scheduler.add_noise(b["pixel_values"], b["noise"], b["timesteps"]),
                          b["timesteps"], class_labels=b["class_labels"]).sample
        loss = F.mse_loss(pred.float(), b["noise"].float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, TRAIN["max_grad_norm"])
        opt.step()
        opt.zero_grad()
        ref.append(loss.item())
    lerr = max(abs(a - b) / abs(b) for a, b in zip(got, ref)) if len(got) == 6 else 1.0
    with open(f"{tmp}/out-lora/adapter_config.json") as f:
        task = json.load(f)["task_type"]
    loaded = PeftModel.from_pretrained(UNet2DModel.from_pretrained(f"{tmp}/out-lora"),
                                       f"{tmp}/out-lora").eval()
    peft_model.eval()
    f = feeds("cls", 11)
    args = (torch.tensor(f["pixel_values"]), torch.tensor(f["timesteps"]))
    with torch.no_grad():
        want = peft_model(*args, class_labels=torch.tensor(f["class_labels"])).sample.numpy()
        have = loaded(*args, class_labels=torch.tensor(f["class_labels"])).sample.numpy()
    oerr = rel(have, want)
    ok = lerr < TOL and oerr < TOL and task is None
    return ok, (f"{len(got)} losses {got[0]:.4f} -> {got[-1]:.4f}, worst rel {lerr:.1e}; "
                f"task_type {task}; PEFT-loaded output vs PyTorch-trained rel {oerr:.1e}")


def against_references(got, ref32, ref64, what):
    """Guided sampling multiplies rounding: within 1e-4 of diffusers' float32 run, or of its
    float64 run within 1e-4 or 2.5x diffusers float32's own distance to it. (Multistep solvers
    carry each step's rounding into the next: on AVX2 onyx's float32 runs stayed within 1.5x of
    diffusers' own distance; on a 2-core AVX-512 Xeon, whose oneDNN kernels sum in another order,
    DPM-Solver++ 2M trailing reached 2.1x and UniPC bh2 order 3 Karras 1.9x, and within 1.5x with
    ONYX_CPU=avx2; the mutations tried — LMS run as second order, UniPC without its corrector —
    miss by 0.15 to 1.0.)"""
    e32, e64 = float(np.abs(got - ref32).max()), float(np.abs(got - ref64).max())
    torch_err = float(np.abs(ref32 - ref64).max())
    ok = e32 <= TOL or e64 <= max(TOL, 2.5 * torch_err)
    return ok, (f"{what}: largest absolute difference to diffusers float32 {e32:.1e}, to its "
                f"float64 run {e64:.1e} (diffusers float32's own {torch_err:.1e})")


def guided_ddim(model, ddim, x, cond, neg, scale, dtype, transform=True):
    """Stable Diffusion's pipeline loop (the UNet on [negative, prompt], guided, DDIM) in dtype;
    the output transform x/2 + 0.5 unless `transform` is False (latents, for a VAE)."""
    m = model.to(dtype)
    x, cond, neg = x.to(dtype), cond.to(dtype), neg.to(dtype)
    with torch.no_grad():
        for t in ddim.timesteps:
            out = m(torch.cat([x, x]), t, encoder_hidden_states=torch.cat([neg, cond])).sample
            uncond, text = out.chunk(2)
            x = ddim.step(uncond + scale * (text - uncond), t, x).prev_sample
    model.float()
    return (x / 2 + 0.5).clamp(0, 1).float().numpy() if transform else x.float().numpy()


def case_ddim_guidance(tmp):
    import warnings
    from diffusers import DDIMScheduler
    d, model, scheduler = make(tmp, "cond")
    model.eval()
    ddim = DDIMScheduler.from_config(scheduler.config)
    ddim.set_timesteps(6)
    g = torch.Generator().manual_seed(2)
    x = torch.randn((2, 4, 16, 16), generator=g)
    cond, neg = torch.randn((2, 7, 24), generator=g), torch.randn((2, 7, 24), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # diffusers' note on casting a model to float64
        ref32 = guided_ddim(model, ddim, x, cond, neg, 4.0, torch.float32)
        ref64 = guided_ddim(model, ddim, x, cond, neg, 4.0, torch.float64)
    save_file({"encoder_hidden_states": cond.numpy(), "negative_encoder_hidden_states": neg.numpy()},
              f"{d}/prompts.safetensors")
    got = sample_with_onyx(d, [x], 6, "ddim", ("--encoder_hidden_states",
                                                f"{d}/prompts.safetensors",
                                                "--guidance_scale", "4"))
    return against_references(got, ref32, ref64, "6 steps, guidance 4")


def case_ddim_prompt(tmp):
    """`onyx sample --prompt` on the pipeline's unet/: the prompts and the empty negative prompt
    through the pipeline's text_encoder/ and tokenizer/ (StableDiffusionPipeline.encode_prompt),
    then the guided DDIM loop, against the same loop on Transformers' encoder output."""
    import warnings
    from diffusers import DDIMScheduler
    d, model, scheduler = make(tmp, "cond")
    model.eval()
    pipe, tok, enc = tiny_clip_pipeline(tmp, d)
    prompts = ["a photo of a shirt", "two boots!"]
    cond, neg = clip_hidden(tok, enc, prompts), clip_hidden(tok, enc, ["", ""])
    ddim = DDIMScheduler.from_config(scheduler.config)
    ddim.set_timesteps(5)
    x = torch.randn((2, 4, 16, 16), generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref32 = guided_ddim(model, ddim, x, cond, neg, 3.0, torch.float32)
        ref64 = guided_ddim(model, ddim, x, cond, neg, 3.0, torch.float64)
    got = sample_with_onyx(os.path.join(pipe, "unet"), [x], 5, "ddim",
                           ("--prompt", *prompts, "--guidance_scale", "3"))
    return against_references(got, ref32, ref64, "5 steps, 2 prompts, guidance 3")


VAES = {
    # two blocks, one resnet each, the mid block's attention, quant convs: SD's layout, small
    "vae": dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                layers_per_block=1, norm_num_groups=4, sample_size=16),
    # three blocks, two resnets, no attention, no quant convs (as Flux's), one latent channel more
    "vae-plain": dict(in_channels=1, out_channels=1, latent_channels=5, block_out_channels=(8, 8, 16),
                      down_block_types=("DownEncoderBlock2D",) * 3,
                      up_block_types=("UpDecoderBlock2D",) * 3, layers_per_block=2,
                      norm_num_groups=8, use_quant_conv=False, use_post_quant_conv=False,
                      mid_block_add_attention=False, scaling_factor=0.3, shift_factor=0.1),
}


def make_vae(tmp, name):
    from diffusers import AutoencoderKL
    torch.manual_seed(len(name) + 20)
    vae = AutoencoderKL(**VAES[name]).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    d = os.path.join(tmp, f"autoencoder-{name}")
    vae.save_pretrained(d)
    return d, vae


def case_vae_forward(tmp, name):
    """`onyx run` on an AutoencoderKL folder: the latent distribution's mean and (clamped)
    log-variance and the decoded mean against diffusers' encode / decode (float32, 1e-4)."""
    d, vae = make_vae(tmp, name)
    c = VAES[name]
    x = np.random.default_rng(3).uniform(-1, 1, (2, c["in_channels"], 16, 24)).astype(np.float32)
    save_file({"sample": x}, f"{d}/in.safetensors")
    onyx("run", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/out.safetensors")
    got = load_file(f"{d}/out.safetensors")
    with torch.no_grad():
        dist = vae.encode(torch.tensor(x)).latent_dist
        ref = {"latent_mean": dist.mean, "latent_logvar": dist.logvar,
               "model_output": vae.decode(dist.mode()).sample}
    errs = {k: rel(got[k], v.numpy()) for k, v in ref.items()}
    return max(errs.values()) < TOL, ", ".join(f"{k} rel {e:.1e}" for k, e in errs.items())


def latent_pipeline(tmp):
    """Stable Diffusion's folder layout in small: the "cond" UNet, a CLIP text encoder and
    tokenizer, and the "vae" AutoencoderKL (3x16x16 images <-> 4x8x8 latents) in vae/."""
    d, model, scheduler = make(tmp, "cond")
    pipe, tok, enc = tiny_clip_pipeline(tmp, d)
    vd, vae = make_vae(tmp, "vae")
    shutil.copytree(vd, os.path.join(pipe, "vae"))
    return pipe, model, scheduler, tok, enc, vae


def case_train_latents(tmp):
    """train_text_to_image.py's step whole: images through the frozen VAE (latent_dist mean +
    std * the batch's latent_noise, times scaling_factor), captions through the text encoder, the
    UNet on the latents; losses and EMA weights as the PyTorch loop, vae/ copied to output_dir."""
    pipe, model, scheduler, tok, enc, vae = latent_pipeline(tmp)
    captions = ["a photo of a shirt", "two boots!"]
    rng = np.random.default_rng(14)
    data = {"pixel_values": rng.uniform(-1, 1, (16, 3, 16, 16)).astype(np.float32),
            "latent_noise": rng.standard_normal((16, 4, 8, 8)).astype(np.float32),
            "noise": rng.standard_normal((16, 4, 8, 8)).astype(np.float32),
            "timesteps": rng.integers(0, 1000, 16).astype(np.int64),
            "labels": rng.integers(0, 2, 16).astype(np.int64)}
    save_file(data, f"{tmp}/latent.safetensors")
    out = f"{tmp}/out-latent"
    logs = onyx_train(os.path.join(pipe, "unet"), f"{tmp}/latent.safetensors", out, captions=captions)
    with torch.no_grad():
        dist = vae.encode(torch.tensor(data["pixel_values"])).latent_dist
        latents = (dist.mean + dist.std * torch.tensor(data["latent_noise"])) * vae.config.scaling_factor
    hidden = clip_hidden(tok, enc, [captions[k] for k in data["labels"]])
    ref_data = {"pixel_values": latents.numpy(), "noise": data["noise"],
                "timesteps": data["timesteps"], "encoder_hidden_states": hidden.numpy()}
    r = against_loop(logs, model, scheduler, ref_data, out)
    if isinstance(r, str):
        return False, r
    got, lerr, w, wn = r
    copied = os.path.exists(os.path.join(out, "vae", "diffusion_pytorch_model.safetensors"))
    # without latent_noise the draws are onyx's own: the same in two runs of one seed
    drawn = {k: v for k, v in data.items() if k != "latent_noise"}
    save_file(drawn, f"{tmp}/drawn.safetensors")
    runs = [[e["loss"] for e in onyx_train(os.path.join(pipe, "unet"), f"{tmp}/drawn.safetensors",
                                           f"{tmp}/out-drawn{k}", captions=captions, max_steps=2)
             if "loss" in e] for k in range(2)]
    same = runs[0] == runs[1] and runs[0] != got[:2]
    return (lerr < TOL and w < TOL and copied and same,
            f"latents {tuple(latents.shape)}, losses {got[0]:.4f} -> {got[-1]:.4f}, worst rel "
            f"{lerr:.1e}; EMA weights worst rel {w:.1e} ({wn}); vae/ in output_dir: {copied}; "
            f"drawn latents: two runs equal, unlike the given draws: {same}")


def case_sample_latents(tmp):
    """`onyx sample --prompt` on the pipeline's unet/: the guided DDIM loop on latents, decoded by
    the pipeline's vae/ (vae.decode(latents / scaling_factor), then the pipeline's x/2 + 0.5)."""
    import warnings
    from diffusers import DDIMScheduler
    pipe, model, scheduler, tok, enc, vae = latent_pipeline(tmp)
    model.eval()
    cond, neg = clip_hidden(tok, enc, ["a photo of a shirt"]), clip_hidden(tok, enc, [""])
    ddim = DDIMScheduler.from_config(scheduler.config)
    ddim.set_timesteps(4)
    x = torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(5))

    def decoded(dtype):
        lat = guided_ddim(model, ddim, x, cond, neg, 2.0, dtype, transform=False)
        v = vae.to(dtype)
        with torch.no_grad():
            img = v.decode(torch.tensor(lat).to(dtype) / vae.config.scaling_factor).sample
        vae.float()
        return (img / 2 + 0.5).clamp(0, 1).float().numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref32, ref64 = decoded(torch.float32), decoded(torch.float64)
    got = sample_with_onyx(os.path.join(pipe, "unet"), [x], 4, "ddim",
                           ("--prompt", "a photo of a shirt", "--guidance_scale", "2"))
    if got.shape != ref32.shape:
        return False, f"images {got.shape}, diffusers {ref32.shape}"
    return against_references(got, ref32, ref64, "4 steps, decoded to 3x16x16")


def case_pipeline_folders(tmp):
    """A model folder takes the VAE of its pipeline only (a unet/ folder, or one whose parent
    has model_index.json), not a vae/ that merely sits beside it."""
    d, _, _ = make(tmp, "cond")
    vd, _ = make_vae(tmp, "vae")
    shapes = {}
    for layout in ("stray", "unet", "model_index"):
        root = os.path.join(tmp, f"layout-{layout}")
        model = os.path.join(root, "unet" if layout == "unet" else "denoiser")
        shutil.copytree(d, model)
        shutil.copytree(vd, os.path.join(root, "vae"))
        if layout == "model_index":
            with open(os.path.join(root, "model_index.json"), "w") as f:
                json.dump({"_class_name": "StableDiffusionPipeline"}, f)
        n = 6 if layout == "unet" else 1  # (6: the VAE decodes 4 rows at a time)
        x = torch.randn((n, 4, 8, 8), generator=torch.Generator().manual_seed(1))
        shapes[layout] = sample_with_onyx(model, [x], 2, "ddim", ("--encoder_hidden_states",
                                                                  prompts_file(tmp, n))).shape
    want = {"stray": (1, 4, 8, 8), "unet": (6, 3, 16, 16), "model_index": (1, 3, 16, 16)}
    return shapes == want, f"image shapes by layout: {shapes}"


def prompts_file(tmp, n):
    path = os.path.join(tmp, f"prompts-{n}.safetensors")
    rng = np.random.default_rng(2)
    save_file({"encoder_hidden_states": rng.standard_normal((n, 5, 24)).astype(np.float32)}, path)
    return path


def case_dit_guidance(tmp):
    import warnings
    from diffusers import DDIMScheduler
    d, model, scheduler = make(tmp, "dit")
    model.eval()
    ddim = DDIMScheduler.from_config(scheduler.config)
    ddim.set_timesteps(6)
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn((3, 3, 8, 8), generator=g)
    labels, null = torch.tensor([1, 4, 0]), torch.full((3,), 5)

    def loop(dtype):
        m, x = model.to(dtype), x0.to(dtype)
        with torch.no_grad():
            for t in ddim.timesteps:
                out = m(torch.cat([x, x]), t.expand(6), class_labels=torch.cat([labels, null])).sample
                eps = out[:, :3]
                cond, uncond = eps.chunk(2)
                x = ddim.step(uncond + 1.5 * (cond - uncond), t, x).prev_sample
        model.float()
        return (x / 2 + 0.5).clamp(0, 1).float().numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref32, ref64 = loop(torch.float32), loop(torch.float64)
    got = sample_with_onyx(d, [x0], 6, "ddim", ("--class_labels", "1,4,0", "--guidance_scale",
                                                 "1.5"))
    return against_references(got, ref32, ref64, "6 steps, guidance 1.5")


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
    for name in VAES:
        cases.append((f"{name}-forward", lambda t, n=name: case_vae_forward(t, n)))
    cases.append(("ddpm-pipeline", lambda t: case_pipeline(t, "ddpm")))
    cases.append(("ddim-pipeline", lambda t: case_pipeline(t, "ddim")))
    cases.append(("ddim-eta-pipeline", lambda t: case_pipeline(t, "ddim-eta")))
    cases.append(("ddim-classes", case_ddim_classes))
    cases.append(("dpmsolver", case_dpmsolver))
    cases.append(("euler", case_euler))
    cases.append(("heun", case_heun))
    cases.append(("pndm", case_pndm))
    cases.append(("unipc", case_unipc))
    cases.append(("lms", case_lms))
    cases.append(("ddim-guidance", case_ddim_guidance))
    cases.append(("ddim-prompt", case_ddim_prompt))
    cases.append(("train-ema-snr", lambda t: case_train(t, "cls")))
    cases.append(("train-cond-ema-snr", lambda t: case_train(t, "cond")))
    cases.append(("train-dit-ema-snr", lambda t: case_train(t, "dit")))
    cases.append(("train-text-to-image", case_train_text))
    cases.append(("train-latent-text-to-image", case_train_latents))
    cases.append(("sample-latent-prompt", case_sample_latents))
    cases.append(("pipeline-folders", case_pipeline_folders))
    cases.append(("dit-guidance", case_dit_guidance))
    cases.append(("train-resume", case_resume))
    cases.append(("lora", case_lora))
    cases.append(("lora-diffusers-file", case_lora_diffusers_file))
    cases.append(("draws", case_draws))
    return run_cases(cases, "onyx-test-diffusion-")


if __name__ == "__main__":
    sys.exit(main())
