"""`free_port` never hands out one port twice in a test run.

The kernel may give the same ephemeral port to two binds in a row once the first socket
is closed; a test that took a gRPC and a metrics port that way rendered a chart that
(rightly) refused both on one port. The kernel is faked here so that it repeats a port.
"""

from __future__ import annotations

from types import TracebackType
from typing import ClassVar

import pytest

from tests.integration import promserver


class _RepeatingSocket:
    """A socket whose bind is always given the next port of a fixed list."""

    ports: ClassVar[list[int]] = []

    def __init__(self, *_args: object) -> None:
        self._port = self.ports.pop(0)

    def __enter__(self) -> _RepeatingSocket:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        return None

    def bind(self, _addr: tuple[str, int]) -> None:
        return None

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self._port)


def test_a_port_the_kernel_repeats_is_not_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(promserver, "_HANDED_OUT", set())
    monkeypatch.setattr(_RepeatingSocket, "ports", [40001, 40001, 40001, 40002])
    monkeypatch.setattr(promserver.socket, "socket", _RepeatingSocket)
    assert [promserver.free_port(), promserver.free_port()] == [40001, 40002]
