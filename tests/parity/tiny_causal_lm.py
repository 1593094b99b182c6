"""tiny_causal_lm.py — what the TRL parity tests (test_dpo.py, test_grpo.py) start from: a
byte-level BPE tokenizer trained here on their texts (eos <|endoftext|>, also the pad token) and
a tiny random LlamaForCausalLM (GQA 2:1, eager attention) saved with save_pretrained."""
import os

import torch
import transformers as tr


def make(tmp, corpus):
    """(tokenizer, tokenizer folder, model folder) under tmp."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok_dir = os.path.join(tmp, "tok")
    os.makedirs(tok_dir, exist_ok=True)
    base = os.path.join(tmp, "base-tokenizer.json")
    tk.save(base)
    tok = tr.PreTrainedTokenizerFast(tokenizer_file=base, eos_token="<|endoftext|>",
                                     pad_token="<|endoftext|>")
    tok.save_pretrained(tok_dir)
    cfg = tr.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    base_dir = os.path.join(tmp, "base")
    tr.LlamaForCausalLM(cfg).save_pretrained(base_dir)
    return tok, tok_dir, base_dir
