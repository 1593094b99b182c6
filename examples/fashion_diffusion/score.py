"""score.py — how recognizable the Fashion-MNIST diffusion model's samples are: onyx samples N
images of every class (DDIM, 50 steps) from the trained folder, and the README's ViT classifier
(examples/vit_fashion_mnist.yaml, trained first when build/demo-vit is missing) labels them; the
score is the share it labels as the class they were sampled for (its accuracy on the real test
set is printed beside it). Also writes a grid of 10 samples per class (one row per class).

  build/venv/bin/python examples/fashion_diffusion/score.py [MODEL_DIR] [--per_class 100]
      [--grid docs/images/fashion_diffusion_samples.png] [--seed 0]
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]


def run(*args):
    print("+ " + " ".join(args), flush=True)
    subprocess.run(args, check=True, cwd=ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "build", "fashion-diffusion"))
    ap.add_argument("--per_class", type=int, default=100)
    ap.add_argument("--grid", default=os.path.join(ROOT, "docs", "images",
                                                   "fashion_diffusion_samples.png"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    vit = os.path.join(ROOT, "build", "demo-vit")
    if not os.path.exists(os.path.join(vit, "model.safetensors")):
        run(ONYX, "train", "examples/vit_fashion_mnist.yaml")
    os.makedirs(os.path.dirname(a.grid), exist_ok=True)
    run(ONYX, "sample", a.model, "--per_class", "10", "--scheduler", "ddim",
        "--num_inference_steps", "50", "--seed", str(a.seed), "--output", a.grid)
    samples = os.path.join(a.model, "samples.safetensors")
    run(ONYX, "sample", a.model, "--per_class", str(a.per_class), "--scheduler", "ddim",
        "--num_inference_steps", "50", "--seed", str(a.seed + 1), "--tensors", samples)
    s = load_file(samples)
    images, labels = s["images"], s["class_labels"]
    inputs = os.path.join(a.model, "vit-inputs.safetensors")
    save_file({"pixel_values": ((images - 0.5) / 0.5).astype(np.float32)}, inputs)
    out = os.path.join(a.model, "vit-outputs.safetensors")
    run(ONYX, "run", vit, "--inputs", inputs, "--output", out)
    pred = load_file(out)["logits"].argmax(-1)
    acc = float((pred == labels).mean())
    per = {CLASSES[k]: float((pred[labels == k] == k).mean()) for k in range(10)}
    real = None  # the classifier's last evaluation on the real test set
    with open(os.path.join(vit, "log_history.jsonl")) as f:
        for line in f:
            real = json.loads(line).get("eval_accuracy", real)
    print(json.dumps({"samples": int(len(labels)), "classifier_accuracy_on_samples": acc,
                      "per_class": per, "classifier_accuracy_on_real_test_images": real},
                     indent=1))
    print(f"the ViT labels {acc:.3f} of the samples as the class they were drawn for"
          + (f" (on real test images: {real:.3f})" if real else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
