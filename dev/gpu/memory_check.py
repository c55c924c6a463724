"""The preflight's GPU memory step (runtime/startup.py) on a real GPU, without Ray or verl: what it measures on
an idle GPU, then with another process holding 70% of it, and its verdict for vLLM's rollout at a share of 0.4
both times (vLLM's own rule: ceil(total x share) bytes free at its start). Prints one JSON line per case.

    python3 dev/gpu/memory_check.py     # from the repository root, on a machine with an NVIDIA GPU
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: runtime/ as a package
from runtime.job import RolloutMemory  # noqa: E402
from runtime.startup import memory_found, memory_problems  # noqa: E402

HOG = ("import time, torch; free, total = torch.cuda.mem_get_info(); "
       "held = torch.empty(int(0.7 * total), dtype=torch.uint8, device='cuda'); print('held', flush=True); "
       "time.sleep(600)")


def case(name: str) -> None:
    found = memory_found()
    print(json.dumps({"case": name, "found": found,
                      "problems": memory_problems({"0123456789": found}, RolloutMemory(0.4))}), flush=True)


def main() -> int:
    case("idle")
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE, text=True)
    try:
        if hog.stdout is None or hog.stdout.readline().strip() != "held":
            print("memory_check.py: the process meant to hold 70% of the GPU did not start (no GPU here?)")
            return 1
        time.sleep(1)
        case("a process holding 70%")
    finally:
        hog.kill()
        hog.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
