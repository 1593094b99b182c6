"""Generates the official ONNX node test suite (model.onnx + test_data_set_*/) from the onnx
package of the reference venv (PyPI, pinned in scripts/setup.sh) into the folder given as argv[1]:
    build/venv/bin/python tests/conformance/generate.py OUT      -> OUT/node/test_*/
The node cases come from onnx.backend.test.case.node (each op's documented examples); they are
written with onnx's own writer (cmd_tools.generate_data), which in current onnx releases collects
only the model cases itself, so it is handed the node cases instead. A file OUT/onnx_version
records the onnx version the suite came from; a suite of another version is regenerated."""
import os
import shutil
import sys

import onnx
import onnx.backend.test.case.node as node_test
import onnx.backend.test.cmd_tools as cmd_tools


def main():
    out = sys.argv[1]
    stamp = os.path.join(out, "onnx_version")
    if os.path.isfile(stamp) and open(stamp).read().strip() == onnx.__version__ and \
            os.path.isdir(os.path.join(out, "node")):
        print(f"node suite of onnx {onnx.__version__} up to date in {out}")
        return
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cases = node_test.collect_testcases(None)

    class Collect:  # stands in for the model-case module cmd_tools asks
        @staticmethod
        def collect_testcases():
            return cases

    cmd_tools.model_test = Collect

    class Args:
        output = out
        op_type = None

    cmd_tools.generate_data(Args())
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"generated {len(cases)} node cases of onnx {onnx.__version__} into {out}")


if __name__ == "__main__":
    main()
