"""test_readme.py — the snippets of README.md and of the guides it links (docs/EXPORTS.md,
PYTHON.md, FINE_TUNING.md, GENERATION.md, CUSTOM_OPS.md, DISTRIBUTED.md) as a reader would use them
(issue 35).

  - Every ```python block runs, in order (README first, then the guides in PAGES' order), in one
    scratch folder, with the onyx package that test_package.py installs (build/python-target):
    the one-line-changed Transformers script on WordNet and MiniLM, the two exporters writing
    model.onnx, the numpy Trainer training that model.onnx, the Transformers model object (the files and names it leaves to the reader —
    "my-bert", `tokenizer`, `tokenized` — are made first, FIXTURES below); the ```diff block for
    Optimum's ORTTrainer runs its new side the same way.
  - Every ```yaml block's keys are keys onyx reads (`onyx train --help` lists them).
  - Every shell block names scripts, example files and onyx subcommands that exist.

Run: ONYX=build/onyx build/venv/bin/python tests/python/test_readme.py
Prints one line per snippet and ends with "N passed, M failed".
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(REPO, "build")
ONYX = os.environ.get("ONYX", os.path.join(BUILD, "onyx"))
# The pages whose snippets run, in reading order (EXPORTS writes the model.onnx PYTHON trains).
PAGES = ["README.md", "docs/EXPORTS.md", "docs/PYTHON.md", "docs/FINE_TUNING.md",
         "docs/GENERATION.md", "docs/CUSTOM_OPS.md", "docs/DISTRIBUTED.md"]
TARGET = os.path.join(BUILD, "python-target")

# What a block leaves to the reader, made before it runs (keyed by a line of the block).
FIXTURES = {
    'BertForSequenceClassification.from_pretrained("my-bert")': '''
import os, datasets, transformers
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
open("vocab.txt", "w").write("\\n".join(vocab))
tokenizer = transformers.BertTokenizerFast(vocab_file="vocab.txt")
cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=48, num_labels=2)
transformers.BertForSequenceClassification(cfg).save_pretrained("my-bert")
rows = [{"text": " ".join(f"w{(i * 7 + j) % 59}" for j in range(3 + i % 5)), "label": i % 2}
        for i in range(40)]
tokenized = datasets.Dataset.from_list(rows).map(
    lambda b: tokenizer(b["text"]), batched=True).train_test_split(test_size=8, seed=0)
''',
    "from onyx import ORTTrainer, ORTTrainingArguments": '''
import transformers, onyx
exec(open("fixture_bert.py").read())
model = transformers.BertForSequenceClassification.from_pretrained("my-bert")
collator = transformers.DataCollatorWithPadding(tokenizer)
train, test = tokenized["train"], tokenized["test"]
''',
}


def blocks(text, lang):
    """The contents of the fenced blocks whose info string is `lang` ("" for plain ones)."""
    out, current, kind = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, kind = [], line[3:].strip()
            else:
                if kind == lang:
                    out.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return out


def run_python(code, cwd, name):
    path = os.path.join(cwd, name + ".py")
    with open(path, "w") as f:
        f.write(code)
    env = dict(os.environ, PYTHONPATH=TARGET)
    p = subprocess.run([sys.executable, path], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=900)
    return p.returncode == 0, (p.stdout + p.stderr)[-1500:]


def python_cases(readme, tmp):
    out = []
    os.makedirs(os.path.join(tmp, "build"), exist_ok=True)
    # the quick script reads build/wordnet (examples/make_wordnet_data.py writes it) and MiniLM
    subprocess.run([sys.executable, os.path.join(REPO, "examples", "make_wordnet_data.py"),
                    os.path.join(tmp, "build", "wordnet")], check=True, capture_output=True)
    with open(os.path.join(tmp, "fixture_bert.py"), "w") as f:
        f.write(FIXTURES['BertForSequenceClassification.from_pretrained("my-bert")'])
    snippets = blocks(readme, "python")
    diff = blocks(readme, "diff")
    for d in diff:  # the new side of a diff
        snippets.append("\n".join(l[1:] for l in d.splitlines() if l[:1] in ("+", " ")))
    for i, code in enumerate(snippets):
        prelude = "".join(v for k, v in FIXTURES.items() if k in code)
        if "onyx.Trainer" in code or "onyx." in code:
            prelude = "import onyx\n" + prelude
        first = code.strip().splitlines()[0][:70]
        ok, detail = run_python(prelude + code, tmp, f"snippet{i}")
        out.append((f"python block {i + 1}: {first}", ok, detail))
    return out


def known_keys():
    help_text = subprocess.run([ONYX, "train", "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"^  ([a-z_0-9]+):", help_text, re.M))


def yaml_cases(readme):
    import yaml
    keys, out = known_keys(), []
    for i, text in enumerate(blocks(readme, "yaml")):
        try:
            doc = yaml.safe_load(text)
            unknown = sorted(k for k in doc if k not in keys)
            ok, detail = not unknown and bool(doc), f"unknown keys {unknown}"
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        out.append((f"yaml block {i + 1}: {', '.join(list(doc)[:4]) if ok else '?'}", ok, detail))
    return out


def shell_cases(readme):
    subcommands = set(re.findall(r"^  ([a-z-]+)\s", subprocess.run(
        [ONYX, "--help"], capture_output=True, text=True).stdout, re.M))
    out = []
    for i, text in enumerate(blocks(readme, "")):
        problems = []
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            for w in words:  # files of the repository the line names
                if re.match(r"^(scripts|examples)/[\w./-]+$", w) and not os.path.exists(
                        os.path.join(REPO, w)):
                    problems.append(f"{w} does not exist")
            if words[0] == "build/onyx":
                sub = next((w for w in words[1:] if not w.startswith("-") and "/" not in w
                            and not w.endswith(".so")), None)
                if sub and sub not in subcommands:
                    problems.append(f"onyx has no command '{sub}'")
        out.append((f"shell block {i + 1}: {text.strip().splitlines()[0][:60]}", not problems,
                    "; ".join(problems)))
    return out


def main():
    sys.path.insert(0, HERE)
    import test_package  # the package the Python blocks import (incremental pip install)
    test_package.build_package()
    readme = "\n".join(open(os.path.join(REPO, p)).read() for p in PAGES)
    with tempfile.TemporaryDirectory(prefix="onyx-readme-") as tmp:
        results = python_cases(readme, tmp) + yaml_cases(readme) + shell_cases(readme)
    passed = sum(ok for _, ok, _ in results)
    for name, ok, detail in results:
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else "\n    " + detail))
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
