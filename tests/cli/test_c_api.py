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

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_c_api.py
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
from case_runner import run_cases  # noqa: E402

BUILD = os.path.dirname(os.path.abspath(os.environ.get("ONYX", "build/onyx")))


def case_c_tests(tmp):
    scratch = os.path.join(tmp, "c-tests")
    os.makedirs(scratch)
    p = subprocess.run([os.path.join(BUILD, "onyx_c_tests"), scratch], capture_output=True,
                       text=True, timeout=300)
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
    p = subprocess.run([os.path.join(BUILD, "onyx_c_example"), out], capture_output=True,
                       text=True, timeout=300)
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


def main():
    return run_cases([("c-tests", case_c_tests), ("c-example", case_c_example)], "onyx-test-c-")


if __name__ == "__main__":
    sys.exit(main())
