"""The leader's state document against a ConfigMap's 1 MiB, at 1,000 and 5,000 models.

The state of each model as after a full 300 s stabilization window at 5 s ticks (60
recommendations), every measured value distinct per model (full-precision floats, the
recommendations varying: the least compressible case; tests/service/test_cmstore.py's
`state_doc`), saved as `service.cmstore.ConfigMapStore` saves it: JSON, gzip level 6.
Reported per size: bytes of JSON, bytes gzipped and their share of the limit
(1,048,576 bytes of data + binaryData), and the CPU ms of the dump and of the gzip.
A replayed fleet (benchmarks.promreplay, few distinct values) compresses about 3x better.
Not part of `make bench` (about 10 s).
Run: `.venv/bin/python -m benchmarks.bench_state [--sizes 1000,5000] [--json F]`.
"""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

from benchmarks.common import Row, bench_args, print_rows, write_rows
from service.cmstore import CONFIGMAP_MAX_BYTES
from tests.service.test_cmstore import state_doc


def measure(n: int) -> dict[str, Any]:
    """Sizes (bytes) and CPU ms of one save of the state of `n` models."""
    doc = state_doc(n)
    c0 = time.process_time()
    text = json.dumps(doc.model_dump(mode="json"), sort_keys=True).encode()
    c1 = time.process_time()
    packed = gzip.compress(text, compresslevel=6, mtime=0)
    c2 = time.process_time()
    return {
        "models": n,
        "json_bytes": len(text),
        "gzip_bytes": len(packed),
        "limit_frac": len(packed) / CONFIGMAP_MAX_BYTES,
        "dump_cpu_ms": (c1 - c0) * 1000.0,
        "gzip_cpu_ms": (c2 - c1) * 1000.0,
    }


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--sizes", default="1000,5000")
    args = ap.parse_args(argv)
    results = [measure(int(s)) for s in args.sizes.split(",")]
    rows = [
        Row(
            "state",
            f"state of {r['models']:,} models (JSON -> gzip)",
            f"{r['json_bytes'] / 1e6:.2f} MB -> {r['gzip_bytes'] / 1e6:.2f} MB "
            f"({100 * r['limit_frac']:.0f} % of 1 MiB; dump {r['dump_cpu_ms']:.0f} ms, "
            f"gzip {r['gzip_cpu_ms']:.0f} ms CPU)",
            "<= 50 % of 1 MiB",
            r["limit_frac"] <= 0.5,
            r,
        )
        for r in results
    ]
    print_rows(rows)
    write_rows(args.json, "state", rows, results)
    return rows


if __name__ == "__main__":
    main()
