"""test_untrusted_data.py — weights, adapters, datasets and configs that would train silently
wrong (issue 34): each must stop `onyx train` before any step changes anything, with exit 1, a
message naming the tensor / input / key and where, and no checkpoint in output_dir.

  - a NaN in a model's weight, and a NaN in a PEFT adapter_model.safetensors (it trained "successfully"
    with loss 0);
  - a step none of whose labels carries loss (all -100: Transformers divides by 0 items);
  - a negative token id, and one past the vocabulary (ONNX's Gather wraps a negative id; PyTorch's
    embedding raises);
  - `packing: "yes"` and `lora.use_rslora: "yes"` (read as a truthy string by TRL / PEFT, silently
    by onyx before), a model path that does not exist (reported as a missing tokenizer);
  - a safetensors entry of shape [2^32, 2^32] (its size product wrapped to 0 bytes).
A control run with clean inputs trains (exit 0), so each case fails for its own reason.

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_untrusted_data.py
Prints one line per case and ends with "N passed, M failed".
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
TOK = os.path.join(REPO, "build", "bpe-reference")
if not os.path.exists(os.path.join(TOK, "vocab.json")):
    TOK = os.path.join(REPO, "..", "shared", "data", "gpt2-tokenizer")
VOCAB = 50257


def make_model(d):
    import torch
    import transformers as tr
    cfg = tr.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    torch.manual_seed(0)
    m = tr.LlamaForCausalLM(cfg)
    m.save_pretrained(d)
    return m


def write_yaml(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write("%s: %s\n" % (k, json.dumps(v)))


def save_tensors(path, arrays):
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path)


def train(tmp, name, model, train_data, **extra):
    out = os.path.join(tmp, "out-" + name)
    cfg = {"model": model, "train_data": train_data, "output_dir": out, "max_steps": 2,
           "per_device_train_batch_size": 2, "logging_steps": 1, "save_steps": 1,
           "save_strategy": "steps", "disable_tqdm": True, "learning_rate": 1e-3}
    cfg.update(extra)
    path = os.path.join(tmp, name + ".yaml")
    write_yaml(path, cfg)
    p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=600)
    saved = os.path.isdir(out) and any(n.startswith("checkpoint") for n in os.listdir(out))
    return p, saved


def expect_error(p, saved, pattern):
    if p.returncode != 1:
        return False, "rc %d: %s" % (p.returncode, p.stderr.strip()[-400:])
    if not p.stderr.startswith("onyx: error: ") or not re.search(pattern, p.stderr):
        return False, "error %r does not match %r" % (p.stderr.strip()[-400:], pattern)
    if saved:
        return False, "a checkpoint was written before the error"
    return True, p.stderr.strip().splitlines()[-1][:200]


def tensor_data(tmp, name, ids, labels):
    path = os.path.join(tmp, name + ".safetensors")
    ids = np.asarray(ids, np.int64)
    save_tensors(path, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                        "labels": np.asarray(labels, np.int64)})
    return path


def main():
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "llama")
        make_model(model)
        rows = os.path.join(tmp, "sft.jsonl")
        with open(rows, "w") as f:
            for i in range(4):
                f.write(json.dumps({"prompt": "Define word %d:" % i, "completion": " a word"}) + "\n")
        sft = {"type": "sft", "path": rows, "tokenizer": os.path.join(TOK, "vocab.json")}
        good_ids = [[5, 6, 7, 8], [9, 10, 11, 12]]

        def case(name, fn):
            try:
                ok, detail = fn()
            except Exception as e:  # noqa: BLE001
                ok, detail = False, "%s: %s" % (type(e).__name__, e)
            results.append((name, ok, detail))

        def control():
            p, saved = train(tmp, "control", model, sft)
            return p.returncode == 0 and saved, "rc %d %s" % (p.returncode, p.stderr.strip()[-200:])
        case("control: clean model, SFT rows, tensors train", control)

        def nan_weight():
            from safetensors.numpy import load_file
            bad = os.path.join(tmp, "llama-nan")
            make_model(bad)
            w = load_file(os.path.join(bad, "model.safetensors"))
            w["model.layers.0.mlp.up_proj.weight"][3, 5] = np.nan
            save_tensors(os.path.join(bad, "model.safetensors"), w)
            p, saved = train(tmp, "nan-weight", bad, sft)
            return expect_error(p, saved, r"parameter 'model\.layers\.0\.mlp\.up_proj\.weight' "
                                          r"holds nan \(element 101 of 1536")
        case("a NaN in model.safetensors", nan_weight)

        def nan_adapter():
            import peft
            import transformers as tr
            from safetensors.numpy import load_file
            m = tr.LlamaForCausalLM.from_pretrained(model)
            pm = peft.get_peft_model(m, peft.LoraConfig(r=4, lora_alpha=8,
                                                        target_modules=["q_proj", "v_proj"]))
            ad = os.path.join(tmp, "adapter-nan")
            pm.save_pretrained(ad)
            w = load_file(os.path.join(ad, "adapter_model.safetensors"))
            k = sorted(n for n in w if "lora_A" in n)[0]
            w[k][0, 0] = np.nan
            save_tensors(os.path.join(ad, "adapter_model.safetensors"), w)
            p, saved = train(tmp, "nan-adapter", model, sft, peft_config=ad)
            return expect_error(p, saved, r"parameter '[^']*lora_A[^']*' holds nan")
        case("a NaN in adapter_model.safetensors", nan_adapter)

        def all_masked():
            data = tensor_data(tmp, "masked", good_ids, [[-100] * 4] * 2)
            p, saved = train(tmp, "masked", model, data)
            return expect_error(p, saved, r"step 1: no label of its 1 batch\(es\) carries loss "
                                          r"\(every 'labels' is -100\)")
        case("a step whose labels are all -100", all_masked)

        def negative_id():
            data = tensor_data(tmp, "negative", [[5, 6, -5, 8], [9, 10, 11, 12]], good_ids)
            p, saved = train(tmp, "negative", model, data)
            return expect_error(p, saved, r"input 'input_ids' holds id -5 at row 0, position 2: "
                                          r"outside the embedding '[^']+' of 50257 rows")
        case("a negative token id", negative_id)

        def id_past_vocab():
            data = tensor_data(tmp, "past", [[5, 6, 7, 8], [9, 10, 11, VOCAB]], good_ids)
            p, saved = train(tmp, "past", model, data)
            return expect_error(p, saved, r"holds id 50257 at row 1, position 3")
        case("a token id past the vocabulary", id_past_vocab)

        def packing_yes():
            p, saved = train(tmp, "packing-yes", model, dict(sft, packing="yes"))
            return expect_error(p, saved, r"'packing' must be true or false, got 'yes'")
        case("packing: \"yes\"", packing_yes)

        def rslora_yes():
            p, saved = train(tmp, "rslora-yes", model, sft,
                             lora={"r": 4, "target_modules": ["q_proj"], "use_rslora": "yes"})
            return expect_error(p, saved, r"'lora\.use_rslora' must be true or false, got 'yes'")
        case("lora.use_rslora: \"yes\"", rslora_yes)

        def missing_model():
            p, saved = train(tmp, "missing", os.path.join(tmp, "no-such-model"), sft)
            return expect_error(p, saved, r"model '[^']*no-such-model' does not exist")
        case("a model path that does not exist", missing_model)

        def huge_shape():
            path = os.path.join(tmp, "huge.safetensors")
            header = json.dumps({"input_ids": {"dtype": "I64", "shape": [2 ** 32, 2 ** 32],
                                               "data_offsets": [0, 0]}}).encode()
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(header)) + header)
            p, saved = train(tmp, "huge", model, path)
            return expect_error(p, saved, r"huge\.safetensors': tensor 'input_ids': shape "
                                          r"\[4294967296, 4294967296\] (is too large|has more)")
        case("a safetensors shape of [2^32, 2^32]", huge_shape)
    passed = sum(ok for _, ok, _ in results)
    for name, ok, detail in results:
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else "\n    " + detail))
    print("%d passed, %d failed" % (passed, len(results) - passed))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
