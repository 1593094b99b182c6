"""lora_llama.py — a PEFT LoRA fine-tuning script as people write it for transformers.Trainer, on
onyx: a small Llama with grouped-query attention (a random one from a config: no hub here),
peft.get_peft_model with LoRA on the attention projections, GPT-2's byte-level BPE tokenizer
(../shared/data/gpt2-tokenizer), WordNet glosses tokenized with datasets.Dataset.map,
DataCollatorForLanguageModeling(mlm=False), evaluation, checkpoints and TensorBoard. The only
onyx line is the import; with `from transformers import Trainer, TrainingArguments` the same
script runs on PyTorch (tests/python/test_package.py drop-in-scripts compares them). Afterwards
model.save_pretrained() writes the adapter PEFT loads.

  build/venv/bin/python examples/make_wordnet_data.py build/wordnet
  build/venv/bin/python examples/python/lora_llama.py [--max_steps N] [--output_dir D]
"""
import argparse
import json
import os

from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import (DataCollatorForLanguageModeling, GPT2TokenizerFast, LlamaConfig,
                          LlamaForCausalLM, set_seed)

from onyx import Trainer, TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "shared", "data",
                      "gpt2-tokenizer")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="build/wordnet")
    p.add_argument("--tokenizer", default=SHARED)
    p.add_argument("--output_dir", default="build/llama-lora-py")
    p.add_argument("--max_steps", type=int, default=200)
    p.add_argument("--train_samples", type=int, default=4000)
    p.add_argument("--report_to", default="none")
    p.add_argument("--sequential", action="store_true")
    a = p.parse_args()

    tok = GPT2TokenizerFast(vocab=os.path.join(a.tokenizer, "vocab.json"),
                            merges=os.path.join(a.tokenizer, "merges.txt"))
    tok.pad_token = tok.eos_token
    set_seed(42)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                            task_type="CAUSAL_LM"))

    def lines(name, limit):
        with open(os.path.join(a.data, name)) as f:
            return [{"text": ln.strip()} for ln, _ in zip(f, range(limit)) if ln.strip()]

    def tokenize(batch):
        return tok([t + tok.eos_token for t in batch["text"]], truncation=True, max_length=48)

    train = Dataset.from_list(lines("glosses_train.txt", a.train_samples)).map(
        tokenize, batched=True, remove_columns=["text"])
    evals = Dataset.from_list(lines("glosses_eval.txt", 128)).map(
        tokenize, batched=True, remove_columns=["text"])
    args = TrainingArguments(
        output_dir=a.output_dir, do_train=True, do_eval=True, run_name="llama-lora",
        learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=max(1, a.max_steps // 10),
        weight_decay=0.01, per_device_train_batch_size=16, per_device_eval_batch_size=32,
        max_steps=a.max_steps, logging_strategy="steps", logging_steps=max(1, a.max_steps // 20),
        logging_first_step=True, eval_strategy="steps", eval_steps=max(1, a.max_steps // 2),
        save_strategy="steps", save_steps=max(1, a.max_steps // 2), save_total_limit=2,
        seed=42, dataloader_num_workers=0, report_to=a.report_to, disable_tqdm=True,
        **({"train_sampling_strategy": "sequential"} if a.sequential else {}))
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evals,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
                      processing_class=tok)
    trainer.train()
    metrics = trainer.evaluate()
    print(json.dumps({"final": metrics}))
    print(json.dumps({"losses": [e["loss"] for e in trainer.state.log_history if "loss" in e]}))
    trainer.save_model(a.output_dir)


if __name__ == "__main__":
    main()
