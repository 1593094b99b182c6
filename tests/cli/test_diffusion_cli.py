"""test_diffusion_cli.py — diffusion training and sampling from the CLI on tiny data (issue #41):

  train-sample    `onyx train` on a diffusers UNet2DModel folder holding only config.json (the
                  example's architecture, narrower), over IDX images with labels, use_ema and
                  snr_gamma: the loss falls; the output folder holds config.json,
                  diffusion_pytorch_model.safetensors and scheduler_config.json that diffusers
                  opens (UNet2DModel / DDPMScheduler.from_pretrained), checkpoint-N/ema likewise;
                  `onyx sample --per_class 2 --scheduler ddim` writes a PNG of 10 rows x 2 images
                  (its size checked) and images in [0, 1]; the same seed gives the same images at another
                  batch size (each image's noise is its own; 1e-4: the convolutions' sums
                  differ in order between batch sizes)
  export-onnx     `onyx export OUTPUT_DIR --output unet.onnx` of a trained folder: the sampling
                  graph (sample, timestep, class_labels -> model_output) run by ONNX Runtime equals
                  `onyx run OUTPUT_DIR` (1e-5 relative)
  bad-config      config.json with an unsupported block type, groups that do not divide the
                  channels, lists of different lengths, invalid JSON: exit 1 naming the file and
                  the key, nothing written
  bad-inputs      a weights file of another shape, class labels outside num_class_embeds (train
                  and sample), too many inference steps, an unconditional sample given labels,
                  DDIM's eta outside [0, 1] or given to DDPM,
                  a noise_scheduler with an unknown beta_schedule: exit 1 with the reason

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_diffusion_cli.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
from case_runner import run_cases  # noqa: E402

ONYX = os.path.abspath(os.environ.get("ONYX", os.path.join(REPO, "build", "onyx")))
CONFIG = json.load(open(os.path.join(REPO, "examples", "fashion_diffusion", "unet", "config.json")))
CONFIG.update(block_out_channels=[8, 16, 16], norm_num_groups=4, attention_head_dim=8)


def onyx(*args, check=True):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=900)
    if check and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def write_idx(path, arr):
    arr = np.asarray(arr, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">I", 0x0800 | arr.ndim))
        f.write(struct.pack(f">{arr.ndim}I", *arr.shape))
        f.write(arr.tobytes())


def tiny_data(tmp, n=64, labels_high=10):
    """Blobs whose brightness and position depend on the label (28x28, as Fashion-MNIST)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, labels_high, n)
    yy, xx = np.mgrid[0:28, 0:28]
    imgs = [255 * np.exp(-((yy - 6 - 1.5 * l) ** 2 + (xx - 14) ** 2) / 20) for l in labels]
    write_idx(f"{tmp}/images.idx", np.stack(imgs))
    write_idx(f"{tmp}/labels.idx", labels)
    return f"{{type: idx_images, images: {tmp}/images.idx, labels: {tmp}/labels.idx}}"


def unet_folder(tmp, name, **over):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/config.json", "w") as f:
        json.dump(dict(CONFIG, **over), f)
    return d


def train_config(tmp, model, data, out, extra=""):
    cfg = os.path.join(tmp, f"{os.path.basename(out)}.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {model}
train_data: {data}
output_dir: {out}
max_steps: 40
per_device_train_batch_size: 16
learning_rate: 2.0e-3
warmup_steps: 4
logging_steps: 10
save_steps: 40
snr_gamma: 5.0
use_ema: true
ema_max_decay: 0.99
disable_tqdm: true
{extra}""")
    return cfg


def case_train_sample(tmp):
    model, out = unet_folder(tmp, "unet"), os.path.join(tmp, "run")
    onyx("train", train_config(tmp, model, tiny_data(tmp), out))
    losses = [json.loads(l)["loss"] for l in open(f"{out}/log_history.jsonl") if '"loss"' in l]
    from diffusers import DDPMScheduler, UNet2DModel
    UNet2DModel.from_pretrained(out)
    UNet2DModel.from_pretrained(f"{out}/checkpoint-40/ema")
    sched = DDPMScheduler.from_pretrained(out)
    png, t1, t2 = f"{tmp}/grid.png", f"{tmp}/a.safetensors", f"{tmp}/b.safetensors"
    onyx("sample", out, "--per_class", "2", "--scheduler", "ddim", "--num_inference_steps", "5",
         "--output", png, "--tensors", t1, "--seed", "7")
    onyx("sample", out, "--per_class", "2", "--scheduler", "ddim", "--num_inference_steps", "5",
         "--tensors", t2, "--seed", "7", "--batch_size", "3")
    from safetensors.numpy import load_file
    a, b = load_file(t1)["images"], load_file(t2)["images"]
    with open(png, "rb") as f:
        head = f.read(24)
    w, h = struct.unpack(">II", head[16:24])
    want_w, want_h = 2 + 2 * (28 * 2 + 2), 2 + 10 * (28 * 2 + 2)
    ok = (losses[-1] < 0.7 * losses[0] and head[:8] == b"\x89PNG\r\n\x1a\n" and (w, h) ==
          (want_w, want_h) and a.shape == (20, 1, 28, 28) and a.min() >= 0 and a.max() <= 1
          and float(np.abs(a - b).max()) < 1e-4 and sched.config.num_train_timesteps == 1000)
    return ok, (f"losses {losses[0]:.3f} -> {losses[-1]:.3f}; PNG {w}x{h} (want {want_w}x"
                f"{want_h}); images {a.shape} in [{a.min():.2f}, {a.max():.2f}]; same seed at "
                f"another batch size: largest difference {float(np.abs(a - b).max()):.1e}")


def case_export_onnx(tmp):
    import onnxruntime as ort
    from safetensors.numpy import load_file, save_file
    out = os.path.join(tmp, "run")
    onyx("train", train_config(tmp, unet_folder(tmp, "unet"), tiny_data(tmp), out), "--max_steps",
         "3")
    onyx("export", out, "--output", f"{tmp}/unet.onnx")
    rng = np.random.default_rng(1)
    feeds = {"sample": rng.standard_normal((3, 1, 28, 28)).astype(np.float32),
             "timestep": np.array([0, 400, 999]), "class_labels": np.array([2, 9, 0])}
    save_file(feeds, f"{tmp}/in.safetensors")
    onyx("run", out, "--inputs", f"{tmp}/in.safetensors", "--output", f"{tmp}/out.safetensors")
    want = load_file(f"{tmp}/out.safetensors")["model_output"]
    sess = ort.InferenceSession(f"{tmp}/unet.onnx", providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    e = float(np.abs(got - want).max() / np.abs(want).max())
    names = [i.name for i in sess.get_inputs()]
    return e < 1e-5, f"inputs {names}; ONNX Runtime vs onyx run: rel {e:.1e}"


def expect_error(args, *needles):
    p = onyx(*args, check=False)
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    ok = p.returncode != 0 and all(n in err for n in needles)
    return ok, err


def case_bad_config(tmp):
    data = tiny_data(tmp)
    cases = [
        (dict(down_block_types=["CrossAttnDownBlock2D", "DownBlock2D", "DownBlock2D"]),
         ("config.json", "CrossAttnDownBlock2D", "not supported")),
        (dict(norm_num_groups=3), ("config.json", "norm_num_groups 3")),
        (dict(block_out_channels=[8, 16]), ("config.json", "same length")),
    ]
    msgs, ok = [], True
    for i, (over, needles) in enumerate(cases):
        d, out = unet_folder(tmp, f"bad{i}", **over), os.path.join(tmp, f"out{i}")
        good, err = expect_error(["train", train_config(tmp, d, data, out)], *needles)
        good = good and not os.path.exists(os.path.join(out, "diffusion_pytorch_model.safetensors"))
        ok &= good
        msgs.append(err.replace(tmp, "T"))
    d = unet_folder(tmp, "badjson")
    with open(f"{d}/config.json", "w") as f:
        f.write('{"_class_name": "UNet2DModel", ')
    good, err = expect_error(["sample", d, "--num_images", "1"], "config.json", "JSON")
    ok &= good
    msgs.append(err.replace(tmp, "T"))
    return ok, " | ".join(msgs)


def case_bad_inputs(tmp):
    from safetensors.numpy import save_file
    data = tiny_data(tmp)
    msgs, ok = [], True

    def check(args, *needles):
        nonlocal ok
        good, err = expect_error(args, *needles)
        ok &= good
        msgs.append(err.replace(tmp, "T"))

    d = unet_folder(tmp, "shape")
    save_file({"conv_in.weight": np.zeros((8, 2, 3, 3), np.float32)},
              f"{d}/diffusion_pytorch_model.safetensors")
    check(["train", train_config(tmp, d, data, f"{tmp}/o1")], "conv_in.weight", "shape")
    d = unet_folder(tmp, "few", num_class_embeds=3)
    check(["train", train_config(tmp, d, data, f"{tmp}/o2")], "3")
    d = unet_folder(tmp, "sched")
    check(["train", train_config(tmp, d, data, f"{tmp}/o3",
                                 "noise_scheduler: {beta_schedule: cubic}")], "cubic",
          "beta_schedule")
    out = os.path.join(tmp, "trained")
    onyx("train", train_config(tmp, unet_folder(tmp, "t"), data, out).replace(".yaml", ".yaml"),
         "--max_steps", "2")
    check(["sample", out, "--class_labels", "3,10"], "class label 10")
    check(["sample", out, "--num_images", "2"], "class-conditional")
    check(["sample", out, "--per_class", "1", "--num_inference_steps", "5000"],
          "num_inference_steps 5000")
    check(["sample", out, "--per_class", "1", "--scheduler", "ddim", "--eta", "1.5"], "eta", "1.5")
    check(["sample", out, "--per_class", "1", "--eta", "0.5"], "eta is DDIM's", "ddpm")
    # DPMSolverMultistepScheduler's options that are not built, in a config Python's json wrote
    for key, value, needle in (("use_beta_sigmas", "true", "use_beta_sigmas"),
                               ("use_karras_sigmas", 'true, "use_exponential_sigmas": true',
                                "choose one"),
                               ("algorithm_type", '"deis"', "deis"),
                               ("solver_order", "4", "solver_order")):
        with open(f"{tmp}/dpm-{key}.json", "w") as f:
            f.write('{"_class_name": "DPMSolverMultistepScheduler", "lambda_min_clipped": '
                    f'-Infinity, "{key}": {value}}}')
        check(["sample", out, "--per_class", "1", "--scheduler", "dpmsolver", "--scheduler_config",
               f"{tmp}/dpm-{key}.json"], f"dpm-{key}.json", needle)
    check(["sample", out, "--per_class", "1", "--scheduler", "deis"], "deis", "euler_ancestral",
          "unipc")
    check(["sample", out, "--per_class", "1", "--scheduler", "ddim", "--use_karras_sigmas"],
          "use_karras_sigmas", "ddim")
    # without --scheduler, the one the config names (as a pipeline steps with its folder's)
    for cls, name in (("DDIMScheduler", "(ddim)"), ("EulerAncestralDiscreteScheduler",
                                                     "(euler_ancestral)")):
        with open(f"{tmp}/named.json", "w") as f:
            json.dump({"_class_name": cls}, f)
        p = onyx("sample", out, "--per_class", "1", "--num_inference_steps", "2",
                 "--scheduler_config", f"{tmp}/named.json")
        ok &= name in p.stdout
        msgs.append(f"{cls}: {p.stdout.strip()}")
    with open(f"{tmp}/kdpm2.json", "w") as f:
        json.dump({"_class_name": "KDPM2DiscreteScheduler"}, f)
    check(["sample", out, "--per_class", "1", "--scheduler_config", f"{tmp}/kdpm2.json"],
          "kdpm2.json", "KDPM2DiscreteScheduler", "--scheduler")
    with open(f"{tmp}/prk.json", "w") as f:
        json.dump({"_class_name": "PNDMScheduler", "skip_prk_steps": False}, f)
    check(["sample", out, "--per_class", "1", "--num_inference_steps", "3", "--scheduler_config",
           f"{tmp}/prk.json"], "prk.json", "num_inference_steps >= 4")
    d = unet_folder(tmp, "uncond", num_class_embeds=None)
    onyx("train", train_config(tmp, d, data, f"{tmp}/uncond-out"), "--max_steps", "1")
    check(["sample", f"{tmp}/uncond-out", "--class_labels", "1"], "unconditional")
    # text-to-image: keys that go together, an encoder that is not CLIP's or lacks weights
    check(["train", train_config(tmp, d, data, f"{tmp}/o4", f"text_encoder: {d}")],
          "'text_encoder' and 'tokenizer' go together")
    check(["train", train_config(tmp, d, data, f"{tmp}/o5", "captions: [a, b]")],
          "'captions' and 'proportion_empty_prompts' need a text encoder")
    check(["train", train_config(tmp, d, data, f"{tmp}/o6", f"text_encoder: {d}\ntokenizer: {d}")],
          "config.json's model_type is missing", "CLIPTextModel")
    te = f"{tmp}/te"
    os.makedirs(te, exist_ok=True)
    with open(f"{te}/config.json", "w") as f:
        json.dump({"model_type": "clip_text_model", "architectures": ["CLIPTextModel"],
                   "vocab_size": 520, "hidden_size": 8, "intermediate_size": 8,
                   "num_hidden_layers": 1, "num_attention_heads": 2}, f)
    check(["sample", f"{tmp}/uncond-out", "--prompt", "a", "--text_encoder", te, "--tokenizer", te],
          te, "model.safetensors")
    check(["sample", f"{tmp}/uncond-out", "--prompt", "a"], "text_encoder/ and tokenizer/")
    return ok, " | ".join(msgs)


def main():
    return run_cases([("train-sample", case_train_sample), ("export-onnx", case_export_onnx),
                      ("bad-config", case_bad_config),
                      ("bad-inputs", case_bad_inputs)], "onyx-test-diffusion-cli-")


if __name__ == "__main__":
    sys.exit(main())
