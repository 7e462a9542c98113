"""`governor run` refuses two listeners that would take one port, before anything starts:
0.0.0.0, :: and an empty host listen on every address, so 0.0.0.0:P and 127.0.0.1:P
collide as surely as two equal addresses (the second bind failed after the store was
opened, exit 1). So do two spellings of one address: localhost is 127.0.0.1 and ::1 (gRPC
listens on both), [0:0::1] is [::1], [::ffff:127.0.0.1] is 127.0.0.1."""

from __future__ import annotations

import pytest

from service.cli import build_parser, main
from service.run import _check_flags, _RunError


def _run_args(*extra: str) -> list[str]:
    return ["run", "--config", "missing.yaml", *extra]


@pytest.mark.parametrize(
    ("listens", "flags"),
    [
        (
            ["--grpc-listen", "0.0.0.0:50051", "--admin-listen", "127.0.0.1:50051"],
            ("--grpc-listen 0.0.0.0:50051", "--admin-listen 127.0.0.1:50051"),
        ),
        (
            ["--metrics-listen", "0.0.0.0:9464", "--admin-listen", "127.0.0.1:9464"],
            ("--metrics-listen 0.0.0.0:9464", "--admin-listen 127.0.0.1:9464"),
        ),
        (
            ["--grpc-listen", "127.0.0.1:50051", "--admin-listen", "[::]:50051"],
            ("--grpc-listen 127.0.0.1:50051", "--admin-listen [::]:50051"),
        ),
        (
            ["--grpc-listen", "10.0.0.7:7000", "--metrics-listen", "[]:7000"],
            ("--grpc-listen 10.0.0.7:7000", "--metrics-listen []:7000"),
        ),
        (
            ["--grpc-listen", "10.0.0.7:7000", "--admin-listen", "[0:0::0]:7000"],
            ("--grpc-listen 10.0.0.7:7000", "--admin-listen [0:0::0]:7000"),
        ),
    ],
)
def test_a_wildcard_host_overlaps_any_host_on_its_port(
    listens: list[str], flags: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(listens, flags, capsys)


def _refused(listens: list[str], flags: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> str:
    """The start-up check's message refusing `listens` (exit 2, naming both `flags`)."""
    with pytest.raises(_RunError) as err:
        _check_flags(build_parser().parse_args(_run_args(*listens)))
    assert err.value.code == 2
    assert all(f in err.value.message for f in flags), err.value.message
    assert "give each its own port" in err.value.message
    # Through the command line: exit 2 naming both, before the config is even read.
    assert main(_run_args(*listens)) == 2
    assert flags[0] in capsys.readouterr().err
    return err.value.message


@pytest.mark.parametrize(
    ("listens", "flags"),
    [
        # localhost takes the port on 127.0.0.1 (the metrics server binds it first, then
        # gRPC's 127.0.0.1 failed) ...
        (
            ["--grpc-listen", "127.0.0.1:7000", "--metrics-listen", "localhost:7000"],
            ("--grpc-listen 127.0.0.1:7000", "--metrics-listen localhost:7000"),
        ),
        (
            ["--grpc-listen", "localhost:7000", "--admin-listen", "127.0.0.1:7000"],
            ("--grpc-listen localhost:7000", "--admin-listen 127.0.0.1:7000"),
        ),
        # ... and on ::1 (gRPC resolves localhost to both loopbacks and listens on each)
        (
            ["--grpc-listen", "localhost:7000", "--admin-listen", "[::1]:7000"],
            ("--grpc-listen localhost:7000", "--admin-listen [::1]:7000"),
        ),
        (
            ["--grpc-listen", "[::1]:7000", "--admin-listen", "localhost:7000"],
            ("--grpc-listen [::1]:7000", "--admin-listen localhost:7000"),
        ),
        # one name in another case, with the root's trailing dot
        (
            ["--grpc-listen", "LocalHost:7000", "--admin-listen", "localhost.:7000"],
            ("--grpc-listen LocalHost:7000", "--admin-listen localhost.:7000"),
        ),
        # one IPv6 address spelt two ways; an IPv4-mapped address is the IPv4 one
        (
            ["--grpc-listen", "[::1]:7000", "--admin-listen", "[0:0:0:0:0:0:0:1]:7000"],
            ("--grpc-listen [::1]:7000", "--admin-listen [0:0:0:0:0:0:0:1]:7000"),
        ),
        (
            ["--grpc-listen", "127.0.0.1:7000", "--admin-listen", "[::ffff:127.0.0.1]:7000"],
            ("--grpc-listen 127.0.0.1:7000", "--admin-listen [::ffff:127.0.0.1]:7000"),
        ),
    ],
)
def test_two_spellings_of_one_address_overlap(
    listens: list[str], flags: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "localhost is 127.0.0.1 and ::1" in _refused(listens, flags, capsys)


def test_equal_addresses_keep_their_message() -> None:
    with pytest.raises(_RunError) as err:
        _check_flags(
            build_parser().parse_args(
                _run_args("--grpc-listen", "127.0.0.1:7001", "--metrics-listen", "127.0.0.1:7001")
            )
        )
    assert err.value.message == (
        "--grpc-listen and --metrics-listen are both 127.0.0.1:7001: give each its own port"
    )


@pytest.mark.parametrize(
    "listens",
    [
        # distinct ports
        ["--grpc-listen", "0.0.0.0:50051", "--admin-listen", "127.0.0.1:50052"],
        # one port on two distinct specific hosts
        ["--grpc-listen", "127.0.0.1:7002", "--admin-listen", "10.0.0.7:7002"],
        # the two loopbacks are two addresses (each binds on its own)
        ["--grpc-listen", "127.0.0.1:7002", "--admin-listen", "[::1]:7002"],
        # localhost is 127.0.0.1 and ::1, not all of 127.0.0.0/8
        ["--grpc-listen", "localhost:7002", "--admin-listen", "127.0.0.2:7002"],
        # port 0: each listener is given a free port of its own
        ["--grpc-listen", "0.0.0.0:0", "--metrics-listen", "0.0.0.0:0", "--admin-listen", "[::]:0"],
    ],
)
def test_listeners_that_cannot_collide_pass(listens: list[str]) -> None:
    _check_flags(build_parser().parse_args(_run_args(*listens)))
