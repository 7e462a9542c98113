"""A real governor service process with a file-driven fake metric source, for the
SIGTERM and kill/restart tests: `python -m tests.service.serve_fake --config FILE
--state-file FILE --rates-file FILE [--slow-save-s S --marker FILE]`.

Everything but the source is production code (ServiceCore, FileStore, GovernorServer,
`serve` with its signal handling). The rates file is JSON {model: req/s}, re-read on
every observation. `--slow-save-s` makes each targets write take that long and touch
`--marker` when it starts, so a test can catch an admin call in flight.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from controller.config import load_config
from controller.logs import configure_logging
from controller.targets import TargetsDoc
from service.core import ServiceCore
from service.server import GovernorServer, serve
from service.store import FileStore
from tests.service.fakes import FakeSource


class FileRates(FakeSource):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def observe(self, models: Any, now_s: float) -> dict[str, Any]:
        try:
            rates = json.loads(self.path.read_text())
        except (OSError, ValueError):
            rates = dict(self.rates)
        for name, rate in rates.items():
            self.set(name, rate)
        return super().observe(models, now_s)


class SlowFileStore(FileStore):
    def __init__(self, path: Path, delay_s: float, marker: Path | None) -> None:
        super().__init__(path)
        self.delay_s = delay_s
        self.marker = marker
        self.armed = False  # set after the targets are seeded through this store

    def save_targets(self, doc: TargetsDoc, expected_revision: str | None) -> str:
        if self.armed and self.delay_s > 0 and self.marker is not None:
            import traceback

            self.marker.write_text("".join(traceback.format_stack()))
            time.sleep(self.delay_s)  # simulates a slow store: the call stays in flight
        return super().save_targets(doc, expected_revision)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--state-file", required=True)
    p.add_argument("--rates-file", required=True)
    p.add_argument("--slow-save-s", type=float, default=0.0)
    p.add_argument("--marker")
    p.add_argument("--grace-s", type=float, default=8.0)
    args = p.parse_args()
    configure_logging("warning")
    cfg = load_config(args.config)
    store = SlowFileStore(
        Path(args.state_file), args.slow_save_s, Path(args.marker) if args.marker else None
    )
    core = ServiceCore(cfg, FileRates(Path(args.rates_file)), store)
    core.seed_targets()  # the start-up's save, before the store is slowed
    store.armed = True
    server = GovernorServer(
        core,
        grpc_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        allow_unauthenticated_admin=True,  # loopback test server; tests/faults checks auth
    )
    return serve(server, args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
