"""test_generate.py — `onyx generate` (src/generate/generate.cc, a key/value cache over the
decoder-with-past graphs of src/models/llama.cc and gpt2.cc) against Transformers' generate().

Each case builds a small randomly initialized model (initializer_range 0.2, so the logits are far
from ties), saves it with save_pretrained, and compares greedy decoding token for token:
  llama-gqa-batch   LlamaForCausalLM, GQA 4:1, untied head, 4 prompts of lengths 3..11 batched
                    with left padding, 32 new tokens (eos off): every token = Transformers'
                    generate on the same left-padded batch, and = each prompt generated alone
  mistral-sliding   MistralForCausalLM with sliding_window 6: 32 new tokens cross the window
  qwen2-bias        Qwen2ForCausalLM (q/k/v biases), rope theta 1e6, 32 new tokens
  llama-dynamic-rope  rope_type dynamic, max_position_embeddings 16: 32 new tokens past it, the
                    frequencies NTK-scaled for max(position_ids) + 1 at each step (Transformers'
                    dynamic_rope_update as it grows during generate)
  gpt2-batch        GPT2LMHeadModel, 3 prompts with left padding, 32 new tokens
  llama3-rope-eos   rope_type llama3, eos_token_id set in generation_config.json: rows stop at
                    the first eos as Transformers' (the output ends with it), the others go on
  cache-blocks      --max_new_tokens 150 on a tiny Llama (cache_block 64: three blocks): tokens =
                    Transformers', and the optimized graph was built once per cache block, not
                    per token (the --timings line counts signatures)
  lora-checkpoint   a LoRA checkpoint (onyx train with lora:) generates = PEFT's merged model
  chat              --chat / "messages" rows: prompts rendered with the tokenizer's chat template
                    (= apply_chat_template's ids), generated tokens = HF's
  predict-with-generate[-lora[-bf16]|-beams]  `onyx train` with predict_with_generate: eval_gen_exact_match
                    and eval_gen_token_accuracy = the scores of HF generate on the trained model
                    (PEFT's merged model for LoRA, over the bf16-rounded base with -bf16:
                    model_init_kwargs.dtype); `onyx predict` returns HF's generated ids
  predict-with-generate-bf16-full-eval  `onyx predict` with bf16_full_eval: ids = HF float32 on
                    bf16-rounded weights and inv_freq (model.to(torch.bfloat16) rounds both), on
                    ~700-token prompts where float32 inv_freq would give other ids
  logits-processors  repetition_penalty (generation_config.json, and --repetition_penalty),
                    no_repeat_ngram_size, min_new_tokens with an early eos, max_length without
                    max_new_tokens: tokens = HF generate's under the same generation_config
  beam-search       num_beams 2..5 with length_penalty, early_stopping true / false / never,
                    an eos that ends hypotheses early, batched with left padding: tokens = HF's
  unimplemented-options  num_beam_groups 2 in generation_config.json: a warning naming it;
                    repetition_penalty -1: exit 1 naming it
  sampling          --do_sample --seed: same seed same tokens, another seed other tokens, top_k 1
                    = greedy; text prompts through the GPT-2 tokenizer folder
  bad-input         an empty prompt, an id outside the vocabulary, a folder without
                    config.json: exit 1 with the reason

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_generate.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import time
import os
import re
import shutil
import subprocess
import sys

import torch
import transformers as tr
from case_runner import run_cases

ONYX = os.environ.get("ONYX", "build/onyx")
GPT2_TOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared/data/gpt2-tokenizer")
torch.set_num_threads(1)


def make(cls, **kw):
    base = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=8, max_position_embeddings=256, initializer_range=0.2)
    base.update(kw)
    cfg = cls.config_class(**base)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = cls(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n or "ln_" in n:
                p.normal_(1.0, 0.1) if n.endswith("weight") else p.normal_(0.0, 0.1)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.1)
    return m


def onyx(*args, ok=True):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def save(tmp, name, model, eos=None, pad=0):
    d = os.path.join(tmp, name)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.do_sample = False
    model.config.eos_token_id = eos
    model.save_pretrained(d)
    return d


def hf_generate(model, prompts, new, pad=0, eos=None, **kw):
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask,
                             **({} if new is None else {"max_new_tokens": new}),
                             do_sample=False, pad_token_id=pad, eos_token_id=eos,
                             **{"min_new_tokens": 0, **kw})
    res = []
    for row in out[:, L:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos) + 1]
        res.append(row)
    return res


def onyx_generate(d, prompts, new, *extra):
    pf = os.path.join(d, "prompts.jsonl")
    with open(pf, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_ids": p}) + "\n")
    of = os.path.join(d, "out.jsonl")
    p = onyx("generate", d, "--prompts", pf, "--max_new_tokens", str(new), "--output", of, *extra)
    with open(of) as f:
        rows = [json.loads(l) for l in f]
    return [r["completion_ids"] for r in rows], p


def compare(got, want):
    for r, (g, w) in enumerate(zip(got, want)):
        if g != w:
            k = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return False, f"row {r} differs at new token {k}: onyx {g[k:k+4]} vs HF {w[k:k+4]} (lengths {len(g)}, {len(w)})"
    if len(got) != len(want):
        return False, f"{len(got)} rows vs {len(want)}"
    return True, ""


def prompts_for(vocab, lens, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def case_greedy(tmp, name, cls, lens, new=32, alone=False, **kw):
    m = make(cls, **kw)
    d = save(tmp, name, m)
    prompts = prompts_for(m.config.vocab_size, lens)
    want = hf_generate(m, prompts, new)
    got, _ = onyx_generate(d, prompts, new)
    ok, msg = compare(got, want)
    if not ok:
        return False, msg
    if alone:  # batching with left padding changes nothing
        for i, p in enumerate(prompts):
            one, _ = onyx_generate(d, [p], new)
            if one[0] != got[i]:
                return False, f"prompt {i} alone differs from its batched row"
    n = sum(len(g) for g in got)
    return True, f"{len(prompts)} prompts (lengths {lens}), {n} tokens = Transformers' generate"


def case_eos(tmp):
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 16})
    prompts = prompts_for(m.config.vocab_size, [4, 9, 6, 7, 5, 8], seed=3)
    # eos: a token greedy decoding emits early in some row but not in all
    free = hf_generate(m, prompts, 24)
    firsts = {}
    for row in free:
        for i, t in enumerate(row):
            firsts.setdefault(t, []).append(i)
    eos = min((t for t in firsts if len(firsts[t]) < len(prompts)),
              key=lambda t: min(firsts[t]), default=None)
    if eos is None:
        return False, "no candidate eos token (every token in every row)"
    d = save(tmp, "llama3-eos", m, eos=eos)
    want = hf_generate(m, prompts, 24, eos=eos)
    got, _ = onyx_generate(d, prompts, 24)
    ok, msg = compare(got, want)
    if not ok:
        return False, msg
    stopped = sum(1 for g in got if g and g[-1] == eos)
    if stopped == 0 or stopped == len(got):
        return False, f"{stopped} of {len(got)} rows stopped at eos {eos}: the case tests nothing"
    return True, f"eos {eos}: {stopped} of {len(got)} rows stopped early, lengths {[len(g) for g in got]} = HF"


def case_blocks(tmp):
    m = make(tr.LlamaForCausalLM, num_key_value_heads=4, num_hidden_layers=1)
    d = save(tmp, "blocks", m)
    prompts = prompts_for(m.config.vocab_size, [5, 2])
    want = hf_generate(m, prompts, 150)
    got, p = onyx_generate(d, prompts, 150, "--timings")
    ok, msg = compare(got, want)
    if not ok:
        return False, msg
    mm = re.search(r"(\d+) graph signatures", p.stderr)
    if not mm:
        return False, f"no signature count in --timings output: {p.stderr.strip()[-300:]}"
    sig = int(mm.group(1))
    # prefill (past 0) + past capacities 64, 128, 192: 4 signatures for 154 slots
    if sig != 4:
        return False, f"{sig} optimized graphs for 150 tokens (expected 4: prefill + 3 blocks)"
    return True, f"150 tokens = HF; {sig} optimized graphs (prefill + one per 64-slot block)"


def case_lora(tmp):
    import peft
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    base = save(tmp, "lora-base", m)
    ids = torch.randint(3, 211, (8, 12), generator=torch.Generator().manual_seed(5))
    from safetensors.torch import save_file
    save_file({"input_ids": ids, "labels": ids.clone()}, os.path.join(tmp, "lora-train.safetensors"))
    out = os.path.join(tmp, "lora-out")
    cfg = os.path.join(tmp, "lora.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {base}\ntrain_data: {tmp}/lora-train.safetensors\noutput_dir: {out}\n"
                "max_steps: 6\nper_device_train_batch_size: 4\nlearning_rate: 0.05\n"
                "lr_scheduler_type: constant\nsave_strategy: 'no'\nlogging_steps: 3\n"
                "disable_tqdm: true\nreport_to: none\n"
                "lora: {r: 4, lora_alpha: 8, target_modules: [q_proj, v_proj, down_proj]}\n")
    onyx("train", cfg)
    prompts = prompts_for(211, [6, 3])
    base_tokens = hf_generate(m, prompts, 32)  # before merge_and_unload changes m in place
    pm = peft.PeftModel.from_pretrained(m, out).merge_and_unload().eval()
    want = hf_generate(pm, prompts, 32)
    if want == base_tokens:
        return False, "the adapters did not change the greedy tokens: the case tests nothing"
    got, _ = onyx_generate(out, prompts, 32)
    ok, msg = compare(got, want)
    return ok, msg or "LoRA checkpoint: 64 tokens = PEFT's merged model (and differ from the base)"


def case_sampling(tmp):
    m = make(tr.GPT2LMHeadModel, vocab_size=50257, n_embd=64, n_layer=2, n_head=4,
             n_positions=128)
    d = save(tmp, "gpt2-text", m, eos=50256)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(GPT2_TOK, f), d)

    def run(*extra):
        p = onyx("generate", d, "--prompt", "The cat sat on", "--prompt", "Hello",
                 "--max_new_tokens", "12", "--output", os.path.join(d, "s.jsonl"), *extra)
        with open(os.path.join(d, "s.jsonl")) as f:
            return [json.loads(l) for l in f]

    a = run("--do_sample", "--seed", "7")
    b = run("--do_sample", "--seed", "7")
    c = run("--do_sample", "--seed", "8", "--temperature", "1.5")
    g = run()
    k1 = run("--top_k", "1", "--seed", "3")
    if a != b:
        return False, "the same seed gave different samples"
    if [r["completion_ids"] for r in a] == [r["completion_ids"] for r in c]:
        return False, "another seed and temperature gave the same samples"
    if [r["completion_ids"] for r in k1] != [r["completion_ids"] for r in g]:
        return False, "top_k 1 differs from greedy"
    tok = tr.GPT2TokenizerFast.from_pretrained(GPT2_TOK)
    if g[0]["prompt_ids"] != tok("The cat sat on")["input_ids"]:
        return False, "prompt tokenized differently from the GPT-2 tokenizer"
    want = hf_generate(m, [g[0]["prompt_ids"]], 12, eos=50256)[0]
    if g[0]["completion_ids"] != want:
        return False, f"greedy text prompt {g[0]['completion_ids']} vs HF {want}"
    text = tok.decode([t for t in want if t != 50256])
    if g[0]["completion"] != text:
        return False, f"completion text {g[0]['completion']!r} vs HF decode {text!r}"
    return True, "seeded sampling repeatable, seeds differ, top_k 1 = greedy = HF; text decode = HF"


def case_predict_with_generate(tmp, lora=False, bf16=False, beams=0):
    """SFT prompt/completion rows, a Llama trained 40 steps with predict_with_generate: the logged
    eval_gen_exact_match / eval_gen_token_accuracy equal the same scores computed from
    Transformers' generate on the saved model, and `onyx predict` returns Transformers' tokens.
    With lora: the scores equal those of PEFT's merged model (the adapters merged in evaluation).
    With bf16 (LoRA on a base stored in bf16, model_init_kwargs.dtype): those of PEFT's merged
    model over the bf16-rounded base (the generator widens the stored weights to float32).
    With beams: generation_num_beams (Seq2SeqTrainingArguments') and min_new_tokens 3 in the
    model's generation_config.json, the scores those of HF's beam search with both."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tk = Tokenizer(models.BPE.from_file(os.path.join(GPT2_TOK, "vocab.json"),
                                        os.path.join(GPT2_TOK, "merges.txt")))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rows = [("Antonym of hot:", " cold"), ("Antonym of up:", " down"),
            ("Plural of mouse:", " mice"), ("Plural of child:", " children"),
            ("Capital of France:", " Paris"), ("Capital of Italy:", " Rome"),
            ("Opposite of left:", " right"), ("Colour of the sky:", " blue")]
    d = os.path.join(tmp, "pwg-lora" + ("-bf16" if bf16 else "") if lora else
                     "pwg" + (f"-beams{beams}" if beams else ""))
    os.makedirs(d)
    with open(os.path.join(d, "sft.jsonl"), "w") as f:
        for p, c in rows:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    m = make(tr.LlamaForCausalLM, vocab_size=50257, num_key_value_heads=2, initializer_range=0.02)
    m.config.eos_token_id = 50256
    m.generation_config.eos_token_id = 50256
    if beams:  # the model's generation_config.json counts too (Seq2SeqTrainer's priority)
        m.generation_config.min_new_tokens = 3
    m.save_pretrained(os.path.join(d, "model"))
    data = {"type": "sft", "path": os.path.join(d, "sft.jsonl"),
            "tokenizer": os.path.join(GPT2_TOK, "vocab.json")}
    cfg = {"model": os.path.join(d, "model"), "train_data": data, "eval_data": data,
           "test_data": data, "output_dir": os.path.join(d, "out"), "max_steps": 40,
           "learning_rate": 0.01, "lr_scheduler_type": "constant",
           "per_device_train_batch_size": 8, "per_device_eval_batch_size": 3,
           "eval_strategy": "steps", "eval_steps": 20, "predict_with_generate": True,
           "logging_steps": 20, "save_strategy": "no", "disable_tqdm": True}
    if lora:
        cfg.update(learning_rate=0.03, lora={"r": 8, "lora_alpha": 16,
                                             "target_modules": ["q_proj", "v_proj", "up_proj"]})
    if bf16:
        cfg["model_init_kwargs"] = {"dtype": "bfloat16"}
    if beams:  # trained less, so that beam search and greedy decoding still disagree somewhere
        cfg.update(generation_num_beams=beams, max_steps=12, eval_steps=6, logging_steps=6)
    with open(os.path.join(d, "cfg.yaml"), "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    onyx("train", os.path.join(d, "cfg.yaml"))
    with open(os.path.join(d, "out", "log_history.jsonl")) as f:
        evals = [json.loads(l) for l in f if "eval_gen_exact_match" in l]
    if len(evals) < 2:  # steps 20 and 40 (and the final evaluation of `onyx train`)
        return False, f"{len(evals)} evaluations with eval_gen_exact_match (expected >= 2)"
    last = evals[-1]
    if lora:
        import peft
        base = tr.LlamaForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32)
        if bf16:  # every Linear of the base is frozen: stored (and used) rounded to bf16
            with torch.no_grad():
                for mod in base.modules():
                    if isinstance(mod, torch.nn.Linear):
                        mod.weight.copy_(mod.weight.bfloat16().float())
        trained = peft.PeftModel.from_pretrained(base, os.path.join(d, "out")).merge_and_unload()
        trained.eval()
    else:
        trained = tr.LlamaForCausalLM.from_pretrained(os.path.join(d, "out")).eval()
    exact, hit, total, want_ids, greedy_ids, plain_ids = 0, 0, 0, [], [], []
    prompt_ids = [tk.encode(p).ids for p, _ in rows]
    refs = [tk.encode(p + c).ids[len(q):] + [50256] for (p, c), q in zip(rows, prompt_ids)]
    for i, ref in enumerate(refs):
        b0 = i // 3 * 3  # onyx generates as many tokens as the longest reference of its batch
        new = max(len(r) for r in refs[b0:b0 + 3])
        got = hf_generate(trained, [prompt_ids[i]], new, eos=50256,
                          **({"num_beams": beams, "min_new_tokens": 3} if beams else {}))[0]
        want_ids.append(got)
        if beams:  # what greedy decoding, and beams without the penalty, would give instead
            greedy_ids.append(hf_generate(trained, [prompt_ids[i]], new, eos=50256)[0])
            plain_ids.append(hf_generate(trained, [prompt_ids[i]], new, eos=50256,
                                         num_beams=beams)[0])
        same = sum(1 for a, b in zip(ref, got) if a == b)
        hit += same
        total += len(ref)
        exact += int(len(got) >= len(ref) and same == len(ref))
    want_exact, want_acc = exact / len(rows), hit / total
    if abs(last["eval_gen_exact_match"] - want_exact) > 1e-9 or \
            abs(last["eval_gen_token_accuracy"] - want_acc) > 1e-9:
        return False, (f"onyx exact {last['eval_gen_exact_match']}, token acc "
                       f"{last['eval_gen_token_accuracy']} vs from HF generate {want_exact}, {want_acc}")
    if want_acc == 0:
        return False, "token accuracy 0 after training: the case tests little"
    if beams and greedy_ids == want_ids:
        return False, "beam search gives greedy's ids on every row: the case shows nothing"
    if beams and plain_ids == want_ids:
        return False, "min_new_tokens 3 changes no id: the case shows nothing of it"
    if lora:
        return True, (f"LoRA{' on a bf16 base' if bf16 else ''}: eval_gen_exact_match {want_exact:.3f}, eval_gen_token_accuracy "
                      f"{want_acc:.3f} = from PEFT's merged model's generate")
    out = os.path.join(d, "pred.safetensors")
    onyx("predict", os.path.join(d, "cfg.yaml"), "--model", os.path.join(d, "out"),
         "--output", out)
    from safetensors.numpy import load_file
    pred = load_file(out)["predictions"]
    got_ids = [[int(t) for t in row if t != -100] for row in pred]
    if got_ids != want_ids:
        return False, f"onyx predict ids {got_ids[:2]} vs HF {want_ids[:2]}"
    return True, (f"eval_gen_exact_match {want_exact:.3f}, eval_gen_token_accuracy {want_acc:.3f} "
                  f"(step {cfg['max_steps']}) = from HF generate on the saved model; predict ids "
                  f"= HF's" + (f" ({beams} beams and generation_config.json's min_new_tokens 3; "
                               f"greedy, or no minimum, would differ)" if beams else ""))


def case_processors(tmp):
    """Transformers' logits processors read from generation_config.json (and one as a flag):
    repetition_penalty, no_repeat_ngram_size, min_new_tokens (with an eos greedy emits early),
    and max_length without max_new_tokens. 3 prompts batched with left padding, greedy: every
    token = HF generate under the same generation_config, and each option changes the tokens
    (else its part would show nothing)."""
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    prompts = prompts_for(m.config.vocab_size, [3, 11, 7], seed=5)
    new = 48

    def hf(**kw):  # (max_length: no max_new_tokens)
        eos = kw.pop("eos_token_id", m.generation_config.eos_token_id)
        return hf_generate(m, prompts, kw.pop("max_new_tokens", None), eos=eos, **kw)

    plain = hf(max_new_tokens=new)
    # an eos greedy emits within the first 6 new tokens of some row
    eos = next((t for row in plain for t in row[1:6]), None)
    msgs = []
    for name, gen_cfg, flags in (
            ("repetition_penalty 1.5", {"repetition_penalty": 1.5, "max_new_tokens": new}, []),
            ("--repetition_penalty 0.7", {"max_new_tokens": new}, ["--repetition_penalty", "0.7"]),
            ("no_repeat_ngram_size 2", {"no_repeat_ngram_size": 2, "max_new_tokens": new}, []),
            ("min_new_tokens 6", {"min_new_tokens": 6, "eos_token_id": eos,
                                  "max_new_tokens": new}, []),
            ("max_length 20", {"max_length": 20}, [])):
        want = hf(**gen_cfg, **({"repetition_penalty": 0.7} if flags else {}))
        # without the option (max_length: 48 new tokens instead of 20 - 11)
        base = hf(**{k: v for k, v in gen_cfg.items() if k == "eos_token_id"}, max_new_tokens=new)
        if want == base:
            return False, f"{name}: HF's tokens are the same without it: the case shows nothing"
        d = os.path.join(tmp, "processors")
        if os.path.exists(d):
            shutil.rmtree(d)
        m.save_pretrained(d)
        with open(os.path.join(d, "generation_config.json")) as f:
            g = json.load(f)
        g.update(gen_cfg)
        g.update(pad_token_id=0, do_sample=False)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(g, f)
        pf = os.path.join(d, "prompts.jsonl")
        with open(pf, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_ids": p}) + "\n")
        of = os.path.join(d, "out.jsonl")
        onyx("generate", d, "--prompts", pf, "--output", of, *flags)
        with open(of) as f:
            got = [json.loads(l)["completion_ids"] for l in f]
        ok, msg = compare(got, want)
        if not ok:
            return False, f"{name}: {msg}"
        msgs.append(name)
    return True, f"{', '.join(msgs)}: tokens = HF generate's (and differ without the option)"


def case_beams(tmp):
    """Beam search (Transformers' _beam_search): 3 prompts batched with left padding, an eos that
    greedy decoding emits early in some row (so hypotheses finish at different lengths); num_beams
    4 with the defaults (length_penalty 1, early_stopping false), 3 with early_stopping true and
    length_penalty 0.5, 2 with "never" and length_penalty 2 and repetition_penalty 1.3 (via
    generation_config.json), and --num_beams 5 as a flag: every token = HF generate's, and beam
    search differs from greedy in some row (else the case would show little)."""
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    prompts = prompts_for(m.config.vocab_size, [3, 11, 7], seed=7)
    new = 16

    def hf(eos_token_id, **kw):
        return hf_generate(m, prompts, new, eos=eos_token_id, **kw)

    free = hf(eos_token_id=-5)
    eos = next((t for row in free for t in row[2:8]), None)
    greedy = hf(eos_token_id=eos)
    msgs, differs = [], 0
    for name, gen_cfg, flags in (
            ("num_beams 4", {"num_beams": 4}, []),
            ("num_beams 3 early_stopping true length_penalty 0.5",
             {"num_beams": 3, "early_stopping": True, "length_penalty": 0.5}, []),
            ("num_beams 2 early_stopping never length_penalty 2 repetition_penalty 1.3",
             {"num_beams": 2, "early_stopping": "never", "length_penalty": 2.0,
              "repetition_penalty": 1.3}, []),
            ("--num_beams 5", {}, ["--num_beams", "5"])):
        want = hf(eos_token_id=eos, **gen_cfg, **({"num_beams": 5} if flags else {}))
        differs += sum(a != b for a, b in zip(want, greedy))
        d = os.path.join(tmp, "beams-" + str(len(msgs)))
        m.save_pretrained(d)
        with open(os.path.join(d, "generation_config.json")) as f:
            g = json.load(f)
        g.update(gen_cfg)
        g.update(pad_token_id=0, eos_token_id=eos, do_sample=False)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(g, f)
        pf = os.path.join(d, "prompts.jsonl")
        with open(pf, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_ids": p}) + "\n")
        of = os.path.join(d, "out.jsonl")
        onyx("generate", d, "--prompts", pf, "--output", of, "--max_new_tokens", str(new), *flags)
        with open(of) as f:
            got = [json.loads(l)["completion_ids"] for l in f]
        ok, msg = compare(got, want)
        if not ok:
            return False, f"{name}: {msg}"
        msgs.append(name)
    if not differs:
        return False, "beam search gave greedy's tokens in every row: the case shows little"
    lens = [len(r) for r in hf(eos_token_id=eos, num_beams=4)]
    return True, (f"{'; '.join(msgs)}: tokens = HF generate's ({differs} rows differ from "
                  f"greedy; num_beams 4 lengths {lens})")


def case_unimplemented(tmp):
    """A generation_config.json asking for group beam search: onyx warns naming the key (and
    decodes without it), never silently."""
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    d = save(tmp, "beams", m)
    with open(os.path.join(d, "generation_config.json")) as f:
        g = json.load(f)
    g.update(num_beam_groups=2, repetition_penalty=-1.0)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(g, f)
    pf = os.path.join(d, "prompts.jsonl")
    with open(pf, "w") as f:
        f.write(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    p = onyx("generate", d, "--prompts", pf, "--max_new_tokens", "3", ok=False)
    if p.returncode != 1 or "'repetition_penalty' must be strictly positive" not in p.stderr:
        return False, f"repetition_penalty -1: rc {p.returncode}, {p.stderr.strip()[-300:]!r}"
    g["repetition_penalty"] = 1.0
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(g, f)
    got, p = onyx_generate(d, [[5, 6, 7]], 3)
    if "'num_beam_groups' 2 is not implemented" not in p.stderr:
        return False, f"num_beam_groups 2: no warning naming it; stderr {p.stderr.strip()[-300:]!r}"
    for flags, want in ((["--num_beams", "2", "--do_sample"], "beam sampling) is not implemented"),
                        (["--num_beams", "0"], "'num_beams' must be in [1, 1024], got 0")):
        p = onyx("generate", d, "--prompts", pf, "--max_new_tokens", "3", *flags, ok=False)
        if p.returncode != 1 or want not in p.stderr:
            return False, f"{flags}: rc {p.returncode}, {p.stderr.strip()[-300:]!r}"
    return True, ("repetition_penalty -1, --num_beams 0, --num_beams with --do_sample: exit 1 "
                  "naming them; num_beam_groups 2: a warning naming it")


def case_full_eval_generate(tmp):
    """bf16_full_eval with predict_with_generate, `onyx predict` outside training: Transformers'
    evaluation_loop runs model.to(torch.bfloat16), which rounds every parameter and the rotary
    inv_freq buffer; onyx's decoder generates in float32 from those rounded values. Its ids = HF
    float32 generate on a copy with every parameter and inv_freq rounded to bf16, on prompts of
    about 700 tokens (where a rounded frequency moves an angle by up to ~0.5 rad); the same copy
    with float32 inv_freq generates other ids (else the case would show nothing)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tk = Tokenizer(models.BPE.from_file(os.path.join(GPT2_TOK, "vocab.json"),
                                        os.path.join(GPT2_TOK, "merges.txt")))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = ("river stone cloud seven apple window quiet orange north table music paper garden "
             "silver winter candle forest yellow bridge mirror").split()
    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(4):
        idx = torch.randint(0, len(words), (700,), generator=g).tolist()
        rows.append((" ".join(words[j] for j in idx) + ":",
                     " " + " ".join(words[(i + 3 * k) % len(words)] for k in range(12))))
    d = os.path.join(tmp, "pwg-full-eval")
    os.makedirs(d)
    with open(os.path.join(d, "sft.jsonl"), "w") as f:
        for p, c in rows:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    # head_dim 32: 16 frequencies, most of them large enough for their rounding to show
    m = make(tr.LlamaForCausalLM, vocab_size=50257, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=2048)
    m.config.eos_token_id = 50256
    m.generation_config.eos_token_id = 50256
    m.save_pretrained(os.path.join(d, "model"))
    data = {"type": "sft", "path": os.path.join(d, "sft.jsonl"),
            "tokenizer": os.path.join(GPT2_TOK, "vocab.json")}
    cfg = {"model": os.path.join(d, "model"), "train_data": data, "test_data": data,
           "output_dir": os.path.join(d, "out"), "per_device_eval_batch_size": 2,
           "predict_with_generate": True, "bf16_full_eval": True, "disable_tqdm": True}
    with open(os.path.join(d, "cfg.yaml"), "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    out = os.path.join(d, "pred.safetensors")
    onyx("predict", os.path.join(d, "cfg.yaml"), "--output", out)
    from safetensors.numpy import load_file
    got = [[int(t) for t in row if t != -100] for row in load_file(out)["predictions"]]

    def rounded(frequencies):
        r = tr.LlamaForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32)
        r.config._attn_implementation = "eager"
        with torch.no_grad():
            for p in r.parameters():
                p.copy_(p.bfloat16().float())
            if frequencies:
                f = r.model.rotary_emb.inv_freq
                f.copy_(f.bfloat16().float())
        return r.eval()

    prompt_ids = [tk.encode(p).ids for p, _ in rows]
    if min(len(p) for p in prompt_ids) < 600:
        return False, f"prompts of {[len(p) for p in prompt_ids]} tokens: too short to show it"
    refs = [tk.encode(p + c).ids[len(q):] + [50256] for (p, c), q in zip(rows, prompt_ids)]
    want = {}
    for freq in (True, False):
        r = rounded(freq)
        want[freq] = []
        for i in range(len(rows)):
            b0 = i // 2 * 2  # as many new tokens as the longest reference of the batch
            new = max(len(x) for x in refs[b0:b0 + 2])
            want[freq].append(hf_generate(r, [prompt_ids[i]], new, eos=50256)[0])
    if got != want[True]:
        return False, (f"onyx predict ids {got} vs HF on rounded weights and inv_freq "
                       f"{want[True]} (with float32 inv_freq: {want[False]})")
    if want[True] == want[False]:
        return False, "rounding inv_freq changes no generated id: the case shows nothing"
    changed = sum(a != b for a, b in zip(want[True], want[False]))
    return True, (f"{len(rows)} prompts of {min(len(p) for p in prompt_ids)}+ tokens: ids = HF on "
                  f"bf16-rounded weights and inv_freq; float32 inv_freq would change {changed} "
                  f"of the {len(rows)} rows")


def case_chat(tmp):
    """--chat and "messages" rows: the prompt is the tokenizer's chat template rendered with the
    generation prompt (a ChatML-style template written for the test), tokenized as
    apply_chat_template(tokenize=True) does; the tokens after it = HF generate's."""
    m = make(tr.GPT2LMHeadModel, vocab_size=50257, n_embd=64, n_layer=2, n_head=4,
             n_positions=128)
    d = save(tmp, "gpt2-chat", m, eos=50256)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(GPT2_TOK, f), d)
    tmpl = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim"
            " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": tmpl, "eos_token": "<|endoftext|>",
                   "bos_token": "<|endoftext|>", "model_max_length": 128}, f)
    tok = tr.AutoTokenizer.from_pretrained(d)
    convs = [[{"role": "user", "content": "Name a colour. "}],
             [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "What is 2+2?"}]]
    pf = os.path.join(d, "chat.jsonl")
    with open(pf, "w") as f:
        f.write(json.dumps({"messages": convs[1]}) + "\n")
    of = os.path.join(d, "chat-out.jsonl")
    onyx("generate", d, "--chat", "--prompt", convs[0][0]["content"], "--prompts", pf,
         "--max_new_tokens", "10", "--output", of)
    with open(of) as f:
        rows = [json.loads(l) for l in f]
    for conv, row in zip(convs, rows):
        want_prompt = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
        if row["prompt_ids"] != list(want_prompt):
            return False, f"prompt ids {row['prompt_ids']} vs apply_chat_template {list(want_prompt)}"
        want = hf_generate(m, [list(want_prompt)], 10, eos=50256)[0]
        if row["completion_ids"] != want:
            return False, f"completion {row['completion_ids']} vs HF {want}"
    return True, "--chat prompt and a messages row: prompt ids = apply_chat_template, tokens = HF"


def case_bad(tmp):
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    d = save(tmp, "bad", m)
    msgs = []
    for prompts, want in (([[]], "prompt 1 has no tokens"), ([[5, 999]], "outside the vocabulary")):
        pf = os.path.join(d, "p.jsonl")
        with open(pf, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_ids": p}) + "\n")
        p = onyx("generate", d, "--prompts", pf, ok=False)
        if p.returncode != 1 or want not in p.stderr:
            return False, f"{prompts}: rc {p.returncode}, stderr {p.stderr.strip()[-300:]!r}"
        msgs.append(want)
    p = onyx("generate", tmp, "--prompt", "x", "--tokenizer", GPT2_TOK, ok=False)
    if p.returncode != 1 or "no config.json" not in p.stderr:
        return False, f"folder without config.json: rc {p.returncode}, {p.stderr.strip()[-300:]!r}"
    return True, "empty prompt, id out of range, no config.json: exit 1 naming the reason"


def case_hostile_config(tmp):
    """generation_config.json values and flags Transformers' generate() refuses (its warpers and
    processors, GenerationConfig), values of the wrong JSON type, a file that is not an object,
    token ids outside the vocabulary and lengths / beam counts past the bounds: each exits 1 within
    seconds naming the key and the file or flag; the file's checks and the flags' are one
    validation (--top_p 2 and top_p 5.0 are refused alike)."""
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    d = save(tmp, "hostile", m)
    gpath = os.path.join(d, "generation_config.json")
    with open(gpath) as f:
        good = json.load(f)
    pf = os.path.join(d, "p.jsonl")
    with open(pf, "w") as f:
        f.write(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    file_cases = [
        ({"do_sample": True, "temperature": -1.0}, "'temperature' (-1) has to be strictly positive"),
        # Python's json writes NaN, which JSON (and onyx's reader) does not have
        ({"do_sample": True, "temperature": float("nan")}, "is not valid JSON"),
        ({"do_sample": True, "temperature": 0.0}, "has to be strictly positive when sampling"),
        ({"top_k": -3}, "'top_k' must be >= 0"),
        ({"top_k": 1.5}, "'top_k' must be an integer, got 1.5"),
        ({"top_p": -0.5}, "'top_p' must be in [0, 1], got -0.5"),
        ({"top_p": 5.0}, "'top_p' must be in [0, 1], got 5"),
        ({"top_p": float("inf")}, "is not valid JSON"),
        ({"max_new_tokens": -5}, "'max_new_tokens' must be in [1, 1048576], got -5"),
        ({"max_new_tokens": 10 ** 12}, "'max_new_tokens' must be in [1, 1048576]"),
        ({"num_beams": 2147483647}, "'num_beams' must be in [1, 1024]"),
        ({"eos_token_id": 10 ** 12}, "eos_token_id 1000000000000 is not a token of the model"),
        ({"eos_token_id": -1}, "'eos_token_id' must be a token id"),
        ({"eos_token_id": [2, "x"]}, "'eos_token_id' must be a token id"),
        ({"do_sample": "yes"}, "'do_sample' must be true or false, got \"yes\""),
        ({"repetition_penalty": 0.0}, "'repetition_penalty' must be strictly positive"),
        ({"min_new_tokens": -1}, "'min_new_tokens' must be >= 0"),
    ]
    msgs = []
    for upd, want in file_cases:
        g = dict(good, **upd)
        with open(gpath, "w") as f:
            json.dump(g, f)
        t0 = time.time()
        p = onyx("generate", d, "--prompts", pf, "--max_new_tokens", "3", ok=False) \
            if "max_new_tokens" not in upd else onyx("generate", d, "--prompts", pf, ok=False)
        if p.returncode != 1 or want not in p.stderr or "generation_config.json" not in p.stderr \
                or time.time() - t0 > 60:
            return False, f"{upd}: rc {p.returncode}, {p.stderr.strip()[-300:]!r} (want {want!r})"
    msgs.append(f"{len(file_cases)} bad generation_config.json values")
    for text, want in (("[1, 2]", "expected a JSON object, got array"),
                       ("null", "expected a JSON object, got null"),
                       ("{\"top_k\": ", "is not valid JSON")):
        with open(gpath, "w") as f:
            f.write(text)
        p = onyx("generate", d, "--prompts", pf, ok=False)
        if p.returncode != 1 or want not in p.stderr or "generation_config.json" not in p.stderr:
            return False, f"file {text!r}: rc {p.returncode}, {p.stderr.strip()[-300:]!r}"
    msgs.append("3 files that are not an object")
    with open(gpath, "w") as f:
        json.dump(good, f)
    flag_cases = [
        (["--top_p", "2"], "'top_p' must be in [0, 1], got 2"),
        (["--top_p", "-0.5"], "'top_p' must be in [0, 1], got -0.5"),
        (["--temperature", "-1"], "'temperature' (-1) has to be strictly positive"),
        (["--temperature", "nan"], "'temperature' must be a finite number"),
        (["--top_k", "-3"], "'top_k' must be >= 0"),
        (["--max_new_tokens", "-5"], "'max_new_tokens' must be in [1, 1048576], got -5"),
        (["--max_new_tokens", "0"], "'max_new_tokens' must be in [1, 1048576], got 0"),
        (["--num_beams", "2147483647"], "'num_beams' must be in [1, 1024]"),
        (["--num_beams", "1024", "--max_new_tokens", "1000000"], "MiB of key/value cache"),
        (["--repetition_penalty", "0"], "'repetition_penalty' must be strictly positive"),
    ]
    for flags, want in flag_cases:
        t0 = time.time()
        p = onyx("generate", d, "--prompts", pf, *(["--max_new_tokens", "3"] if
                 "--max_new_tokens" not in flags else []), *flags, ok=False)
        if p.returncode != 1 or want not in p.stderr or time.time() - t0 > 60:
            return False, f"{flags}: rc {p.returncode}, {p.stderr.strip()[-300:]!r} (want {want!r})"
    msgs.append(f"{len(flag_cases)} bad flags")
    return True, "; ".join(msgs) + ": exit 1 naming the key and where"


def main():
    cases = [
        ("llama-gqa-batch", lambda t: case_greedy(
            t, "llama-gqa", tr.LlamaForCausalLM, [3, 11, 7, 5], alone=True,
            num_key_value_heads=2, tie_word_embeddings=False)),
        ("mistral-sliding", lambda t: case_greedy(
            t, "mistral", tr.MistralForCausalLM, [9, 4], num_key_value_heads=2, sliding_window=6)),
        ("qwen2-bias", lambda t: case_greedy(
            t, "qwen2", tr.Qwen2ForCausalLM, [5, 8], num_key_value_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
        ("llama-dynamic-rope", lambda t: case_greedy(
            t, "llama-dynamic", tr.LlamaForCausalLM, [5, 9], num_key_value_heads=2,
            max_position_embeddings=16,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
        ("gpt2-batch", lambda t: case_greedy(
            t, "gpt2", tr.GPT2LMHeadModel, [6, 2, 10], alone=True, n_embd=64, n_layer=2, n_head=4,
            n_positions=128)),
        ("llama3-rope-eos", case_eos),
        ("cache-blocks", case_blocks),
        ("lora-checkpoint", case_lora),
        ("sampling", case_sampling),
        ("predict-with-generate", case_predict_with_generate),
        ("predict-with-generate-lora", lambda t: case_predict_with_generate(t, lora=True)),
        ("predict-with-generate-beams", lambda t: case_predict_with_generate(t, beams=3)),
        ("predict-with-generate-lora-bf16",
         lambda t: case_predict_with_generate(t, lora=True, bf16=True)),
        ("predict-with-generate-bf16-full-eval", case_full_eval_generate),
        ("logits-processors", case_processors),
        ("beam-search", case_beams),
        ("unimplemented-options", case_unimplemented),
        ("chat", case_chat),
        ("bad-input", case_bad),
        ("hostile-generation-config", case_hostile_config),
    ]
    return run_cases(cases, "onyx-test-generate-")


if __name__ == "__main__":
    sys.exit(main())
