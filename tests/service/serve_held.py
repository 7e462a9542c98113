"""A governor process whose tick can be held while holding the interpreter lock, for the
serving-process tests: `python -m tests.service.serve_held --serving MODE --arm-fd A
--entered-fd E --release-fd R`.

Everything but the source is production code (ServiceCore, GovernorServer with its
ticker, `serve`). The source answers a fixed rate for the model `demo`; once the test
writes a byte to the arm pipe, the next observation writes a byte to the entered pipe
and then blocks in `read(2)` on the release pipe through `ctypes.PyDLL`, which keeps
the GIL for the whole wait: nothing else in this interpreter runs until the test
writes to the release pipe (a tick of 1,000 models holds it in the same way, for about
a second, while it decodes and decides).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from collections.abc import Sequence
from typing import Any

from controller.logs import configure_logging
from estimators.types import ModelQuery
from service.core import ServiceCore
from service.server import GovernorServer, serve
from service.store import MemoryStore
from tests.service.fakes import FakeSource, make_config, model_entry


class HeldSource(FakeSource):
    """FakeSource that holds one observation, GIL held, once armed (module doc)."""

    def __init__(self, arm_fd: int, entered_fd: int, release_fd: int) -> None:
        super().__init__({"demo": 20.0})
        self.arm_fd, self.entered_fd, self.release_fd = arm_fd, entered_fd, release_fd
        os.set_blocking(arm_fd, False)
        self._read = ctypes.PyDLL(None).read  # PyDLL: the GIL stays held in the call
        self._read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, Any]:
        try:
            armed = bool(os.read(self.arm_fd, 1))
        except BlockingIOError:
            armed = False
        if armed:
            os.write(self.entered_fd, b"x")
            buf = ctypes.create_string_buffer(1)
            self._read(self.release_fd, buf, 1)
        return super().observe(models, now_s)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--serving", default="process")
    p.add_argument("--arm-fd", type=int, required=True)
    p.add_argument("--entered-fd", type=int, required=True)
    p.add_argument("--release-fd", type=int, required=True)
    args = p.parse_args()
    configure_logging("info")
    cfg = make_config(model_entry("demo"), tick_interval_s=0.2)
    core = ServiceCore(
        cfg, HeldSource(args.arm_fd, args.entered_fd, args.release_fd), MemoryStore()
    )
    server = GovernorServer(
        core,
        grpc_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        allow_unauthenticated_admin=True,  # loopback test server
        serving=args.serving,
        log_level="info",
    )
    return serve(server, 5.0)


if __name__ == "__main__":
    sys.exit(main())
