"""test_terminal.py — what `onyx train` shows on a real terminal (tmux), `--help` and `--version`.

Cases (one PASS / FAIL / SKIP line each):
  terminal-final-bar
        `onyx train` of a tiny MLP classifier (40 steps, a log every 10, an evaluation every 20)
        in a detached tmux session of 100x30: the last progress bar on screen is tqdm's format,
        100%|█…█| 40/40 [MM:SS<00:00, R it/s, loss=…, lr=…], exactly 100 columns wide, and equal
        to what tqdm.format_meter itself prints for the same numbers (elapsed, rate, postfix).
  terminal-logs-not-broken
        every line with bar characters or '%|' is a whole bar (no log text appended to it, none
        broken into it); every log line is a Python dict literal on its own line.
  terminal-logs-rounded
        the dicts are Transformers' ProgressCallback prints: one per entry of log_history.jsonl,
        in order, values the '%.4g' strings of the logged values, keys in Transformers' order
        (loss, grad_norm, learning_rate; eval_loss, metrics, eval_runtime, ...; train_runtime,
        ..., train_loss), 'epoch' last; the train_runtime dict comes before the final bar.
  terminal-summary-own-line
        "trained 40 steps, ..." starts a line of its own right after the final bar, and
        "final evaluation: {...}" follows as a rounded dict.
  terminal-disable-tqdm
        with disable_tqdm on a terminal: no bar at all, the same rounded dicts (PrinterCallback).
  pipe-json-lines
        through a pipe: no bar, no carriage return; every log is one JSON line equal to the
        corresponding log_history.jsonl entry.
  help-lists-every-key
        `onyx train --help` lists every key of the training_args.json the run wrote, each with a
        type, a default (equal to the value written when the config did not set the key) and a
        one-line help; and the config keys (model, loss, predictions, train_data, eval_data,
        test_data, metrics, frozen, ...). `onyx evaluate --help` and `onyx plan --help` point
        to it.
  version
        `onyx --version` prints "onyx X.Y.Z (...)" with the compiler (then the SIMD path, which
        ONYX_CPU forces), and a commit git knows when
        it prints one.

A terminal case FAILS (it is not skipped) when tmux is missing or cannot start.
Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_terminal.py [substring-filter]
Prints one line per case and ends with "N passed, M failed, K skipped"; exits 1 if any case
failed. Temporary folders and the tmux server (a private socket) are removed.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402
from models import MlpCls  # noqa: E402

ONYX = os.path.abspath(os.environ.get("ONYX", os.path.join(REPO, "build", "onyx")))
COLS, ROWS = 100, 30
STEPS = 40
BAR_CHARS = "█▏▎▍▌▋▊▉"
BAR_RE = re.compile(r"^(?P<pct>[ \d]{2}\d)%\|(?P<bar>[ " + BAR_CHARS + r"]+)\| "
                    r"(?P<n>\d+)/(?P<total>\d+) "
                    r"\[(?P<el>(?:\d+:)?\d\d:\d\d)<(?P<rem>(?:\d+:)?\d\d:\d\d|\?), "
                    r"(?P<rate>\?|[ \d.]+)(?P<unit>it/s|s/it)"
                    r"(?P<post>, loss=[^,\]]+, lr=[^,\]]+)?\]$")
TRAIN_KEYS = ["loss", "grad_norm", "learning_rate", "epoch"]

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def make_run(d):
    """A tiny ONNX classifier with its data and a config; returns the config path."""
    from exporters import export
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = torch.randint(0, 3, (64,), generator=g)
    export(MlpCls().train(), (x[:2], y[:2]), os.path.join(d, "model.onnx"), opset=17,
           input_names=["x", "labels"], output_names=["loss", "logits"],
           dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}, "logits": {0: "batch"}},
           training=True, fold=False)
    st_io.save(os.path.join(d, "train.safetensors"), {"x": x.numpy(), "labels": y.numpy()})
    st_io.save(os.path.join(d, "eval.safetensors"), {"x": x[:32].numpy(), "labels": y[:32].numpy()})
    return {"model": "model.onnx", "loss": "loss", "predictions": "logits",
            "train_data": "train.safetensors", "eval_data": "eval.safetensors",
            "metrics": ["accuracy"], "max_steps": STEPS, "per_device_train_batch_size": 4,
            "learning_rate": 1e-3, "logging_steps": 10, "eval_strategy": "steps",
            "eval_steps": 20, "save_steps": STEPS}


def write_config(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


def read_log(out_dir):
    with open(os.path.join(out_dir, "log_history.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


class Tmux:
    """A tmux server of our own (private socket, no user config): one command per session."""

    def __init__(self, tmp):
        self.exe = shutil.which("tmux") or next(
            (p for p in ["/usr/bin/tmux"] if os.path.exists(p)), None)
        self.sock = f"onyx-test-{os.getpid()}"
        self.conf = os.path.join(tmp, "tmux.conf")
        with open(self.conf, "w") as f:
            f.write("set -g history-limit 20000\nset -gw remain-on-exit on\n")

    def cmd(self, *args, check=True):
        if not self.exe:
            raise AssertionError("tmux is not installed (scripts/setup.sh installs it)")
        p = subprocess.run([self.exe, "-L", self.sock, "-f", self.conf] + list(args),
                           capture_output=True, text=True, timeout=30)
        if check and p.returncode != 0:
            raise AssertionError(f"tmux {args[0]} failed ({p.returncode}): {p.stderr.strip()}")
        return p.stdout

    def run(self, name, cwd, argv, timeout=180):
        """Runs argv in a new detached COLSxROWS session; returns (exit status, screen text with
        the scrollback, wrapped lines joined)."""
        status_file = os.path.join(cwd, f"{name}.status")
        shell = (f"cd {sh_quote(cwd)} && {' '.join(sh_quote(a) for a in argv)}; "
                 f"echo $? > {sh_quote(status_file)}")
        self.cmd("new-session", "-d", "-s", name, "-x", str(COLS), "-y", str(ROWS), shell)
        t0 = time.time()
        while True:
            dead = self.cmd("display-message", "-p", "-t", name, "#{pane_dead}").strip()
            if dead == "1":
                break
            if time.time() - t0 > timeout:
                raise AssertionError(f"{argv[1]} did not finish within {timeout} s in tmux")
            time.sleep(0.2)
        width = self.cmd("display-message", "-p", "-t", name, "#{pane_width}").strip()
        if width != str(COLS):
            raise AssertionError(f"the tmux pane is {width} columns wide, not {COLS}")
        text = self.cmd("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", name)
        if os.environ.get("ONYX_TEST_SHOW"):
            print(text.rstrip())
        self.cmd("kill-session", "-t", name)
        with open(status_file) as f:
            status = int(f.read().strip() or -1)
        lines = [ln.rstrip() for ln in text.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        # remain-on-exit's own last line ("Pane is dead (status 0, ...)")
        if lines and lines[-1].startswith("Pane is dead"):
            lines.pop()
        while lines and not lines[-1]:
            lines.pop()
        return status, lines

    def close(self):
        if self.exe:
            subprocess.run([self.exe, "-L", self.sock, "kill-server"], capture_output=True)


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def g4(v):
    return f"{v:.4g}"


SPEED = ["runtime", "samples_per_second", "steps_per_second"]


def key_order_ok(keys):
    """Transformers' order of a log dict's keys: epoch last; an evaluation's <split>_loss first
    and its speed keys last; the training summary's speed keys, then train_loss."""
    if not keys or keys[-1] != "epoch":
        return False
    ks = keys[:-1]
    if "loss" in ks:
        return ks == ["loss", "grad_norm", "learning_rate"]
    split = ks[0].split("_")[0] + "_" if ks else ""
    speed = [split + x for x in SPEED if split + x in ks]
    if split == "train_":
        return ks == speed + ["train_loss"]
    return ks[0] == split + "loss" and ks[len(ks) - len(speed):] == speed


class Ctx:
    pass


def setup(tmp):
    ctx = Ctx()
    ctx.tmp = tmp
    ctx.tmux = Tmux(tmp)
    ctx.cfg = make_run(tmp)
    ctx.runs = {}
    return ctx


def terminal_run(ctx, tag, extra):
    """One `onyx train` in tmux (cached per tag): (status, lines, log_history, out_dir)."""
    if tag in ctx.runs:
        if isinstance(ctx.runs[tag], Exception):
            raise ctx.runs[tag]
        return ctx.runs[tag]
    try:
        ctx.runs[tag] = _terminal_run(ctx, tag, extra)
    except Exception as e:
        ctx.runs[tag] = e
        raise
    return ctx.runs[tag]


def _terminal_run(ctx, tag, extra):
    cfg = dict(ctx.cfg, output_dir=f"out_{tag}", **extra)
    path = os.path.join(ctx.tmp, f"{tag}.yaml")
    write_config(path, cfg)
    status, lines = ctx.tmux.run(tag, ctx.tmp, [ONYX, "train", path])
    if status != 0:
        raise AssertionError(f"onyx train exited {status} in tmux: " + " | ".join(lines[-3:]))
    out = os.path.join(ctx.tmp, cfg["output_dir"])
    return status, lines, read_log(out), out


def bar_lines(lines):
    return [(i, ln) for i, ln in enumerate(lines) if "%|" in ln or any(c in ln for c in BAR_CHARS)]


def case_final_bar(ctx):
    import tqdm
    _, lines, _, _ = terminal_run(ctx, "bar", {})
    bars = bar_lines(lines)
    if not bars:
        return False, "no progress bar on screen:\n" + "\n".join(lines[-8:])
    _, last = bars[-1]
    m = BAR_RE.match(last)
    if not m:
        return False, f"last bar line is not tqdm's format: {last!r}"
    if (m["pct"], m["n"], m["total"], m["rem"]) != ("100", str(STEPS), str(STEPS), "00:00"):
        return False, f"final bar is not 100% {STEPS}/{STEPS} with 00:00 remaining: {last!r}"
    if not m["bar"] == "█" * len(m["bar"]):
        return False, f"a finished bar is all full blocks: {last!r}"
    if len(last) != COLS:
        return False, f"the bar line is {len(last)} columns, the terminal {COLS}: {last!r}"
    el = sum(int(p) * 60 ** i for i, p in enumerate(reversed(m["el"].split(":"))))
    rate = float(m["rate"]) if m["unit"] == "it/s" else 1 / float(m["rate"])
    want = tqdm.tqdm.format_meter(STEPS, STEPS, el, ncols=COLS, rate=rate, postfix=m["post"][2:])
    if m["unit"] == "it/s" and want != last:
        return False, f"tqdm.format_meter prints {want!r}, onyx {last!r}"
    return True, f"{last}"


def case_logs_not_broken(ctx):
    _, lines, _, _ = terminal_run(ctx, "bar", {})
    bad = [ln for _, ln in bar_lines(lines) if not BAR_RE.match(ln)]
    if bad:
        return False, f"{len(bad)} line(s) mix a bar with other text, e.g. {bad[0]!r}"
    dicts = [ln for ln in lines if "{" in ln and not ln.startswith("final evaluation:")]
    for ln in dicts:
        if not ln.startswith("{") or not ln.endswith("}"):
            return False, f"a log dict does not have a line of its own: {ln!r}"
        ast.literal_eval(ln)
    return True, f"{len(bar_lines(lines))} bar line(s), {len(dicts)} log line(s), none mixed"


def check_dicts(lines, log):
    dicts = [ast.literal_eval(ln) for ln in lines if ln.startswith("{")]
    if len(dicts) != len(log):
        return False, f"{len(dicts)} log dicts on screen, log_history.jsonl has {len(log)}"
    for d, e in zip(dicts, log):
        want = {k: g4(v) for k, v in e.items() if k != "step"}
        if d != want:
            return False, f"step {e['step']}: printed {d}, want {want}"
        if not key_order_ok(list(d)):
            return False, f"key order {list(d)} is not Transformers'"
    first = list(dicts[0])
    if first != TRAIN_KEYS:
        return False, f"first log's keys {first}, Transformers prints {TRAIN_KEYS}"
    return True, f"{len(dicts)} dicts as ProgressCallback prints them, e.g. {dicts[0]}"


def case_logs_rounded(ctx):
    _, lines, log, _ = terminal_run(ctx, "bar", {})
    # ProgressCallback prints while training: up to the train_runtime summary (the evaluation
    # `onyx train` runs afterwards is printed as its "final evaluation" line)
    n = next(i for i, e in enumerate(log) if "train_runtime" in e) + 1
    ok, msg = check_dicts(lines, log[:n])
    if not ok:
        return ok, msg
    i_runtime = max(i for i, ln in enumerate(lines) if ln.startswith("{'train_runtime'"))
    i_bar = bar_lines(lines)[-1][0]
    if not i_runtime < i_bar:
        return False, "the train_runtime dict is printed after the final bar (Transformers: before)"
    return True, msg


def case_summary(ctx):
    _, lines, _, _ = terminal_run(ctx, "bar", {})
    i_bar = bar_lines(lines)[-1][0]
    rest = lines[i_bar + 1:]
    if not rest or not rest[0].startswith(f"trained {STEPS} steps, train_loss "):
        return False, (f"the line after the final bar is {rest[:1]}, "
                       f"want 'trained {STEPS} steps, ...'")
    fe = [ln for ln in rest if ln.startswith("final evaluation: ")]
    if not fe:
        return False, "no 'final evaluation: ' line"
    d = ast.literal_eval(fe[0][len("final evaluation: "):])
    bad = [k for k, v in d.items() if not isinstance(v, str) or g4(float(v)) != v]
    if bad or "eval_loss" not in d or list(d)[0] != "eval_loss":
        return False, f"final evaluation is not a rounded dict led by eval_loss: {fe[0]!r}"
    return True, f"{rest[0]!r}; {fe[0]!r}"


def pty_run(argv, cwd, timeout=180):
    """Runs argv with stdout and stderr on a pseudo-terminal of COLSxROWS; returns (status, the raw
    bytes written, decoded)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks, t0 = [], time.time()
    while True:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
        if time.time() - t0 > timeout:
            p.kill()
            raise AssertionError(f"{argv[1]} did not finish within {timeout} s")
    os.close(master)
    return p.wait(), b"".join(chunks).decode("utf-8", "replace")


def case_every_frame(ctx):
    """Every bar frame onyx draws (the raw stream, not the final screen) is the line
    tqdm.format_meter prints for its numbers, and each log is written on a cleared line."""
    import tqdm
    cfg = dict(ctx.cfg, output_dir="out_pty")
    path = os.path.join(ctx.tmp, "pty.yaml")
    write_config(path, cfg)
    status, raw = pty_run([ONYX, "train", path], ctx.tmp)
    if status != 0:
        return False, f"onyx train exited {status}: {raw[-300:]!r}"
    frames = [f.rstrip(" ") for f in re.split(r"\r\n|\r|\n", raw.replace("\x1b[K", ""))]
    frames = [f for f in frames if f]
    bars = [f for f in frames if "%|" in f or any(c in f for c in BAR_CHARS)]
    for f in bars:
        m = BAR_RE.match(f)
        if not m:
            return False, f"a frame is not a whole tqdm bar: {f!r}"
        el = sum(int(p) * 60 ** i for i, p in enumerate(reversed(m["el"].split(":"))))
        post = m["post"][2:] if m["post"] else ""
        if m["rate"] == "?":
            want = tqdm.tqdm.format_meter(int(m["n"]), STEPS, 0, ncols=COLS, postfix=post)
        elif m["unit"] == "it/s":
            rate = float(m["rate"])
            want = tqdm.tqdm.format_meter(int(m["n"]), STEPS, el, ncols=COLS, rate=rate,
                                          postfix=post)
            if m["rem"] != want.split("<")[1].split(",")[0]:  # remaining from a rounded rate
                want = want.replace("<" + want.split("<")[1].split(",")[0], "<" + m["rem"])
        else:
            want = f  # s/it: the rate printed is rounded; the regex has checked the layout
        if want != f:
            return False, f"tqdm.format_meter prints {want!r}, onyx {f!r}"
    logs = [f for f in frames if f.startswith("{")]
    if len(logs) < 4:
        return False, f"only {len(logs)} log lines in the stream"
    for m in re.finditer(r"\{'", raw):  # tqdm.write: the bar's line is cleared first
        i = m.start()
        if raw[:i].endswith("final evaluation: "):
            continue
        if not (raw[max(0, i - 4):i] == "\r\x1b[K" or raw[i - 1] == "\n"):
            return False, f"a log is written after {raw[max(0, i - 20):i]!r}, not on a cleared line"
    ns = sorted({int(BAR_RE.match(f)["n"]) for f in bars})
    return True, (f"{len(bars)} bar frames (steps {ns}), each tqdm's; "
                  f"{len(logs)} logs on cleared lines")


def case_disable_tqdm(ctx):
    _, lines, log, _ = terminal_run(ctx, "notqdm", {"disable_tqdm": True})
    if bar_lines(lines):
        return False, f"a bar with disable_tqdm: {bar_lines(lines)[0][1]!r}"
    # PrinterCallback prints every log, the evaluation after training too
    return check_dicts(lines, log)


def pipe_run(ctx):
    """`onyx train` with stdout and stderr through pipes (once): (stdout, output_dir)."""
    if not hasattr(ctx, "pipe"):
        cfg = dict(ctx.cfg, output_dir="out_pipe")
        path = os.path.join(ctx.tmp, "pipe.yaml")
        write_config(path, cfg)
        p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=300,
                           cwd=ctx.tmp)
        if p.returncode != 0:
            raise AssertionError(f"onyx train exited {p.returncode}: {p.stderr.strip()[-300:]}")
        ctx.pipe = (p.stdout, os.path.join(ctx.tmp, cfg["output_dir"]))
    return ctx.pipe


def case_pipe(ctx):
    out, _ = pipe_run(ctx)
    if "\r" in out or any(c in out for c in BAR_CHARS) or "%|" in out:
        return False, "bar output through a pipe"
    log = read_log(os.path.join(ctx.tmp, "out_pipe"))
    js = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    if js[:len(log)] != log:
        return False, f"JSON lines differ from log_history.jsonl: {js[:1]} vs {log[:1]}"
    if not any(ln.startswith(f"trained {STEPS} steps") for ln in out.splitlines()):
        return False, "no 'trained ...' line"
    return True, f"{len(js)} JSON lines, no bar"


def parse_help(text):
    """{key: (type, default, help)} of the TrainingArguments section, and the config keys."""
    args, cfg_keys, section, cur = {}, [], None, None
    for ln in text.splitlines():
        if ln.startswith("Config keys"):
            section = "config"
            continue
        if ln.startswith("TrainingArguments"):
            section = "args"
            continue
        m = re.match(r"^  (\w+): (.+)$", ln)
        if m and section == "config":
            cfg_keys.append(m[1])
        elif m and section == "args":
            mm = re.match(r"^(.+?) = (.+?)(  \{.*\})?$", m[2])
            if not mm:
                raise AssertionError(f"help line without 'type = default': {ln!r}")
            cur = m[1]
            args[cur] = [mm[1], mm[2], ""]
        elif section == "args" and cur and ln.startswith("      ") and ln.strip():
            args[cur][2] += ln.strip()
    return args, cfg_keys


def default_value(text):
    if text == "None":
        return None
    return json.loads(text)


def case_help(ctx):
    _, out = pipe_run(ctx)
    with open(os.path.join(out, f"checkpoint-{STEPS}", "training_args.json")) as f:
        written = json.load(f)
    p = subprocess.run([ONYX, "train", "--help"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return False, f"onyx train --help exited {p.returncode}"
    args, cfg_keys = parse_help(p.stdout)
    missing = sorted(set(written) - set(args))
    extra = sorted(set(args) - set(written))
    if missing or extra:
        return False, f"--help lacks {missing}, lists unknown {extra}"
    no_help = [k for k, (_, _, h) in args.items() if not h]
    if no_help:
        return False, f"keys without a help line: {no_help}"
    set_keys = set(ctx.cfg) | {"output_dir"}
    wrong = [f"{k}: help says {args[k][1]}, written {written[k]!r}" for k in written
             if k not in set_keys and default_value(args[k][1]) != written[k]]
    if wrong:
        return False, "defaults differ: " + "; ".join(wrong[:4])
    want_cfg = ["model", "loss", "predictions", "train_data", "eval_data", "test_data",
                "metrics", "frozen"]
    if not set(want_cfg) <= set(cfg_keys):
        return False, f"config keys listed {cfg_keys}, want {want_cfg} among them"
    for sub in ("evaluate", "plan"):
        q = subprocess.run([ONYX, sub, "--help"], capture_output=True, text=True, timeout=60)
        if q.returncode != 0 or "onyx train --help" not in q.stdout:
            return False, f"`onyx {sub} --help` does not point to `onyx train --help`"
    return True, (f"{len(args)} TrainingArguments keys with type, default and help, "
                  f"{len(cfg_keys)} config keys")


def case_version(ctx):
    p = subprocess.run([ONYX, "--version"], capture_output=True, text=True, timeout=60)
    lines = p.stdout.strip().split("\n")
    line = lines[0]
    m = re.match(r"^onyx (\d+\.\d+\.\d+) \((?:commit ([0-9a-f]+)(-dirty)?, )?(GCC|clang) [^)]+\)$",
                 line)
    if p.returncode != 0 or not m:
        return False, f"`onyx --version` exited {p.returncode} and printed {line!r}"
    if m[2] and shutil.which("git"):
        q = subprocess.run(["git", "-C", REPO, "cat-file", "-e", m[2] + "^{commit}"],
                           capture_output=True)
        if q.returncode != 0:
            return False, f"commit {m[2]} is not one git knows"
    # The second line names the SIMD path the kernels run (kernels/cpu/simd/dispatch.cc); ONYX_CPU
    # forces one, and an unknown one is refused at start-up.
    cpu = re.match(r"^cpu path (avx512|avx2|portable) \(compiled:((?: \w+)+); this CPU:((?: \w+)+)\); "
                   r"bf16 conversions (avx512_bf16|portable rounding)", lines[1] if len(lines) > 1 else "")
    if not cpu:
        return False, f"`onyx --version` printed no cpu path line: {p.stdout!r}"
    supported = cpu[3].split()
    if cpu[1] != supported[0] or "portable" not in cpu[2].split():
        return False, f"auto chose {cpu[1]}, not the best of {supported} (or no portable path)"
    # ONYX_CPU caps oneDNN's own dispatch too: a forced avx2 or portable path runs no AVX-512
    # GEMM (and no native bf16 matmul), as on a CPU of that kind.
    allowed = {"avx2": {"sse41", "avx", "avx2", "avx2_vnni"}, "portable": {"sse41"}}
    for path in supported:
        q = subprocess.run([ONYX, "--version"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "ONYX_CPU": path})
        if q.returncode != 0 or f"cpu path {path} " not in q.stdout:
            return False, f"ONYX_CPU={path}: exit {q.returncode}, {q.stdout!r} {q.stderr!r}"
        isa = re.search(r"; GEMMs oneDNN (\w+)", q.stdout)
        if not isa or (path in allowed and isa[1] not in allowed[path]):
            return False, f"ONYX_CPU={path}: oneDNN runs {isa[1] if isa else '?'}: {q.stdout!r}"
        if path == "portable" and "bf16 conversions portable rounding" not in q.stdout:
            return False, f"ONYX_CPU=portable still converts to bf16 natively: {q.stdout!r}"
    q = subprocess.run([ONYX, "--version"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "ONYX_CPU": "sse9"})
    if q.returncode == 0 or "unknown CPU path 'sse9'" not in q.stderr:
        return False, f"ONYX_CPU=sse9 was not refused: exit {q.returncode}, {q.stderr!r}"
    return True, line + " | " + lines[1]


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def report(status, name, msg):
        counts[status] += 1
        print(f"{status} {name}: {msg}", flush=True)

    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="onyx-terminal-")
    ctx = None
    try:
        cases = [
            ("terminal-final-bar", case_final_bar),
            ("terminal-logs-not-broken", case_logs_not_broken),
            ("terminal-logs-rounded", case_logs_rounded),
            ("terminal-summary-own-line", case_summary),
            ("terminal-every-frame", case_every_frame),
            ("terminal-disable-tqdm", case_disable_tqdm),
            ("pipe-json-lines", case_pipe),
            ("help-lists-every-key", case_help),
            ("version", case_version),
        ]
        try:
            ctx = setup(tmp)
        except Exception as e:
            for name, _ in cases:
                if filt in name:
                    report("FAIL", name, f"setup: {type(e).__name__}: {e}")
            cases = []
        for name, fn in cases:
            if filt not in name:
                continue
            try:
                ok, msg = fn(ctx)
                report("PASS" if ok else "FAIL", name, msg)
            except Exception as e:  # tmux missing or failing is a failure, with the reason
                report("FAIL", name, f"{type(e).__name__}: {e}")
    finally:
        if ctx:
            ctx.tmux.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.0f} s)")
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
