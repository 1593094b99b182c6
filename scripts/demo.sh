#!/usr/bin/env bash
# The main job: installs what it needs, builds onyx, and trains a small ViT from scratch on
# Fashion-MNIST (Debian's dataset-fashion-mnist) with evaluation every epoch, checkpoints in
# build/demo-vit/, and a final test accuracy. Any TrainingArguments key can be overridden:
#   bash scripts/demo.sh --num_train_epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."
# what it is doing while it installs and builds (minutes the first time): setup's and build's lines
bash scripts/build.sh
echo "== training a ViT on Fashion-MNIST (config: examples/vit_fashion_mnist.yaml)"
time ./build/onyx train examples/vit_fashion_mnist.yaml "$@"
