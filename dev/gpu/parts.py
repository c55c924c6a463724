"""A file larger than one call to the GPU machine carries (64 MiB of the working tree), sent in parts.

    python3 dev/gpu/parts.py split FILE DIR [--size MIB]   # DIR/NAME.partNNN and DIR/NAME.parts.json
    python3 dev/gpu/parts.py calls DIR [--budget MIB]      # which parts each call carries (one line a call)
    python3 dev/gpu/parts.py join DIR/NAME.parts.json OUT   # on the machine: every part checked, then joined

The manifest names the whole file's size and sha256 and each part's; `join` refuses (exit 3) while a part is
missing or differs, naming each, so a run can say which call has yet to carry what; the joined file is checked
against the whole's sha256 before it is moved into place. Standard library only: it runs on the GPU machine too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

MIB = 1 << 20
MANIFEST = ".parts.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def split(file: Path, folder: Path, size: int) -> Path:
    """`file` cut into parts of at most `size` bytes in `folder`, and their manifest; returns the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(file, "rb") as fh:
        for index in range(10_000):
            chunk = fh.read(size)
            if not chunk:
                break
            part = folder / f"{file.name}.part{index:03d}"
            part.write_bytes(chunk)
            parts.append({"file": part.name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = folder / f"{file.name}{MANIFEST}"
    manifest.write_text(json.dumps({"name": file.name, "size": file.stat().st_size, "sha256": _sha256(file),
                                    "parts": parts}, indent=1) + "\n")
    return manifest


def calls(folder: Path, budget: int) -> list[list[str]]:
    """The parts of every manifest in `folder`, grouped so that each group fits one call's budget."""
    groups: list[list[str]] = []
    room = 0
    for manifest in sorted(folder.glob(f"*{MANIFEST}")):
        for part in json.loads(manifest.read_text())["parts"]:
            if part["size"] > budget:
                raise ValueError(f"{part['file']} ({part['size']} bytes) is larger than a call's budget")
            if not groups or part["size"] > room:
                groups.append([])
                room = budget
            groups[-1].append(part["file"])
            room -= part["size"]
    return groups


def problems(manifest: Path) -> list[str]:
    """What keeps the parts of `manifest` from being joined: each part missing or not the one it names."""
    data = json.loads(manifest.read_text())
    found = []
    for part in data["parts"]:
        path = manifest.parent / part["file"]
        if not path.exists():
            found.append(f"{part['file']}: missing")
        elif path.stat().st_size != part["size"] or _sha256(path) != part["sha256"]:
            found.append(f"{part['file']}: not the part the manifest names (size or sha256 differs)")
    return found


def join(manifest: Path, out: Path) -> None:
    """The parts joined into `out`, checked against the whole file's sha256 first (nothing at `out` otherwise)."""
    data = json.loads(manifest.read_text())
    partial = out.with_name(out.name + ".joining")
    digest = hashlib.sha256()
    with open(partial, "wb") as fh:
        for part in data["parts"]:
            chunk = (manifest.parent / part["file"]).read_bytes()
            digest.update(chunk)
            fh.write(chunk)
    if digest.hexdigest() != data["sha256"]:
        partial.unlink()
        raise ValueError(f"the joined {data['name']} has sha256 {digest.hexdigest()}, not {data['sha256']}")
    os.replace(partial, out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dev/gpu/parts.py", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    cut = verbs.add_parser("split")
    cut.add_argument("file", type=Path)
    cut.add_argument("folder", type=Path)
    cut.add_argument("--size", type=int, default=60, help="MiB a part (default 60)")
    plan = verbs.add_parser("calls")
    plan.add_argument("folder", type=Path)
    plan.add_argument("--budget", type=int, default=60, help="MiB a call carries (default 60)")
    glue = verbs.add_parser("join")
    glue.add_argument("manifest", type=Path)
    glue.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "split":
        print(split(args.file, args.folder, args.size * MIB))
    elif args.verb == "calls":
        for i, group in enumerate(calls(args.folder, args.budget * MIB), 1):
            print(f"call {i}: {' '.join(group)}")
    else:
        left = problems(args.manifest)
        if left:
            print("not yet:\n" + "\n".join(f"  {p}" for p in left), file=sys.stderr)
            return 3
        join(args.manifest, args.out)
        print(f"joined {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
