"""causal_lm.py — a Transformers-style language-model script on onyx: a small GPT-2 trained from
scratch on WordNet glosses with GPT-2's own byte-level BPE tokenizer (vocab.json / merges.txt from
../shared/data/gpt2-tokenizer, or --tokenizer DIR), datasets.Dataset.map tokenization,
DataCollatorForLanguageModeling(mlm=False) (labels = input_ids, padding as -100) and eval
perplexity. As in text_classification.py the only onyx line is the import.

  build/venv/bin/python examples/make_wordnet_data.py build/wordnet
  build/venv/bin/python examples/python/causal_lm.py [--max_steps N] [--output_dir D]
"""
import argparse
import json
import math
import os

from datasets import Dataset
from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel,
                          GPT2TokenizerFast, set_seed)

from onyx import Trainer, TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "shared", "data",
                      "gpt2-tokenizer")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="build/wordnet")
    p.add_argument("--tokenizer", default=SHARED)
    p.add_argument("--output_dir", default="build/gpt2-glosses-py")
    p.add_argument("--max_steps", type=int, default=300)
    p.add_argument("--train_samples", type=int, default=8000)
    p.add_argument("--no_dropout", action="store_true")
    p.add_argument("--sequential", action="store_true")
    p.add_argument("--report_to", default="none")
    a = p.parse_args()

    tok = GPT2TokenizerFast(vocab=os.path.join(a.tokenizer, "vocab.json"),
                            merges=os.path.join(a.tokenizer, "merges.txt"))
    tok.pad_token = tok.eos_token
    set_seed(42)
    extra = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0) if a.no_dropout else {}
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=128, n_layer=2,
                                       n_head=4, **extra))

    def lines(name, limit):
        with open(os.path.join(a.data, name)) as f:
            return [{"text": ln.strip()} for ln, _ in zip(f, range(limit)) if ln.strip()]

    def tokenize(batch):
        return tok([t + tok.eos_token for t in batch["text"]], truncation=True, max_length=64)

    train = Dataset.from_list(lines("glosses_train.txt", a.train_samples)).map(tokenize, batched=True)
    evals = Dataset.from_list(lines("glosses_eval.txt", 256)).map(tokenize, batched=True)
    args = TrainingArguments(
        output_dir=a.output_dir, do_train=True, run_name="gpt2-glosses", learning_rate=1e-3,
        per_device_train_batch_size=32, per_device_eval_batch_size=64, max_steps=a.max_steps,
        warmup_steps=a.max_steps // 10, weight_decay=0.01, logging_steps=max(1, a.max_steps // 20),
        eval_strategy="steps", eval_steps=max(1, a.max_steps // 2), save_strategy="steps",
        save_steps=max(1, a.max_steps // 2), save_total_limit=1, seed=42, disable_tqdm=True,
        dataloader_num_workers=0, report_to=a.report_to,
        **({"train_sampling_strategy": "sequential"} if a.sequential else {}))
    trainer = Trainer(model=model, args=args,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
                      train_dataset=train, eval_dataset=evals, processing_class=tok)
    trainer.train()
    metrics = trainer.evaluate()
    metrics["perplexity"] = math.exp(metrics["eval_loss"])
    print(json.dumps({"final": metrics}))
    print(json.dumps({"losses": [e["loss"] for e in trainer.state.log_history if "loss" in e]}))
    trainer.save_model(a.output_dir)


if __name__ == "__main__":
    main()
