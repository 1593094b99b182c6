"""Generates the official ONNX node test suite (model.onnx + test_data_set_*/) from Debian's
python3-onnx into the folder given as argv[1]. numpy 1.24 removed aliases that onnx 1.12's
generators still use, so they are restored first."""
import os
import sys

import numpy as np

for alias, real in (("float", float), ("int", int), ("bool", bool), ("object", object),
                    ("complex", complex)):
    if not hasattr(np, alias):
        setattr(np, alias, real)

import onnx.backend.test.cmd_tools as cmd_tools  # noqa: E402


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    class Args:
        output = out
        op_type = None
    cmd_tools.generate_data(Args())
    print("generated into", out)


if __name__ == "__main__":
    main()
