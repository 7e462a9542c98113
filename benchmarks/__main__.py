"""`make bench`: run every benchmark in turn and print its numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = ["bench_simulator.py", "bench_governor_sim.py"]


def main() -> int:
    failed = 0
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        failed += subprocess.call([sys.executable, str(HERE / name)]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
