"""The wheels a set of requirements needs on the GPU machine beyond what its image has, fetched into a folder.

    python3 dev/gpu/closure.py DIR REQUIREMENT... [--skip NAME...]

Breadth first from REQUIREMENTs: each name that dev/gpu/device-packages.txt lists (what the machine's image holds)
or that --skip names is left out (a REQUIREMENT itself always comes: the version it names); every other is fetched as a Linux x86-64 CPython 3.12 wheel without its
dependencies (pip download --no-deps, pip's own choice of version for the specifier), and its METADATA's
Requires-Dist (markers evaluated for that machine, extras followed where a requirement names them) queued in turn.
Writes DIR/closure.txt: one line a wheel, with the requirement that brought it in. Run by dev/gpu/wheels.sh.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# the GPU machine's environment, for requirement markers
MACHINE = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
           "sys_platform": "linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix"}


def device_packages() -> set[str]:
    lines = (HERE / "device-packages.txt").read_text().splitlines()
    return {canonicalize_name(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def fetch(folder: Path, requirement: Requirement) -> Path:
    """The wheel pip chooses for `requirement` (its name and specifier, no extras), downloaded into `folder`; where
    the version has only a source distribution (antlr4-python3-runtime 4.9, Hydra's), a wheel built from it here."""
    before = set(folder.glob("*.whl"))
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    wanted = f"{requirement.name}{requirement.specifier}"
    if subprocess.run([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                       "--implementation", "cp", *platforms, "-d", str(folder), wanted],
                      stderr=subprocess.DEVNULL).returncode:
        subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", str(folder), wanted], check=True)
    name = canonicalize_name(requirement.name)
    found = [w for w in folder.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == name]
    new = [w for w in found if w not in before]
    return (new or found)[0]


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the machine, with the given extras."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(metadata).decode())
    found = []
    for line in message.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({**MACHINE, "extra": e}) for e in extras or {""}):
            found.append(requirement)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dev/gpu/closure.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("requirements", nargs="+")
    parser.add_argument("--skip", nargs="*", default=[], help="names never fetched (optional at import)")
    args = parser.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    have = device_packages() | {canonicalize_name(n) for n in args.skip}
    queue = [(Requirement(r), "asked") for r in args.requirements]
    done: dict[str, tuple[Path, str]] = {}
    extras_seen: dict[str, set[str]] = {}
    while queue:
        requirement, why = queue.pop(0)
        name = canonicalize_name(requirement.name)
        if name in have and why != "asked":  # one asked for by name comes in its own version
            continue
        extras = set(requirement.extras)
        if name in done and extras <= extras_seen[name]:
            continue
        if name not in done:
            done[name] = (fetch(args.folder, requirement), why)
            print(f"{done[name][0].name}  <- {why}", flush=True)
        extras_seen[name] = extras_seen.get(name, set()) | extras
        for needed in requires(done[name][0], extras_seen[name]):
            queue.append((needed, str(requirement)))
    (args.folder / "closure.txt").write_text("".join(f"{wheel.name}  <- {why}\n"
                                                     for wheel, why in sorted(done.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
