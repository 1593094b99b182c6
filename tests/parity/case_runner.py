"""case_runner.py — the loop the parity scripts share: run (name, fn) cases whose name contains
the command line's filter, each fn(tmp) returning (ok, message); one PASS / FAIL line per case (an
exception is a FAIL naming it), then "N passed, M failed". `tmp` is a fresh folder removed at the
end (kept and printed when KEEP is set in the environment). Returns the exit status.
with_shared: cases that share one setup (a training run) made by the first of them.
"""
import os
import shutil
import sys
import tempfile
import time


def run_cases(cases, prefix, filt=None):
    filt = filt if filt is not None else (sys.argv[1] if len(sys.argv) > 1 else "")
    counts = {"PASS": 0, "FAIL": 0}
    tmp = tempfile.mkdtemp(prefix=prefix)
    t0 = time.time()
    try:
        for name, fn in cases:
            if filt not in name:
                continue
            try:
                ok, msg = fn(tmp)
            except Exception as e:
                ok, msg = False, f"{type(e).__name__}: {e}"
            counts["PASS" if ok else "FAIL"] += 1
            print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
    finally:
        if os.environ.get("KEEP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.0f} s)")
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed")
    return 1 if counts["FAIL"] else 0


def with_shared(setup):
    """Cases that share one expensive setup: returns wrap(fn) -> case(tmp) calling fn(shared),
    the shared object made by the first case that runs (setup(tmp)); a setup that failed fails
    every case, naming its error."""
    state = {}

    def wrap(fn):
        def case(tmp):
            if "shared" not in state:
                try:
                    state["shared"] = setup(tmp)
                except Exception as e:
                    state["shared"] = e
            if isinstance(state["shared"], Exception):
                e = state["shared"]
                raise RuntimeError(f"setup failed: {type(e).__name__}: {e}")
            return fn(state["shared"])
        return case
    return wrap
