"""Run a launch script's own shell code to see the commands it would start, and start none of them.

`verlc import` needs the trainer command exactly as the script computes it (variables with defaults, arithmetic,
arrays, sourced files); reading the shell statically gets those wrong. So the script runs, under bash, in a
sandbox made of Linux namespaces (util-linux `unshare`, unprivileged user namespaces):

- every file system is read-only except one temporary folder, which is removed afterwards;
- no network (a new, empty network namespace), its own process tree (killed whole at the deadline);
- the commands that start, install, download or schedule (python, python3, python3.X, ray, torchrun, uv, pip,
  hf, huggingface-cli, nvidia-smi, srun, sbatch, docker, podman, apptainer, vllm, ...) are stand-ins wherever the script
  looks for them (on PATH and at their absolute paths): each call records its argv, environment and working
  folder, prints nothing and exits 0 (so a loop waiting for `nvidia-smi`, or for a server with `curl`, `wget` or
  `nc`, ends at once);
- a probe of the host answers as a plain host of the accelerator the import is for (CUDA unless told): a
  `python -c` that imports another accelerator's package (`import torch_npu` on CUDA) exits 1, and another
  accelerator's tools (`npu-smi`, `rocm-smi` on CUDA) are not there, also for `command -v`; every probe (a
  `python -c`, a GPU tool, `command -v`) is kept for the import's report;
- stdin is empty, the environment is a minimal one (the caller's secrets are not in it), output is capped.

The mounts are made read-only by the sandbox's root, then the script runs in a user namespace nested inside it,
which owns no mount: it cannot remount them writable.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .compiler.import_script import Call

# The commands a launch script starts the trainer through, and those that install, download, probe GPUs or
# schedule before it: recorded, never run.
STAND_INS = ("python", "python3", "ray", "torchrun", "uv", "pip", "pip3", "hf", "huggingface-cli", "nvidia-smi",
             "rocm-smi", "npu-smi", "srun", "sbatch", "scontrol", "docker", "podman", "apptainer", "singularity", "conda",
             "module", "vllm", "curl", "wget", "nc")
# What a plain host of each accelerator lacks: the packages another accelerator's stack installs, and its tools.
ABSENT = {
    "cuda": (("torch_npu", "mindspeed", "torch_mlu"), ("npu-smi", "rocm-smi", "amd-smi")),
    "rocm": (("torch_npu", "mindspeed", "torch_mlu"), ("npu-smi", "nvidia-smi")),
    "npu": (("torch_mlu",), ("nvidia-smi", "rocm-smi", "amd-smi")),
}
PROBING_TOOLS = ("nvidia-smi", "rocm-smi", "npu-smi")
OUTPUT_LIMIT = 1 << 20   # bytes of stdout+stderr a script may print
FILE_LIMIT_KIB = 65536   # largest file it may write in its temporary folder (ulimit -f)

# Each stand-in: one folder per call under $VERLC_CALLS, named by the clock so calls sort in order.
_RECORDER = """#!/bin/sh
d="$VERLC_CALLS/$(/usr/bin/env date +%s%N)-$$"
/usr/bin/env mkdir "$d" || exit 0
/usr/bin/env printf '%s\\0' "$0" "$@" > "$d/argv"
/usr/bin/env -u VERLC_CALLS -u VERLC_ABSENT -u BASH_ENV env -0 > "$d/env"
/usr/bin/env pwd > "$d/cwd"
case "${0##*/}" in
  python*)  # `python -c 'import torch_npu'`: the answer of a host without that package
    if [ "${1:-}" = "-c" ]; then
      for m in $VERLC_ABSENT; do
        case "${2:-}" in *"import $m"* | *"from $m "* | *"from $m."*) echo 1 > "$d/exit"; exit 1 ;; esac
      done
    fi ;;
esac
exit 0
"""
# The script's bash sources this first: `ulimit` (which may not raise a limit here) and `command -v` recorded.
_BASH_ENV = """ulimit() {
  printf '%s\\n' "$*" >> "$VERLC_CALLS/../limits"
  builtin ulimit "$@" 2>/dev/null || true
}
command() {
  case "${1:-}" in -v | -V) printf '%s\\n' "${2:-}" >> "$VERLC_CALLS/../looked-up" ;; esac
  builtin command "$@"
}
"""

# Runs as the sandbox's root: bind the stand-ins over the real tools, make every mount but the temporary folder
# read-only, then run the script in a nested user namespace (which owns no mount) with a minimal environment.
_SETUP = r"""
set -u
tmp=$1; shift
mount --bind "$tmp" "$tmp"
IFS=: read -ra dirs <<< "$VERLC_TOOL_DIRS"
for dir in "${dirs[@]}"; do
  for tool in "$dir"/python3.[0-9] "$dir"/python3.[0-9][0-9] $VERLC_STAND_INS; do
    case $tool in /*) ;; *) tool=$dir/$tool ;; esac
    [ -f "$tool" ] && [ ! -L "$tool" ] && mount --bind "$tmp/bin/recorder" "$tool" 2>/dev/null
    [ -L "$tool" ] && [ -f "$(readlink -f "$tool")" ] && mount --bind "$tmp/bin/recorder" "$(readlink -f "$tool")" 2>/dev/null
  done
done
while read -r _ _ _ _ point _; do
  point=$(printf '%b' "$point")
  [ "$point" = "$tmp" ] && continue
  mount -o remount,bind,ro "$point" 2>/dev/null
done < /proc/self/mountinfo
mount -o remount,bind,rw "$tmp" 2>/dev/null
ulimit -f "$VERLC_FILE_LIMIT"
cd "$VERLC_CWD" 2>/dev/null || cd "$tmp"
vars=()
while [ "$1" != "--" ]; do vars+=("$1"); shift; done
shift
unshare --user -- env -i "${vars[@]}" VERLC_CALLS="$tmp/calls" VERLC_ABSENT="$VERLC_ABSENT" \
  BASH_ENV="$tmp/bin/bash_env" bash "$@" \
  < /dev/null
rc=$?
# A call the script started in the background (a server, `... &`) may still be recording: every process of this
# namespace ends with this shell, its first, so it waits for them (stand-ins end at once; at most 2 s)
for _ in {1..20}; do
  pids=(/proc/[0-9]*)
  ((${#pids[@]} <= 1)) && break
  sleep 0.1
done
exit "$rc"
"""


class SandboxError(Exception):
    """The script could not be run to the end in the sandbox; the message says why, in one line."""


@dataclass(frozen=True)
class Outcome:
    calls: tuple[Call, ...]
    base_env: dict[str, str]  # the environment the script started with
    exit_code: int
    output: str               # what it printed (stdout and stderr), at most OUTPUT_LIMIT bytes
    looked_up: tuple[str, ...] = ()  # the names the script asked `command -v` about, in order
    limits: tuple[str, ...] = ()  # the arguments of each `ulimit` that sets a limit (e.g. "-n 65535")
    accelerator: str = "cuda"  # the host its probes were answered as

    def probes(self) -> list[tuple[Call, int]]:
        """Each call that asked about the host (`python -c ...`, a GPU tool), with the exit code it got."""
        return [(c, c.exit) for c in self.calls
                if (c.tool.startswith("python") and c.argv[1:2] == ("-c",)) or c.tool in PROBING_TOOLS]


def run(script: Path, args: tuple[str, ...], cwd: Path, timeout: float, given: dict[str, str],
        accelerator: str = "cuda") -> Outcome:
    """Run `bash SCRIPT ARGS` in the sandbox from `cwd` (read-only), with the variables `given` set, and return
    what it started; its probes of the host are answered as a plain `accelerator` host would.

    SandboxError when the sandbox cannot be made here, the script runs past `timeout` seconds or prints more
    than OUTPUT_LIMIT bytes."""
    if shutil.which("unshare") is None:
        raise SandboxError("`unshare` (util-linux) is not on PATH: verlc import runs the script's shell code in a "
                           "namespace sandbox it makes with unshare")
    tmp = Path(tempfile.mkdtemp(prefix="verlc-import-")).resolve()
    try:
        for sub in ("bin", "calls", "tmp"):
            (tmp / sub).mkdir()
        recorder = tmp / "bin" / "recorder"
        recorder.write_text(_RECORDER)
        recorder.chmod(0o755)
        # Raising a limit (ulimit -n 65535, common before Ray starts) is not allowed in the sandbox and changes
        # nothing the trainer is started with: it must not end the script.
        (tmp / "bin" / "bash_env").write_text(_BASH_ENV)
        modules, tools = ABSENT[accelerator]
        for name in STAND_INS:
            if name not in tools:  # another accelerator's tool is not on this host's PATH
                (tmp / "bin" / name).symlink_to("recorder")
        path = os.environ.get("PATH", "/usr/bin:/bin")
        dirs = [d for d in dict.fromkeys([*path.split(":"), "/usr/local/bin", "/usr/bin", "/bin"]) if d]
        home = os.path.expanduser("~")
        user = os.environ.get("USER") or os.environ.get("LOGNAME") or "user"
        base = {"PATH": f"{tmp}/bin:{path}", "HOME": home, "USER": user, "LANG": "C.UTF-8",
                "TMPDIR": f"{tmp}/tmp", **given}
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "VERLC_TOOL_DIRS": ":".join(dirs),
               "VERLC_CWD": str(cwd.resolve()), "VERLC_FILE_LIMIT": str(FILE_LIMIT_KIB),
               "VERLC_STAND_INS": " ".join(n for n in STAND_INS if n not in tools),
               "VERLC_ABSENT": " ".join(modules)}
        argv = ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--kill-child",
                "--mount-proc", "bash", "-c", _SETUP, "verlc-sandbox", str(tmp),
                *(f"{k}={v}" for k, v in base.items()), "--", str(script.resolve()), *args]
        code, output = _bounded(argv, env, timeout, script)
        if code != 0 and not any((tmp / "calls").iterdir()) and "unshare:" in output:
            raise SandboxError(f"cannot make the sandbox here ({output.strip().splitlines()[-1]}): verlc import "
                               f"needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                               f"user.max_user_namespaces > 0)")
        calls = tuple(_read(c) for c in sorted((tmp / "calls").iterdir()))
        looked = tmp / "looked-up"
        looked_up = tuple(looked.read_text().splitlines()) if looked.exists() else ()
        limits = tmp / "limits"
        set_limits = tuple(line for line in (limits.read_text().splitlines() if limits.exists() else ())
                           if re.search(r"(^| )([0-9]+|unlimited)$", line))  # not a query (`ulimit -n`)
        return Outcome(calls, base, code, output, looked_up, accelerator=accelerator, limits=set_limits)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bounded(argv: list[str], env: dict[str, str], timeout: float, script: Path) -> tuple[int, str]:
    """Run argv in a process group of its own; its exit code and output, or SandboxError past the deadline or
    the output limit (the whole group killed either way). Output comes through a pipe read here, so a script
    that prints without end blocks on it, and is stopped, at the limit."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"{script} was still running after {timeout:g} s (its shell code runs "
                                       f"until it starts the trainer; a loop that waits for something never "
                                       f"ends here): stopped; pass --timeout for a slower script")
                if not sel.select(min(left, 0.5)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > OUTPUT_LIMIT:
                    raise SandboxError(f"{script} printed more than {OUTPUT_LIMIT >> 20} MiB: stopped")
                chunks.append(chunk)
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{script} was still running after {timeout:g} s: stopped") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def _read(folder: Path) -> Call:
    argv = (folder / "argv").read_bytes().split(b"\0")[:-1]
    env = dict(item.split("=", 1) for item in (folder / "env").read_bytes().decode(errors="replace").split("\0")
               if "=" in item)
    cwd = (folder / "cwd").read_text().strip() if (folder / "cwd").exists() else ""
    code = int((folder / "exit").read_text()) if (folder / "exit").exists() else 0
    return Call(tuple(a.decode(errors="replace") for a in argv), env, cwd, code)
