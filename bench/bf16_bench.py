"""bf16_bench.py — mixed precision side by side: onyx `bf16: true` against onyx float32, PyTorch
2.13 eager float32, PyTorch CPU autocast bf16 (eager) and torch.compile under autocast, on the
models of the training benchmark (bench_models.py) and the Llama of llama_bench.py (onyx trains
its Hugging Face folder, PyTorch Transformers' LlamaForCausalLM), in one run.

  build/venv/bin/python bench/bf16_bench.py [--models bert-mini,gpt2-tiny,vit-tiny,bert-base,gpt2-small,llama]
      [--peers onyx,onyx-bf16,onyx-bf16-unpacked,torch,torch-bf16,compile-bf16] [--warmup 3,bert-base=2,gpt2-small=2,llama=2]
      [--steps 10,bert-base=5,gpt2-small=5,llama=5] [--out build/bench-bf16]

Every peer trains the same exported model from the same initial weights on the same batches with
train_bench.py's setup (AdamW lr 1e-4, clipping 1.0, one step per batch; onyx on the ONNX file,
PyTorch on the nn.Module). onyx bf16 = `bf16: true` (GEMM operands in bf16 — stored so by the
mixed_precision pass, with the GELU's and attention's inputs — float32 accumulation, norms,
softmax, loss, residual stream and gradients float32); PyTorch bf16 = `torch.autocast("cpu", torch.bfloat16)`
around the forward (its CPU policy: matmuls/linear in bf16, reductions, softmax and losses float32,
float32 master weights). All at the default thread count (all cores). Reported per model: samples/s
and ms/step (median of the steps after the warmup), the ratios of the issue (onyx bf16 / onyx
float32, onyx bf16 / each PyTorch bf16 peer), executed GFLOP/s (the FLOPs of onyx's optimized graph,
`onyx plan`) against the GEMM ceilings measured in the same run (onyx_bench gemm_ceiling/f32 and
/bf16: oneDNN float32 sgemm and bf16 matmul on 512x768x2048), the activation arena of `onyx plan`
with and without bf16, and the final-step loss of each peer. Writes OUT/bf16_results.json and
prints a Markdown table.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_models  # noqa: E402
import train_bench as tb  # noqa: E402

PEERS = ["onyx", "onyx-bf16", "onyx-bf16-unpacked", "torch", "torch-bf16", "compile-bf16"]
LABEL = {"onyx": "onyx float32", "onyx-bf16": "onyx bf16",
         "onyx-bf16-unpacked": "onyx bf16 ONYX_PREPACK=0", "torch": "PyTorch eager float32",
         "torch-bf16": "PyTorch eager autocast bf16", "compile-bf16": "torch.compile autocast bf16"}


def per_model(spec_text, name):
    """'3,bert-base=2' -> the value for `name`."""
    default, over = None, {}
    for part in spec_text.split(","):
        if "=" in part:
            k, v = part.split("=")
            over[k] = int(v)
        else:
            default = int(part)
    return over.get(name, default)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert-mini,gpt2-tiny,vit-tiny,bert-base,gpt2-small,llama")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--warmup", default="3,bert-base=2,gpt2-small=2,llama=2")
    ap.add_argument("--steps", default="10,bert-base=5,gpt2-small=5,llama=5")
    ap.add_argument("--onyx", default=os.path.join(tb.REPO, "build", "onyx"))
    ap.add_argument("--out", default=os.path.join(tb.REPO, "build", "bench-bf16"))
    a = ap.parse_args()
    peers = a.peers.split(",")
    for p in peers:
        if p not in PEERS:
            ap.error(f"unknown peer {p!r}; known: {', '.join(PEERS)}")
    os.makedirs(a.out, exist_ok=True)
    onyx_bench = os.path.join(os.path.dirname(a.onyx), "onyx_bench")
    ceil = tb.gemm_ceilings(onyx_bench)
    print("GEMM ceilings (512x768x2048, GFLOP/s): " +
          (", ".join(f"{k} {v:.0f}" for k, v in ceil.items()) or "onyx_bench not built"), flush=True)
    # The kernel path and oneDNN's instruction set: bf16 GEMMs run natively only on
    # AVX512_BF16 (else the bf16-rounded values are widened for float32 GEMMs).
    cpu = subprocess.run([a.onyx, "--version"], capture_output=True, text=True).stdout.splitlines()
    cpu = cpu[1] if len(cpu) > 1 else "?"
    print("onyx: " + cpu, flush=True)
    results = {"ceiling_gflops": ceil, "cpu": cpu, "models": {}}
    work = tempfile.mkdtemp(prefix="onyx-bf16-bench-")
    for name in a.models.split(","):
        spec = bench_models.BF16_SPECS[name]
        warm, steps = per_model(a.warmup, name), per_model(a.steps, name)
        mdir = os.path.join(work, name)
        info = tb.prepare(name, spec, mdir, warm + steps, opset=tb.BENCH_OPSET)
        plans = {k: tb.run_plan(a.onyx, name, spec, mdir, extra)["plain"]
                 for k, extra in (("float32", None), ("bf16", {"bf16": True}))}
        r = {"desc": spec["desc"], "batch": spec["batch"], "params": info["params"],
             "plan_gflop": plans["float32"].get("gflop"),
             "activations_mib": {k: v.get("activations_mib") for k, v in plans.items()},
             "bf16_ops": (re.findall(r"^.*bf16.*$", plans["bf16"].get("text", ""), re.M) or [""])[0],
             "runs": {}}
        for peer in peers:
            if peer == "onyx":
                o = tb.run_onyx(a.onyx, name, spec, mdir, warm + steps, warm)
            elif peer in ("onyx-bf16", "onyx-bf16-unpacked"):
                # unpacked: oneDNN repacks each weight per GEMM call instead of reading the
                # per-step pack (gemm.h declare_stable_weights; only where AVX512_BF16 gives a
                # bf16 matmul to pack for)
                unpacked = peer.endswith("unpacked")
                before = os.environ.get("ONYX_PREPACK")  # (a value set for the whole run stays)
                if unpacked:
                    os.environ["ONYX_PREPACK"] = "0"
                try:
                    o = tb.run_onyx(a.onyx, name, spec, mdir, warm + steps, warm,
                                    extra={"bf16": True}, tag_suffix="_bf16" + "_unpacked" * unpacked)
                finally:
                    if before is None:
                        os.environ.pop("ONYX_PREPACK", None)
                    else:
                        os.environ["ONYX_PREPACK"] = before
            else:
                o = tb.run_torch(name, mdir, warm + steps, warm, os.cpu_count(),
                                 compile_=peer.startswith("compile"), autocast=peer.endswith("bf16"))
            if "median_step_s" in o:
                o["sps"] = spec["batch"] / o["median_step_s"]
                if r["plan_gflop"]:
                    o["gflops"] = r["plan_gflop"] / o["median_step_s"]
            r["runs"][peer] = {k: o.get(k) for k in ("median_step_s", "sps", "gflops",
                                                      "peak_rss_mb", "error", "losses")}
            msg = (f"{o['median_step_s'] * 1e3:.0f} ms/step, {o['sps']:.2f} samples/s"
                   if "median_step_s" in o else f"FAILED: {o.get('error')}")
            print(f"[{name}] {LABEL[peer]}: {msg}", flush=True)
        results["models"][name] = r
    with open(os.path.join(a.out, "bf16_results.json"), "w") as f:
        json.dump(results, f, indent=1)

    def sps(r, p):
        return (r["runs"].get(p) or {}).get("sps")

    print("\n| model | " + " | ".join(f"{LABEL[p]} samples/s" for p in peers) +
          " | onyx bf16 / onyx fp32 | onyx bf16 / PyTorch autocast | onyx bf16 / torch.compile "
          "autocast | onyx bf16 GFLOP/s (% of bf16 ceiling) | activations fp32 → bf16 MiB |")
    print("|" + "---|" * (len(peers) + 6))
    for name, r in results["models"].items():
        cells = [f"{sps(r, p):.2f}" if sps(r, p) else "—" for p in peers]

        def ratio(x, y):
            return f"{sps(r, x) / sps(r, y):.2f}×" if sps(r, x) and sps(r, y) else "—"
        g = (r["runs"].get("onyx-bf16") or {}).get("gflops")
        gcell = (f"{g:.0f} ({100 * g / ceil['bf16']:.0f}%)" if g and ceil.get("bf16") else
                 (f"{g:.0f}" if g else "—"))
        act = r["activations_mib"]
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio('onyx-bf16', 'onyx')} | "
              f"{ratio('onyx-bf16', 'torch-bf16')} | {ratio('onyx-bf16', 'compile-bf16')} | {gcell} | "
              f"{act.get('float32')} → {act.get('bf16')} |")
    print(f"\nwrote {os.path.join(a.out, 'bf16_results.json')}; work files in {work}")


if __name__ == "__main__":
    main()
