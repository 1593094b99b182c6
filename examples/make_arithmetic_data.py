"""Builds the GRPO example's data (no network, standard library only): sums of two numbers
below 10, asked as "What is a+b?".

  OUT/sft_train.jsonl    {"prompt": "What is 3+4?", "completion": " 7"}: 60 of the 100 sums, the
                         supervised warm-up (examples/arithmetic_sft.yaml)
  OUT/grpo_prompts.jsonl {"prompt": "What is 3+4?", "answer": "7"}: all 100, for GRPO with an
                         exact-match reward (examples/arithmetic_grpo.yaml)

Usage: python3 examples/make_arithmetic_data.py OUT_DIR"""
import json
import os
import random
import sys


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    sums = [(a, b) for a in range(10) for b in range(10)]
    rng = random.Random(0)
    rng.shuffle(sums)
    with open(os.path.join(out, "sft_train.jsonl"), "w") as f:
        for a, b in sums[:60]:
            f.write(json.dumps({"prompt": f"What is {a}+{b}?", "completion": f" {a + b}"}) + "\n")
    with open(os.path.join(out, "grpo_prompts.jsonl"), "w") as f:
        for a, b in sums:
            f.write(json.dumps({"prompt": f"What is {a}+{b}?", "answer": str(a + b)}) + "\n")
    print(f"wrote {out}/sft_train.jsonl (60 sums) and {out}/grpo_prompts.jsonl (100 sums)")


if __name__ == "__main__":
    main()
