"""Bad command lines of `governor simulate`, `demo`, `engine-args` and the rest: each
exits 2 with a message naming the flag and what is wrong, before anything runs or is
written (each case here had ended in a traceback, or ran something else than asked)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from service.cli import main

_RUN = ["--trace", "synthetic:poisson", "--duration", "30", "--no-oracle"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(  # a pydantic traceback: the flag's bound is the config's
            ["simulate", *_RUN, "--max-replicas", "100000"],
            "--max-replicas: Input should be less than or equal to 10000",
            id="max-replicas",
        ),
        pytest.param(
            ["simulate", *_RUN, "--sla-ttft-p95-ms", "1e9"],
            "--sla-ttft-p95-ms: Input should be less than or equal to 600000",
            id="ttft-sla",
        ),
        pytest.param(
            ["simulate", *_RUN, "--sla-itl-p95-ms", "70000"],
            "--sla-itl-p95-ms: Input should be less than or equal to 60000",
            id="itl-sla",
        ),
        pytest.param(  # checked only with --policy-from before; the default has a window too
            ["simulate", *_RUN, "--scrape-interval-s", "31"],
            "--scrape-interval-s 31 is too slow for the governor's default policy: "
            "policy.window_s (60.0) must be >= 2 x",
            id="scrape-past-half-the-window",
        ),
        pytest.param(
            ["demo", "--trace", "synthetic:poisson", "--scrape-interval-s", "31"],
            "--scrape-interval-s 31 is too slow",
            id="demo-scrape",
        ),
        pytest.param(  # an IndexError in the oracle after the live run
            ["demo", "--trace", "synthetic:poisson:rate=0", "--speed", "0"],
            "--trace synthetic:poisson:rate=0: no requests",
            id="demo-without-requests",
        ),
        pytest.param(
            ["simulate", "--trace", "synthetic:step:at=5", "--no-oracle"],
            "synthetic:step: at must be a finite number in [0, 1], got 5",
            id="synthetic-parameter",
        ),
    ],
)
def test_a_flag_out_of_bounds_exits_2_naming_it(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    if argv[0] == "demo":
        argv = [*argv, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err
    assert not out.exists()


def test_the_scrape_bound_is_half_the_default_window() -> None:
    """30 s, two scrapes per the default 60 s window, is the slowest scrape the default
    policy runs under; the matrix's 30 s cells run with it."""
    from controller.config import ScalingPolicy
    from simulator.cli_args import policy_from_args

    args = argparse.Namespace(policy_from=None, policy_model=None)
    assert policy_from_args(args, [5.0, 15.0, 30.0]) == ScalingPolicy()
    with pytest.raises(ValueError, match=r"--scrape-interval-s 30\.5 is too slow"):
        policy_from_args(args, [15.0, 30.5])


def test_a_broken_trace_file_exits_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_tokens,output_tokens\n1,2\n")
    assert main(["simulate", "--trace", str(path), "--no-oracle"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: 2 field(s), the header has 3" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        pytest.param(["check-config", "--targets", "", "c.yaml"], "--targets", id="targets"),
        pytest.param(["check-config", " "], "file", id="config-file"),
        pytest.param(["simulate", "--json", ""], "--json", id="json"),
        pytest.param(["simulate", "--trace", ""], "--trace", id="trace"),
        pytest.param(["demo", "--out", ""], "--out", id="demo-out"),  # wrote into the cwd
        pytest.param(["engine-args", "--model", ""], "--model", id="engine-model"),
        pytest.param(["run", "--config", ""], "--config", id="run-config"),
        pytest.param(["status", "m", ""], "models", id="status-models"),
        pytest.param(["target", "get", " "], "model", id="target-get"),  # a nested command
        pytest.param(["target", "set", "m", "--file", ""], "--file", id="target-file"),
    ],
)
def test_an_empty_argument_is_refused_not_read_as_not_given(
    argv: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json ''`, `--targets ''`, `demo --out ''` read as "not given" (the output or
    the check silently skipped, the demo's files written into the working directory):
    every text argument means something, and an empty one is refused by name."""
    assert main(argv) == 2
    assert f": {name}: empty (give a value, or leave it out)" in capsys.readouterr().err


def test_an_empty_default_is_the_commands_own_to_judge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A default taken from the environment is not an argument given empty: a blank
    $POD_NAME is `run`'s own to report (service.run names the variable's flag)."""
    from service.cli import blank_arguments, build_parser

    monkeypatch.setenv("POD_NAME", "  ")
    parser = build_parser()
    cfg = tmp_path / "c.yaml"
    args = parser.parse_args(["run", "--config", str(cfg)])
    assert args.identity == "  " and blank_arguments(parser, args) == []
    assert main(["run", "--config", str(cfg)]) == 2
    assert "--identity must not be empty or blank (got '  ')" in capsys.readouterr().err
    args.identity = ""
    assert blank_arguments(parser, args) == ["--identity"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--plugin-dir", "/tmp/plugin"],
        ["--max-num-seqs-ceiling", "64"],
        ["--default-max-num-batched-tokens-ceiling", "8192", "--max-num-seqs-ceiling", "8"],
    ],
)
def test_engine_args_live_flags_without_live_are_refused(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The ceilings and --plugin-dir were ignored without --live: an engine started
    without the plugin it was meant to run. Exit 2 before any connection."""
    assert main(["engine-args", "--model", "m", "--server", "127.0.0.1:1", *flags]) == 2
    err = capsys.readouterr().err
    assert "read only with --live" in err and flags[0] in err
    assert "no answer from" not in err
