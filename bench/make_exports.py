"""make_exports.py OUT_DIR — writes the benchmark's three models (bench_models.SPECS: bert-mini,
gpt2-tiny, vit-tiny), exported from PyTorch with the TorchScript exporter (dynamo=False) at opset 14
in training mode (train_bench.prepare; the benchmark itself exports at opset 17), to
OUT_DIR/<model>/{model.onnx, train.safetensors, init.safetensors}, for the tests that check the
passes on real exports (scripts/test.sh runs it before ctest; the gtests find them under
ONYX_BINARY_DIR/bench-exports). A model whose files are newer than its sources is
left as it is."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_models  # noqa: E402
import train_bench  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_exports.py OUT_DIR")
    out = sys.argv[1]
    sources = [os.path.join(HERE, "bench_models.py"), os.path.join(HERE, "train_bench.py"),
               os.path.join(os.path.dirname(HERE), "tests", "parity", "models.py")]
    newest = max(os.path.getmtime(s) for s in sources)
    for name, spec in bench_models.SPECS.items():
        path = os.path.join(out, name, "model.onnx")
        if os.path.exists(path) and os.path.getmtime(path) > newest:
            continue
        train_bench.prepare(name, spec, os.path.join(out, name), 2, opset=14)
        print("exported", path)


if __name__ == "__main__":
    main()
