"""Write compiler/verl_schemas/<version>.json from the installed verl.

    .venv/bin/python dev/verl_schema.py          # the installed verl's version
    .venv/bin/python dev/verl_schema.py --check  # exit 1 if the shipped snapshot differs

tests/test_verl_schema.py runs the check, so a snapshot cannot silently drift from verl.
"""

from __future__ import annotations

import sys
from pathlib import Path

from verlc.compiler import verl_schema

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    schema = verl_schema.live()
    path = REPO / "compiler" / "verl_schemas" / f"{schema.version}.json"
    text = verl_schema.snapshot_json(schema)
    if "--check" in argv:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path.relative_to(REPO)} is not what verl {schema.version} composes; "
                  f"run: .venv/bin/python dev/verl_schema.py", file=sys.stderr)
            return 1
        print(f"{path.relative_to(REPO)} matches the installed verl {schema.version}")
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.relative_to(REPO)}: {len(schema.engines)} engines, {len(schema.allowed)} restricted keys")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
