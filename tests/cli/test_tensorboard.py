"""test_tensorboard.py — `report_to: tensorboard` (TensorBoard event files as Transformers 5.24's
TensorBoardCallback writes them through torch.utils.tensorboard) and `onyx plot` (training curves
PNG from log_history.jsonl).

Cases (one PASS / FAIL / SKIP line each):
  tb-scalars-equal-log
        an MLP classifier trained 9 steps (logging_steps 1, eval every 3 steps, accuracy metric)
        with report_to tensorboard, read back with tensorboard's EventAccumulator: the tags
        train/loss, train/learning_rate, train/grad_norm, train/epoch, eval/loss, eval/accuracy,
        train/train_loss exist, and every tag's (step, value) list equals the one log_history.jsonl
        gives under Transformers' rewrite_logs (eval_x -> eval/x, else train/x), values rounded to
        float32 (TensorBoard's simple_value), in order.
  tb-default-folder
        no logging_dir: one folder output_dir/runs/<%b%d_%H-%M-%S>_<hostname> (Transformers'
        default_logdir) whose time is the run's, holding events.out.tfevents.<10-digit unix
        seconds>.<hostname>.<pid of onyx>.0 and a .1 file for `onyx train`'s final evaluation
        (Transformers reopens a writer for a log after on_train_end).
  tb-args-text
        the text summary "args" (tag args/text_summary, text plugin) is training_args.json's
        content: the JSON of TrainingArguments with report_to tensorboard.
  tb-records-match-torch
        every record of the file: TFRecord framing with valid masked CRC32Cs, the first event
        file_version "brain.Event:2", and each later event byte-identical to the one
        torch.utils.tensorboard's summary.scalar / summary.text + Event give for its tag, value,
        step and wall_time (wall times inside the run).
  tb-logging-dir, tb-env-dir, tb-logging-dir-over-env
        logging_dir set: the events go there (no output_dir/runs); $TENSORBOARD_LOGGING_DIR set:
        there; both: logging_dir.
  tb-report-to-none, tb-report-to-list
        report_to none (the default) writes no runs/ folder; report_to [tensorboard] writes one,
        [] none, --report_to all on the command line one.
  tb-error-*
        report_to [tensorboard, wandb] and report_to wandb: exit 1, an error naming report_to.
  tb-vs-transformers
        a BertForSequenceClassification folder trained by Transformers' Trainer (report_to
        tensorboard) and by `onyx train` on the same data and arguments: the same scalar tags
        (apart from total_flos and eval/steps_per_second, which onyx does not log) at the same
        steps, losses within 1e-4 relative, learning rates within 1e-6, the same text tags (args,
        model_config).
  plot-default, plot-output
        `onyx plot OUT` writes OUT/training_curves.png (4 panels: loss, learning rate, grad norm,
        eval_accuracy); `--output F.png` writes F.png; the PNG decodes (matplotlib), is 2 panels
        wide and 2 high, and is not blank (many distinct colours, dark axis pixels).
  plot-error-*
        a missing folder, a folder without log_history.jsonl, a log with nothing to plot, a line
        that is not JSON: exit 1, an error naming the path, no PNG written.

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_tensorboard.py [substring-filter]
Prints one line per case and ends with "N passed, M failed, K skipped"; exits 1 if any case
failed. Temporary folders are removed.
"""
import copy
import datetime
import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402
from models import MlpCls  # noqa: E402

ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
HOST = socket.gethostname()

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(1)


class Skip(Exception):
    pass


def write_config(path, cfg):
    """YAML with JSON-formatted values (valid YAML)."""
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


def run_onyx(args, env=None, timeout=300):
    """Runs onyx; returns (CompletedProcess-like, pid, t_start, t_end)."""
    t0 = time.time()
    p = subprocess.Popen([ONYX] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    out, err = p.communicate(timeout=timeout)
    p.stdout_text, p.stderr_text = out, err
    return p, p.pid, t0, time.time()


def last_line(p):
    lines = (p.stderr_text.strip() or p.stdout_text.strip()).splitlines()
    return lines[-1] if lines else "(no output)"


def read_log(out_dir):
    with open(os.path.join(out_dir, "log_history.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def rewrite(k):
    """Transformers' rewrite_logs for one key."""
    if k.startswith("eval_"):
        return "eval/" + k[5:]
    if k.startswith("test_"):
        return "test/" + k[5:]
    return "train/" + k


def accumulate(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars_of(acc):
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def event_files(d):
    return sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))


def records(path):
    """(raw event bytes, problems) for every TFRecord in an event file."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    data = open(path, "rb").read()
    out, problems, i = [], [], 0
    while i < len(data):
        if i + 12 > len(data):
            problems.append(f"truncated header at byte {i}")
            break
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hcrc != masked_crc32c(header):
            problems.append(f"record {len(out)}: bad length CRC")
        rec = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if dcrc != masked_crc32c(rec):
            problems.append(f"record {len(out)}: bad data CRC")
        out.append(rec)
        i += 16 + n
    return out, problems


# ----------------------------------------------------------------------------------------------


class Ctx:
    """The model, data and one trained run shared between cases, made on first use."""

    def __init__(self, tmp):
        self.tmp = tmp
        self._cache = {}

    def get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def mlp(self):
        def make():
            from exporters import export
            torch.manual_seed(5)
            m = MlpCls()
            g = torch.Generator().manual_seed(6)
            train_d = {"x": torch.randn(64, 16, generator=g),
                       "labels": torch.randint(0, 3, (64,), generator=g)}
            eval_d = {"x": torch.randn(24, 16, generator=g),
                      "labels": torch.randint(0, 3, (24,), generator=g)}
            path = os.path.join(self.tmp, "mlp.onnx")
            names = ["x", "labels"]
            export(copy.deepcopy(m).train(), tuple(train_d[k][:2] for k in names), path,
                   exporter="ts", opset=17, input_names=names, output_names=["loss", "logits"],
                   dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}, "logits": {0: "batch"}},
                   training=True, fold=False)
            for name, d in (("train", train_d), ("eval", eval_d)):
                st_io.save(os.path.join(self.tmp, f"mlp_{name}.safetensors"),
                           {k: v.numpy() for k, v in d.items()})
            return path
        return self.get("mlp", make)

    def base_config(self, out, **changes):
        c = {"model": self.mlp(), "loss": "loss",
             "train_data": os.path.join(self.tmp, "mlp_train.safetensors"),
             "eval_data": os.path.join(self.tmp, "mlp_eval.safetensors"), "metrics": ["accuracy"],
             "output_dir": out, "learning_rate": 3e-3, "max_steps": 9, "logging_steps": 1,
             "eval_strategy": "steps", "eval_steps": 3, "save_strategy": "no",
             "per_device_train_batch_size": 8, "seed": 1, "disable_tqdm": True,
             "report_to": "tensorboard"}
        for k, v in changes.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        return c

    def train(self, tag, extra=(), env_add=None, env_drop=("TENSORBOARD_LOGGING_DIR",),
              **changes):
        d = os.path.join(self.tmp, tag)
        os.makedirs(d)
        out = os.path.join(d, "out")
        cp = os.path.join(d, "cfg.yaml")
        write_config(cp, self.base_config(out, **changes))
        env = {k: v for k, v in os.environ.items() if k not in env_drop}
        env.update(env_add or {})
        p, pid, t0, t1 = run_onyx(["train", cp] + list(extra), env=env)
        if p.returncode != 0:
            raise AssertionError(f"onyx train exited {p.returncode}: {last_line(p)}")
        return {"dir": d, "out": out, "pid": pid, "t0": t0, "t1": t1, "cfg": cp}

    def main_run(self):
        return self.get("main", lambda: self.train("main"))

    def main_logdir(self):
        r = self.main_run()
        runs = os.path.join(r["out"], "runs")
        subs = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
        if len(subs) != 1:
            raise AssertionError(f"{runs} holds {subs}, want one run folder")
        return os.path.join(runs, subs[0])


# ---- TensorBoard cases -------------------------------------------------------------------------

REQUIRED_TAGS = ["train/loss", "train/learning_rate", "train/grad_norm", "train/epoch",
                 "eval/loss", "eval/accuracy", "train/train_loss"]


def case_scalars_equal_log(ctx):
    r = ctx.main_run()
    got = scalars_of(accumulate(ctx.main_logdir()))
    want = {}
    for e in read_log(r["out"]):
        for k, v in e.items():
            if k != "step":
                want.setdefault(rewrite(k), []).append((e["step"], float(np.float32(v))))
    problems = [f"tag {t} missing" for t in REQUIRED_TAGS if t not in got]
    if set(got) != set(want):
        problems.append(f"tags {sorted(got)} vs log's {sorted(want)}")
    for t in sorted(set(got) & set(want)):
        if got[t] != want[t]:
            problems.append(f"{t}: tensorboard {got[t][:4]}... vs log {want[t][:4]}...")
    n = sum(len(v) for v in got.values())
    return not problems, "; ".join(problems) if problems else (
        f"{len(got)} tags, {n} scalars equal log_history.jsonl (float32), steps "
        f"{sorted({s for s, _ in got['eval/loss']})} for eval/loss")


def case_default_folder(ctx):
    r = ctx.main_run()
    logdir = ctx.main_logdir()
    name = os.path.basename(logdir)
    problems = []
    m = re.fullmatch(r"([A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2})_(.+)", name)
    if not m or m.group(2) != HOST:
        problems.append(f"folder {name!r} is not <%b%d_%H-%M-%S>_{HOST}")
    else:
        # the time of on_train_begin, local time, the year left out as default_logdir does
        lo = datetime.datetime.fromtimestamp(int(r["t0"])).replace(microsecond=0)
        hi = datetime.datetime.fromtimestamp(r["t1"])
        when = datetime.datetime.strptime(m.group(1), "%b%d_%H-%M-%S").replace(year=lo.year)
        if not lo <= when <= hi:
            problems.append(f"folder time {when} outside the run {lo}..{hi}")
    files = [os.path.basename(f) for f in event_files(logdir)]
    if sorted(os.listdir(logdir)) != files:
        problems.append(f"other files in {logdir}: {sorted(os.listdir(logdir))}")
    if len(files) != 2:
        problems.append(f"{len(files)} event files {files}, want 2 (training, final evaluation)")
    for i, f in enumerate(files):
        fm = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)", f)
        if not fm:
            problems.append(f"file name {f!r} is not events.out.tfevents.<time>.<host>.<pid>.<n>")
            continue
        if not int(r["t0"]) <= int(fm.group(1)) <= r["t1"]:
            problems.append(f"{f}: time outside the run")
        if fm.group(2) != HOST or int(fm.group(3)) != r["pid"] or int(fm.group(4)) != i:
            problems.append(f"{f}: want host {HOST}, pid {r['pid']}, n {i}")
    rel = os.path.relpath(logdir, r["out"])
    return not problems, "; ".join(problems) if problems else f"{rel}: {', '.join(files)}"


def case_args_text(ctx):
    r = ctx.main_run()
    acc = accumulate(ctx.main_logdir())
    tags = acc.Tags()["tensors"]
    if "args/text_summary" not in tags:
        return False, f"no args/text_summary among tensor tags {tags}"
    plugin = acc.PluginTagToContent("text")
    if "args/text_summary" not in plugin:
        return False, f"args/text_summary is not a text-plugin tag ({sorted(plugin)})"
    ev = acc.Tensors("args/text_summary")
    tp = ev[0].tensor_proto
    text = tp.string_val[0].decode()
    args = json.loads(text)
    problems = []
    if len(ev) != 1 or ev[0].step != 0:
        problems.append(f"{len(ev)} args events, step {ev[0].step}")
    if [d.size for d in tp.tensor_shape.dim] != [1]:
        problems.append(f"shape {tp.tensor_shape}")
    c = ctx.base_config(r["out"])
    for k in ("output_dir", "report_to", "logging_steps", "learning_rate", "max_steps", "seed"):
        if args.get(k) != c[k]:
            problems.append(f"args[{k!r}] = {args.get(k)!r}, config has {c[k]!r}")
    if "logging_dir" not in args:
        problems.append("no logging_dir in args")
    return not problems, "; ".join(problems) if problems else (
        f"args text of {len(text)} chars, {len(args)} keys, report_to {args['report_to']!r}")


def case_records_match_torch(ctx):
    from tensorboard.compat.proto import event_pb2
    from torch.utils.tensorboard import summary as tbs
    r = ctx.main_run()
    problems, n = [], 0
    for fi, path in enumerate(event_files(ctx.main_logdir())):
        recs, probs = records(path)
        problems += [f"{os.path.basename(path)}: {p}" for p in probs]
        for i, raw in enumerate(recs):
            e = event_pb2.Event()
            e.ParseFromString(raw)
            if not r["t0"] - 1 <= e.wall_time <= r["t1"] + 1:
                problems.append(f"file {fi} record {i}: wall_time {e.wall_time} outside the run")
            if i == 0:
                want = event_pb2.Event(wall_time=e.wall_time, file_version="brain.Event:2",
                                       source_metadata=event_pb2.SourceMetadata(writer="onyx"))
            else:
                if len(e.summary.value) != 1:
                    problems.append(f"file {fi} record {i}: {len(e.summary.value)} values")
                    continue
                v = e.summary.value[0]
                if v.HasField("simple_value"):
                    s = tbs.scalar(v.tag, v.simple_value)
                elif v.tag.endswith("/text_summary"):
                    s = tbs.text(v.tag[:-len("/text_summary")], v.tensor.string_val[0].decode())
                else:
                    problems.append(f"file {fi} record {i}: unexpected value {v}")
                    continue
                want = event_pb2.Event(wall_time=e.wall_time, summary=s)
                if e.step:
                    want.step = e.step
            if raw != want.SerializeToString():
                problems.append(f"file {fi} record {i}: bytes differ from torch's: {e}")
            n += 1
    return not problems, "; ".join(problems[:5]) if problems else (
        f"{n} records: CRCs valid, file_version first, each byte-identical to torch's")


def logdir_case(ctx, tag, logging_dir=False, env=False):
    d_log = os.path.join(ctx.tmp, tag + "-logging-dir")
    d_env = os.path.join(ctx.tmp, tag + "-env-dir")
    changes = {"max_steps": 3, "eval_strategy": "no", "eval_data": None, "metrics": None}
    if logging_dir:
        changes["logging_dir"] = d_log
    r = ctx.train(tag, env_add={"TENSORBOARD_LOGGING_DIR": d_env} if env else None, **changes)
    want = d_log if logging_dir else d_env
    other = d_env if logging_dir else None
    problems = []
    files = event_files(want)
    if len(files) != 1:
        problems.append(f"{want} holds {os.listdir(want) if os.path.isdir(want) else 'nothing'}")
    if os.path.exists(os.path.join(r["out"], "runs")):
        problems.append("output_dir/runs was made")
    if other and os.path.exists(other):
        problems.append(f"{other} ($TENSORBOARD_LOGGING_DIR) was made although logging_dir is set")
    if files:
        got = scalars_of(accumulate(want))
        if [s for s, _ in got.get("train/loss", [])] != [1, 2, 3]:
            problems.append(f"train/loss steps {got.get('train/loss')}")
    return not problems, "; ".join(problems) if problems else (
        f"events in {os.path.relpath(want, ctx.tmp)} only")


def case_report_to_none(ctx):
    r = ctx.train("none", report_to=None, max_steps=3, eval_strategy="no")
    runs = os.path.join(r["out"], "runs")
    ok = not os.path.exists(runs) and not glob.glob(os.path.join(r["out"], "**", "events.out.*"),
                                                    recursive=True)
    return ok, "no runs/ folder, no event file" if ok else f"{runs} exists"


def case_report_to_list(ctx):
    problems = []
    for tag, changes, extra, want in (
            ("list-tb", {"report_to": ["tensorboard"]}, (), True),
            ("list-empty", {"report_to": []}, (), False),
            ("list-none", {"report_to": ["none"]}, (), False),
            ("cli-all", {"report_to": None}, ("--report_to", "all"), True),
            ("cli-list", {"report_to": None}, ("--report_to", "[tensorboard]"), True)):
        r = ctx.train(tag, extra=extra, max_steps=2, eval_strategy="no", **changes)
        runs = os.path.join(r["out"], "runs")
        has = os.path.isdir(runs) and any(event_files(os.path.join(runs, s)) for s in os.listdir(runs))
        if has != want:
            problems.append(f"{tag}: events written {has}, want {want}")
    return not problems, "; ".join(problems) if problems else (
        "[tensorboard], --report_to all, --report_to [tensorboard] write events; [], [none] do not")


def error_cases(ctx):
    d = os.path.join(ctx.tmp, "tb-errors")
    os.makedirs(d)
    for name, value in (("tb-error-two-integrations", ["tensorboard", "wandb"]),
                        ("tb-error-unknown", "wandb"), ("tb-error-unknown-in-list", ["wandb"])):
        out = os.path.join(d, name)
        cp = os.path.join(d, name + ".yaml")
        write_config(cp, ctx.base_config(out, report_to=value))
        p, _, _, _ = run_onyx(["train", cp])
        msg = last_line(p)
        ok = p.returncode == 1 and msg.startswith("onyx: error:") and "report_to" in msg and \
            not os.path.exists(out)
        yield name, ok, f"exit {p.returncode}: {msg}"


def case_vs_transformers(ctx):
    try:
        import transformers
        from transformers import BertConfig, BertForSequenceClassification, Trainer, \
            TrainingArguments
    except ImportError as e:
        raise Skip(f"transformers not importable: {e}")
    import contextlib
    import io
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # save_pretrained / from_pretrained bars
    root = os.path.join(ctx.tmp, "vs-hf")
    folder = os.path.join(root, "bert")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(
        vocab_size=64, max_position_embeddings=16, num_labels=3, hidden_size=32,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).save_pretrained(folder)
    g = np.random.default_rng(3)
    data = {}
    for name, n in (("train", 24), ("eval", 10)):
        data[name] = {"input_ids": g.integers(5, 64, (n, 8)).astype(np.int64),
                      "attention_mask": np.ones((n, 8), np.int64),
                      "labels": g.integers(0, 3, n).astype(np.int64)}
        st_io.save(os.path.join(root, f"{name}.safetensors"), data[name])
    args = dict(learning_rate=1e-3, max_steps=6, logging_steps=1, eval_strategy="steps",
                eval_steps=3, per_device_train_batch_size=4, per_device_eval_batch_size=5,
                save_strategy="no", train_sampling_strategy="sequential", seed=7,
                disable_tqdm=True, report_to="tensorboard")
    # Transformers
    hf_out = os.path.join(root, "hf")

    class DS(torch.utils.data.Dataset):
        def __init__(self, d):
            self.d = {k: torch.from_numpy(v) for k, v in d.items()}

        def __len__(self):
            return len(self.d["labels"])

        def __getitem__(self, i):
            return {k: v[i] for k, v in self.d.items()}

    saved_env = os.environ.pop("TENSORBOARD_LOGGING_DIR", None)
    try:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
        t = Trainer(model=model, args=TrainingArguments(output_dir=hf_out, use_cpu=True, **args),
                    train_dataset=DS(data["train"]), eval_dataset=DS(data["eval"]))
        with contextlib.redirect_stdout(io.StringIO()):
            t.train()
    finally:
        if saved_env is not None:
            os.environ["TENSORBOARD_LOGGING_DIR"] = saved_env
    # onyx
    ox_out = os.path.join(root, "onyx")
    cp = os.path.join(root, "cfg.yaml")
    write_config(cp, dict(args, model=folder, output_dir=ox_out,
                          train_data=os.path.join(root, "train.safetensors"),
                          eval_data=os.path.join(root, "eval.safetensors")))
    env = {k: v for k, v in os.environ.items() if k != "TENSORBOARD_LOGGING_DIR"}
    p, _, _, _ = run_onyx(["train", cp], env=env)
    if p.returncode != 0:
        return False, f"onyx train exited {p.returncode}: {last_line(p)}"

    def first_file(out):
        runs = os.path.join(out, "runs")
        subs = os.listdir(runs)
        if len(subs) != 1:
            raise AssertionError(f"{runs} holds {subs}")
        if not re.fullmatch(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_" + re.escape(HOST), subs[0]):
            raise AssertionError(f"run folder {subs[0]!r}")
        return event_files(os.path.join(runs, subs[0]))[0]  # onyx's .1 = its final evaluate

    hf_acc, ox_acc = accumulate(first_file(hf_out)), accumulate(first_file(ox_out))
    hf, ox = scalars_of(hf_acc), scalars_of(ox_acc)
    not_in_onyx = {"train/total_flos", "eval/steps_per_second"}
    problems = []
    if set(hf) - not_in_onyx != set(ox):
        problems.append(f"scalar tags: transformers {sorted(hf)} vs onyx {sorted(ox)}")
    timing = {"train/train_runtime", "train/train_samples_per_second",
              "train/train_steps_per_second", "eval/runtime", "eval/samples_per_second"}
    for tag in sorted(set(hf) & set(ox)):
        hs, os_ = [s for s, _ in hf[tag]], [s for s, _ in ox[tag]]
        if hs != os_:
            problems.append(f"{tag}: steps {hs} vs {os_}")
            continue
        if tag in timing:
            continue
        tol = 1e-6 if tag in ("train/learning_rate", "train/epoch") else 1e-4
        for (s, a), (_, b) in zip(hf[tag], ox[tag]):
            if abs(a - b) > tol * max(abs(a), 1e-6):
                problems.append(f"{tag} at step {s}: transformers {a} vs onyx {b}")
                break
    hf_text = sorted(hf_acc.PluginTagToContent("text"))
    ox_text = sorted(ox_acc.PluginTagToContent("text"))
    if hf_text != ox_text:
        problems.append(f"text tags: transformers {hf_text} vs onyx {ox_text}")
    return not problems, "; ".join(problems[:6]) if problems else (
        f"{len(ox)} scalar tags at the same steps as Transformers' (without "
        f"{sorted(not_in_onyx)}), values agree; text tags {ox_text}")


# ---- onyx plot cases ---------------------------------------------------------------------------


def check_png(path, want_panels):
    import matplotlib.image as mpimg
    img = mpimg.imread(path)
    h, w = img.shape[:2]
    problems = []
    if not (800 <= w <= 2000 and 600 <= h <= 1600):
        problems.append(f"size {w}x{h}")
    rgb = (np.asarray(img)[..., :3] * 255).round().astype(np.int32)
    colours = len(np.unique(rgb.reshape(-1, 3), axis=0))
    dark = float((rgb.sum(-1) < 150).mean())
    coloured = float(((rgb.max(-1) - rgb.min(-1)) > 80).mean())  # the curves
    if colours < 20 or dark < 0.002 or coloured < 0.001:
        problems.append(f"looks blank: {colours} colours, {dark:.4f} dark, {coloured:.4f} coloured")
    return problems, f"{w}x{h}, {colours} colours, {100 * coloured:.2f}% curve pixels"


def case_plot_default(ctx):
    r = ctx.main_run()
    png = os.path.join(r["out"], "training_curves.png")
    p, _, _, _ = run_onyx(["plot", r["out"]])
    if p.returncode != 0:
        return False, f"exit {p.returncode}: {last_line(p)}"
    if not os.path.isfile(png):
        return False, f"{png} not written ({last_line(p)})"
    problems, info = check_png(png, 4)
    if "(4 panels)" not in p.stdout_text:
        problems.append(f"stdout {p.stdout_text.strip()!r}, want 4 panels")
    return not problems, "; ".join(problems) if problems else f"{info}; {p.stdout_text.strip()}"


def case_plot_output(ctx):
    r = ctx.main_run()
    png = os.path.join(ctx.tmp, "curves-elsewhere.png")
    p, _, _, _ = run_onyx(["plot", r["out"], "--output", png])
    if p.returncode != 0 or not os.path.isfile(png):
        return False, f"exit {p.returncode}: {last_line(p)}"
    problems, info = check_png(png, 4)
    return not problems, "; ".join(problems) if problems else info


def plot_error_cases(ctx):
    d = os.path.join(ctx.tmp, "plot-errors")
    os.makedirs(d)
    no_log = os.path.join(d, "no-log")
    os.makedirs(no_log)
    nothing = os.path.join(d, "nothing")
    os.makedirs(nothing)
    with open(os.path.join(nothing, "log_history.jsonl"), "w") as f:
        f.write(json.dumps({"train_runtime": 1.5, "epoch": 1.0, "step": 3}) + "\n\n")
    bad = os.path.join(d, "bad-json")
    os.makedirs(bad)
    with open(os.path.join(bad, "log_history.jsonl"), "w") as f:
        f.write(json.dumps({"loss": 1.0, "step": 1}) + "\n{\"loss\": 0.9, \"st\n")
    missing = os.path.join(d, "missing")
    for name, folder, needle in (
            ("plot-error-missing-folder", missing, missing),
            ("plot-error-no-log", no_log, os.path.join(no_log, "log_history.jsonl")),
            ("plot-error-nothing-to-plot", nothing, os.path.join(nothing, "log_history.jsonl")),
            ("plot-error-bad-json", bad, os.path.join(bad, "log_history.jsonl"))):
        p, _, _, _ = run_onyx(["plot", folder])
        msg = last_line(p)
        written = os.path.exists(os.path.join(folder, "training_curves.png"))
        leftovers = [f for f in os.listdir(folder)] if os.path.isdir(folder) else []
        leftovers = [f for f in leftovers if f != "log_history.jsonl"]
        ok = p.returncode == 1 and msg.startswith("onyx: error:") and needle in msg and \
            not written and not leftovers
        yield name, ok, f"exit {p.returncode}: {msg}" + (f" (left {leftovers})" if leftovers else "")


# ----------------------------------------------------------------------------------------------


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def report(status, name, msg):
        counts[status] += 1
        print(f"{status} {name}: {msg}", flush=True)

    if not os.path.exists(ONYX):
        report("FAIL", "setup", f"onyx binary not found at {ONYX} (set ONYX)")
        print(f"{counts['PASS']} passed, {counts['FAIL']} failed")
        return 1
    tmp = tempfile.mkdtemp(prefix="onyx-test-tensorboard-")
    t0 = time.time()
    try:
        ctx = Ctx(tmp)
        single = [
            ("tb-scalars-equal-log", lambda: case_scalars_equal_log(ctx)),
            ("tb-default-folder", lambda: case_default_folder(ctx)),
            ("tb-args-text", lambda: case_args_text(ctx)),
            ("tb-records-match-torch", lambda: case_records_match_torch(ctx)),
            ("tb-logging-dir", lambda: logdir_case(ctx, "ld", logging_dir=True)),
            ("tb-env-dir", lambda: logdir_case(ctx, "env", env=True)),
            ("tb-logging-dir-over-env", lambda: logdir_case(ctx, "both", logging_dir=True,
                                                            env=True)),
            ("tb-report-to-none", lambda: case_report_to_none(ctx)),
            ("tb-report-to-list", lambda: case_report_to_list(ctx)),
            ("tb-vs-transformers", lambda: case_vs_transformers(ctx)),
            ("plot-default", lambda: case_plot_default(ctx)),
            ("plot-output", lambda: case_plot_output(ctx)),
        ]
        for name, fn in single:
            if filt not in name:
                continue
            try:
                ok, msg = fn()
                report("PASS" if ok else "FAIL", name, msg)
            except Skip as e:
                report("SKIP", name, str(e))
            except Exception as e:  # a broken case is a failure, with the reason
                report("FAIL", name, f"{type(e).__name__}: {e}")
        for prefix, gen in (("tb-error", error_cases), ("plot-error", plot_error_cases)):
            if filt and filt not in prefix and not filt.startswith(prefix):
                continue
            try:
                for name, ok, msg in gen(ctx):
                    if filt in name or filt in prefix:
                        report("PASS" if ok else "FAIL", name, msg)
            except Exception as e:
                report("FAIL", prefix + "-setup", f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.0f} s)")
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
