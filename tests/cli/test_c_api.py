"""test_c_api.py — onyx's C API (include/onyx/onyx_c.h, libonyx_c.so) from C programs built with
-std=c99 -Wall -Werror (CMakeLists.txt: onyx_c_tests, onyx_c_example; scripts/build.sh builds
them next to build/onyx).

Cases (one PASS / FAIL line each):
  c-tests     build/onyx_c_tests SCRATCH (tests/c/test_capi.c): train steps on caller-owned
              buffers give onyx_trainer_train's losses bit for bit (the C++ Trainer's loop), lazy
              gradient reset, learning rate get / set, parameters out and in, save / load, the
              ONNX export, errors as statuses with messages; every one of its checks passes
  c-example   build/onyx_c_example OUT (examples/c/train_steps.c): a GPT-2 built from its config
              learns counting sequences through the C API (held-out loss lower; exit 0); its saved
              folder opens in Transformers and its exported model.onnx gives Transformers' logits
              in onnxruntime (1e-5) and continues a count

With ONYX_C_BUILD=build-aarch64 ONYX_C_EMULATOR=qemu-aarch64-static (scripts/test.sh does this
after scripts/build_aarch64.sh) the same cases run the cross-built aarch64 programs under qemu, and
  c-example-x86-vs-aarch64  the example's printed losses (every tenth step, held-out before and
              after) equal the x86 build's (build/onyx_c_example) within 2e-4 — what two GEMM
              libraries' summation orders leave after 60 steps, at the 4 decimals printed

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_c_api.py
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
from case_runner import run_cases  # noqa: E402

NATIVE_BUILD = os.path.dirname(os.path.abspath(os.environ.get("ONYX", "build/onyx")))
BUILD = os.path.abspath(os.environ.get("ONYX_C_BUILD", NATIVE_BUILD))
EMULATOR = os.environ.get("ONYX_C_EMULATOR", "").split()  # e.g. qemu-aarch64-static


def c_program(name, build=None):
    """The argv prefix that runs program `name` of BUILD (under the emulator when one is set)."""
    if build is not None:
        return [os.path.join(build, name)]
    return EMULATOR + [os.path.join(BUILD, name)]


def case_c_tests(tmp):
    scratch = os.path.join(tmp, "c-tests")
    os.makedirs(scratch)
    p = subprocess.run(c_program("onyx_c_tests") + [scratch], capture_output=True, text=True,
                       timeout=600)
    passed = len(re.findall(r"^PASS ", p.stdout, re.M))
    failed = re.findall(r"^FAIL .*$", p.stdout, re.M)
    ok = p.returncode == 0 and passed >= 18 and not failed
    return ok, (f"{passed} C checks passed" + (f"; failed: {failed[:3]}" if failed else "")
                + (f"; exit {p.returncode}: {p.stderr[-400:]}" if p.returncode else ""))


def case_c_example(tmp):
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers as tr
    out = os.path.join(tmp, "c-example")
    p = subprocess.run(c_program("onyx_c_example") + [out], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        return False, f"exit {p.returncode}: {p.stdout[-400:]} {p.stderr[-400:]}"
    held = re.search(r"held-out loss: ([\d.]+) before, ([\d.]+) after", p.stdout)
    s = ort.InferenceSession(os.path.join(out, "model.onnx"))
    ids = np.array([[3, 4, 5, 6, 7, 8]], dtype=np.int64)
    feeds = {i.name: ids if i.name == "input_ids" else np.ones_like(ids) for i in s.get_inputs()}
    got = s.run(None, feeds)[0]
    m = tr.GPT2LMHeadModel.from_pretrained(out)
    m.eval()
    with torch.no_grad():
        want = m(input_ids=torch.tensor(ids)).logits.numpy()
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    nxt = int(got[0, -1].argmax())
    ok = held is not None and rel < 1e-5 and nxt == 9
    return ok, (f"held-out loss {held[1]} -> {held[2]}; the exported ONNX in onnxruntime: "
                f"Transformers' logits to {rel:.1e}, continues 3..8 with {nxt}"
                if held else p.stdout[-400:])


def printed_losses(stdout):
    return [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+)", stdout, re.M)] + \
        [float(x) for x in re.findall(r"([\d.]+) (?:before|after)", stdout)]


def case_c_example_across(tmp):
    runs = {}
    for label, argv in (("x86", c_program("onyx_c_example", NATIVE_BUILD)),
                        ("emulated", c_program("onyx_c_example"))):
        p = subprocess.run(argv + [os.path.join(tmp, label)], capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            return False, f"{label}: exit {p.returncode}: {p.stderr[-400:]}"
        runs[label] = printed_losses(p.stdout)
    a, b = runs["x86"], runs["emulated"]
    diff = max((abs(x - y) for x, y in zip(a, b)), default=float("inf"))
    ok = len(a) == len(b) == 8 and diff <= 2e-4
    return ok, f"{len(a)} printed losses, largest difference {diff:.1e} (x86 {a[-3:]}, emulated {b[-3:]})"


def main():
    cases = [("c-tests", case_c_tests), ("c-example", case_c_example)]
    if EMULATOR:
        cases.append(("c-example-x86-vs-aarch64", case_c_example_across))
    return run_cases(cases, "onyx-test-c-")


if __name__ == "__main__":
    sys.exit(main())
