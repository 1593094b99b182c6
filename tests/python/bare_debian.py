"""bare_debian.py — a bare Debian 12 to install the repaired wheel into (issue #42; test_package.py's
wheel-bare-debian case): `debootstrap --variant=minbase bookworm` with python3 and python3-venv
only — no -dev packages, no compiler, none of the libraries onyx links — kept in $BUILD/debian12
between runs (about a minute to make). Commands run in it through chroot with a clean environment,
/proc mounted for their duration; files go in by copy, never by bind mount, so removing the tree
can only ever remove its own files. Needs root (CI runs as root).
"""
import contextlib
import os
import shlex
import shutil
import subprocess

MIRROR = os.environ.get("ONYX_DEBIAN_MIRROR", "http://deb.debian.org/debian")
STAMP = "debootstrap --variant=minbase --include=python3,python3-venv bookworm"


def make(root):
    """The chroot at `root`, made once (a stamp file records how)."""
    stamp = os.path.join(root, ".onyx-stamp")
    if os.path.exists(stamp) and open(stamp).read().strip() == STAMP:
        return
    if os.geteuid() != 0:
        raise RuntimeError("making a Debian 12 chroot with debootstrap needs root")
    assert not os.path.ismount(os.path.join(root, "proc")), f"{root}/proc is still mounted"
    shutil.rmtree(root, ignore_errors=True)
    p = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv",
                        "bookworm", root, MIRROR], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"debootstrap failed: {p.stdout[-1500:]}{p.stderr[-1500:]}"
    open(stamp, "w").write(STAMP + "\n")


def installed_packages(root):
    out = subprocess.run(["chroot", root, "dpkg-query", "-W", "-f", "${Package}\\n"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return out.split()


@contextlib.contextmanager
def proc_mounted(root):
    proc = os.path.join(root, "proc")
    subprocess.run(["mount", "-t", "proc", "proc", proc], check=True, timeout=60)
    try:
        yield
    finally:
        subprocess.run(["umount", proc], check=True, timeout=60)


def run(root, argv, cwd="/", env=None, timeout=1200):
    """argv run inside the chroot from `cwd` with only PATH, HOME and `env` set."""
    pairs = [f"{k}={v}" for k, v in {"PATH": "/usr/bin:/bin", "HOME": "/root", **(env or {})}.items()]
    script = f"cd {shlex.quote(cwd)} && exec {shlex.join(argv)}"
    with proc_mounted(root):
        return subprocess.run(["chroot", root, "/usr/bin/env", "-i", *pairs, "/bin/sh", "-c", script],
                              capture_output=True, text=True, timeout=timeout)


def copy_in(root, src, dest):
    """Copies the host file or folder `src` to `dest` inside the chroot (replacing it)."""
    target = os.path.join(root, dest.lstrip("/"))
    if os.path.isdir(target):
        shutil.rmtree(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, target)
    return target
