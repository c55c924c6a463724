"""Exit 1, naming the files, where the verlc wheel WHEEL was not built from this working tree's sources (a file
differs, or one is in only one of them): the rehearsal would test another verlc. Run from the repository root.

    python3 dev/gpu/wheel_matches.py .whl/common/verlc-0.1.0-py3-none-any.whl
"""

from __future__ import annotations

import sys
import tomllib
import zipfile
from pathlib import Path

FOLDERS = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]  # package -> folder
KINDS = (".py", ".j2")


def in_tree(name: str) -> Path | None:
    """The working tree's file for the wheel's `name` (verlc/compiler/x.py -> compiler/x.py), by the longest package."""
    for package, folder in sorted(FOLDERS.items(), key=lambda item: -len(item[0])):
        prefix = package.replace(".", "/") + "/"
        if name.startswith(prefix):
            return Path(folder) / name.removeprefix(prefix)
    return None


def main(wheel: str) -> int:
    with zipfile.ZipFile(wheel) as archive:
        named = {n: in_tree(n) for n in archive.namelist() if n.endswith(KINDS)}
        packed = {path: archive.read(n) for n, path in named.items() if path}
    tree = {p for folder in set(FOLDERS.values()) for p in Path(folder).rglob("*") if p.suffix in KINDS
            and "__pycache__" not in p.parts}
    problems = [f"{p} differs from this working tree's" for p, data in sorted(packed.items())
                if not p.exists() or p.read_bytes() != data]
    problems += [f"{p} is not in it" for p in sorted(tree - set(packed))]
    for problem in problems:
        print(f"{wheel}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
