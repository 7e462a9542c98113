"""Config loading, validation messages, environment overrides and `governor check-config`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.config import ConfigError, load_config, load_yaml, parse_config
from service.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "governor.yaml"
MIN = {"models": [{"name": "m", "deployment": "m", "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50}}]}


def test_example_config_is_valid() -> None:
    cfg = load_config(EXAMPLE, environ={})
    assert [m.name for m in cfg.models] == ["meta-llama/Llama-3.1-8B-Instruct", "code-assistant"]
    code = cfg.model("code-assistant")
    assert cfg.policy_for(code).scale_down_stabilization_s == 600
    assert cfg.policy_for(cfg.models[0]).scale_down_stabilization_s == 300


def test_defaults_fill_in() -> None:
    cfg = parse_config(MIN, environ={})
    m = cfg.models[0]
    assert (m.namespace, m.replicas.min_replicas, m.replicas.max_replicas) == ("default", 1, 10)
    assert cfg.policy.tick_interval_s == 5.0 and cfg.policy.scale_down_stabilization_s == 300.0


def _problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(data, environ={})
    return exc.value.problems


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        pytest.param(
            {"sla": {"ttft_p95_ms": -5, "itl_p95_ms": 50}},
            "models[m].sla.ttft_p95_ms",
            id="negative-latency",
        ),
        pytest.param(
            {"replicas": {"min_replicas": 5, "max_replicas": 2}},
            "min_replicas (5) must be <= max_replicas (2)",
            id="min-gt-max",
        ),
        pytest.param(
            {"sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50, "itl_p99_ms": 3}},
            "models[m].sla.itl_p99_ms: unknown key",
            id="typo-key",
        ),
        pytest.param({"batching_policy": "fast"}, "models[m].batching_policy", id="bad-policy"),
        pytest.param({"deployment": "Bad_Name"}, "models[m].deployment", id="bad-k8s-name"),
        pytest.param(
            {"policy": {"tolerance_frac": 2}}, "models[m].policy.tolerance_frac", id="bad-override"
        ),
        pytest.param(
            {"fallback_replicas": 50}, "fallback_replicas (50) must be <=", id="fallback-over-max"
        ),
        pytest.param(
            {"policy": {"max_staleness_s": 60}},
            "models[m].policy: max_staleness_s is set in the global policy only",
            id="override-of-the-sources-staleness",
        ),
        pytest.param(
            {"policy": {"window_s": 120}},
            "models[m].policy: window_s is set in the global policy only",
            id="override-of-the-sources-window",
        ),
        pytest.param(
            {"policy": {"tick_interval_s": 2}},
            "models[m].policy: tick_interval_s is set in the global policy only",
            id="override-of-the-loops-tick",
        ),
        # vLLM refuses a token budget below max_num_seqs (found in review, session 15:
        # such bounds validated and the governor published 512 seqs / 384 tokens)
        pytest.param(
            {
                "knobs": {
                    "max_num_seqs_min": 512,
                    "default_max_num_seqs": 512,
                    "max_num_batched_tokens_max": 384,
                    "default_max_num_batched_tokens": 384,
                }
            },
            "max_num_batched_tokens_max (384) must be >= max_num_seqs_min (512)",
            id="no-valid-knob-pair",
        ),
        pytest.param(
            {"knobs": {"default_max_num_seqs": 512, "default_max_num_batched_tokens": 384}},
            "default_max_num_batched_tokens (384) must be >= default_max_num_seqs (512)",
            id="default-budget-below-seqs",
        ),
        pytest.param(
            {"policy": {"tolerance_frac": float("nan")}},
            "models[m].policy: tolerance_frac must be a finite number (got nan)",
            id="override-nan",
        ),
    ],
)
def test_invalid_model_fields_name_field_and_value(patch: dict, expected: str) -> None:
    data = {"models": [{**MIN["models"][0], **patch}]}
    problems = _problems(data)
    assert any(expected in p for p in problems), problems


def test_every_problem_is_reported_once() -> None:
    data = {
        "models": [
            {
                "name": "m",
                "deployment": "m",
                "sla": {"ttft_p95_ms": 0, "itl_p95_ms": -1},
                "replicsa": {},
            }
        ],
        "polcy": {},
    }
    problems = _problems(data)
    assert len(problems) == 4, problems
    joined = "\n".join(problems)
    for needle in (
        "ttft_p95_ms",
        "itl_p95_ms",
        "replicsa: unknown key",
        "polcy: unknown key",
        "(got 0)",
        "(got -1)",
    ):
        assert needle in joined


def test_duplicate_model_names_refused() -> None:
    problems = _problems({"models": [MIN["models"][0], MIN["models"][0]]})
    assert any("'m' appears more than once" in p for p in problems)


def test_two_models_on_one_deployment_refused() -> None:
    other = {**MIN["models"][0], "name": "m2"}  # same deployment and namespace
    problems = _problems({"models": [MIN["models"][0], other]})
    # a check across the document is its own message, no `<root>:` in front of it
    assert problems == [
        "models 'm' and 'm2' both scale deployment default/m (their decisions would fight over it)"
    ], problems
    moved = {**other, "namespace": "staging"}
    parse_config({"models": [MIN["models"][0], moved]})  # another namespace: another one


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys: `replicas:` twice dropped the first."""
    f = tmp_path / "dup.yaml"
    f.write_text(
        "models:\n  - name: m\n    deployment: m\n    sla: {ttft_p95_ms: 500, itl_p95_ms: 50}\n"
        "    replicas: {max_replicas: 4}\n    replicas: {max_replicas: 40}\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_config(f)
    assert "duplicate key 'replicas'" in exc.value.problems[0], exc.value.problems


def test_a_file_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "bin.yaml"
    f.write_bytes(b"models: []\n\xff\xfe")
    with pytest.raises(ConfigError) as exc:
        load_config(f)
    assert "not UTF-8 text (byte 0xff at offset 11)" in exc.value.problems[0]
    assert main(["check-config", str(f)]) == 2


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"sla": {"ttft_p95_ms": True, "itl_p95_ms": 50}}, "expected a number, got a boolean"),
        ({"replicas": {"min_replicas": True}}, "expected a number, got a boolean"),
        ({"sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50, "attainment_goal_frac": 1}}, "less than 1"),
        ({"replicas": {"max_replicas": 10_001}}, "less than or equal to 10000"),
        ({"knobs": {"max_num_seqs_max": 2**31}}, "less than or equal to 2147483647"),
        # another kind than the field's, per model (a Struct, `--policy`) or not: lax
        # mode read 1 and "yes" as true and "5" as 5, and the store kept them as sent
        ({"policy": {"knobs_live": 1}}, "knobs_live: expected true or false, got 1"),
        ({"policy": {"knobs_live": "yes"}}, "expected true or false, got 'yes'"),
        ({"policy": {"scale_down_stabilization_s": "5"}}, "expected a number, got a string"),
        ({"policy": {"no_data_ticks_before_fallback": "1000"}}, "expected a number"),
        ({"sla": {"ttft_p95_ms": "500", "itl_p95_ms": 50}}, "expected a number, got a string"),
    ],
)
def test_values_the_governor_cannot_run_on_are_refused(patch: dict, needle: str) -> None:
    """A boolean read as 1 (an SLA of 1 ms), a number or a string read as a boolean, a
    string read as a number; a goal of every request (no quantile to
    size for: every tick raised in decide and the model froze); counts past what the
    API's fields carry (a traceback in `target get`) or any fleet (10**6 replicas took
    one decide 2.7 s)."""
    problems = _problems({"models": [{**MIN["models"][0], **patch}]})
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize(
    ("prometheus", "needle"),
    [
        ({"namespace_label": "model_name"}, "namespace_label and model_label are both"),
        ({"namespace_label": "le"}, "invalid namespace label name 'le'"),
        ({"namespace_label": "kube-ns"}, "namespace_label"),
        ({"model_label": "governor_signal"}, "invalid model label name 'governor_signal'"),
    ],
)
def test_label_settings_the_queries_cannot_use_are_refused(prometheus: dict, needle: str) -> None:
    """A namespace label equal to the model label, or a label the queries write
    themselves (`le`, the signal tag), would garble every answer."""
    problems = _problems({**MIN, "prometheus": prometheus})
    assert any(needle in p for p in problems), problems


def test_namespace_label_defaults_and_can_be_turned_off() -> None:
    assert parse_config(MIN).prometheus.namespace_label == "namespace"
    off = parse_config({**MIN, "prometheus": {"namespace_label": None}})
    assert off.prometheus.namespace_label is None


def test_empty_and_non_mapping_files() -> None:
    assert any("models" in p for p in _problems({}))
    assert any("must be a mapping" in p for p in _problems([1, 2]))


def test_a_float_written_as_yaml_1_2_reads_as_a_number() -> None:
    """PyYAML (YAML 1.1) reads `5e2` and `1.5e3` as strings, which a number field refuses
    (not converted); the loader reads them as YAML 1.2 does, in the file, the environment
    overrides and the CLI's KEY=VALUE alike. Other strings stay strings."""
    text = yaml.safe_dump(MIN).replace("ttft_p95_ms: 500", "ttft_p95_ms: 5e2")
    assert "5e2" in text
    cfg = parse_config(load_yaml(text), environ={"GOVERNOR_POLICY__WINDOW_S": "1.2e2"})
    assert cfg.models[0].sla.ttft_p95_ms == 500.0 and cfg.policy.window_s == 120.0
    assert [load_yaml(t) for t in ("-2E-1", ".5e1", "e5", "1e", "v1e5")] == [
        -0.2,
        5.0,
        "e5",
        "1e",
        "v1e5",
    ]


def test_env_overrides_apply_and_validate() -> None:
    env = {
        "GOVERNOR_POLICY__TICK_INTERVAL_S": "10",
        "GOVERNOR_MODELS__0__REPLICAS__MAX_REPLICAS": "8",
        "OTHER": "x",
        # the CLI's own variables (no `__`): not config keys, never "unknown key"
        "GOVERNOR_ADMIN_TOKEN_FILE": "/etc/governor-admin/token",
        "GOVERNOR_SERVER": "localhost:50051",
        "GOVERNOR_FAULTS_OUT": "/tmp/out",
    }
    cfg = parse_config(yaml.safe_load(yaml.safe_dump(MIN)), environ=env)
    assert cfg.policy.tick_interval_s == 10.0 and cfg.models[0].replicas.max_replicas == 8
    with pytest.raises(ConfigError) as exc:
        parse_config(yaml.safe_load(yaml.safe_dump(MIN)), environ={"GOVERNOR_MODELS__3__NAME": "x"})
    assert "GOVERNOR_MODELS__3__NAME" in exc.value.problems[0]
    with pytest.raises(ConfigError) as exc:
        parse_config(
            yaml.safe_load(yaml.safe_dump(MIN)), environ={"GOVERNOR_POLICY__TOLERANCE_FRAC": "abc"}
        )
    assert "policy.tolerance_frac" in exc.value.problems[0]


def test_a_problem_an_env_override_made_names_the_variable() -> None:
    """A bad value from the environment was reported as the file's (`policy.window_s:
    ...` under the file's name): the operator looked in a file that does not hold it. A
    model's entry is named `models[NAME]` in the problem, its override by index."""
    env = {
        "GOVERNOR_POLICY__TOLERANCE_FRAC": "abc",
        "GOVERNOR_MODELS__0__SLA": "{ttft_p95_ms: -1, itl_p95_ms: 50}",
        "GOVERNOR_MODELS__0__REPLICAS__MAX_REPLICAS": "3",
    }
    data = yaml.safe_load(yaml.safe_dump(MIN))
    data["models"][0]["replicas"] = {"min_replicas": 5, "max_replicas": "x"}
    data["models"][0]["cold_start_s"] = -1
    with pytest.raises(ConfigError) as exc:
        parse_config(data, environ=env)
    problems = exc.value.problems
    assert any(
        p.startswith("policy.tolerance_frac")
        and p.endswith("(set by env GOVERNOR_POLICY__TOLERANCE_FRAC)")
        for p in problems
    ), problems
    assert any(
        p.startswith("models[m].sla.ttft_p95_ms")
        and p.endswith("(set by env GOVERNOR_MODELS__0__SLA)")
        for p in problems
    ), problems
    assert any("cold_start_s" in p and "set by env" not in p for p in problems), problems


def test_a_config_file_past_the_size_bound_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check-config /dev/zero` read until memory ran out; a file one byte past
    MAX_CONFIG_BYTES is refused, one at it is read (and judged as YAML)."""
    from controller.config import MAX_CONFIG_BYTES

    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    assert main(["check-config", str(big)]) == 2
    assert "larger than 4 MiB" in capsys.readouterr().err
    big.write_bytes(b"#" * MAX_CONFIG_BYTES)
    assert main(["check-config", str(big)]) == 2
    assert "larger than" not in capsys.readouterr().err
    assert main(["check-config", "/dev/zero"]) == 2
    assert "larger than 4 MiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("models: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        (
            "policy: {window_s: " + "9" * 5000 + "}\n",
            "a value it cannot read: Exceeds the limit (4300 digits)",
        ),
    ],
)
def test_yaml_past_the_parsers_limits_is_invalid_yaml(
    tmp_path: Path, text: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """RecursionError and ValueError (Python's 4,300-digit limit) escaped the YAML
    reader: a traceback from check-config, and every tick raised on such a targets
    ConfigMap (tests/service/test_stored_input.py)."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and needle in err and "Traceback" not in err


def test_check_config_cli_success(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "SUCCESS" in out and "code-assistant" in out and "ttft_p95=300ms" in out


def test_check_config_warns_of_scale_to_zero_without_an_ingress_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert doc["prometheus"]["ingress_rate_query"]  # the example scales code-assistant to 0
    assert "WARNING" not in (main(["check-config", str(EXAMPLE)]), capsys.readouterr().out)[1]
    del doc["prometheus"]["ingress_rate_query"]
    f = tmp_path / "no-ingress.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["check-config", str(f)]) == 0  # valid: `governor run` holds 0 at 1
    out = capsys.readouterr().out
    assert "WARNING: code-assistant: min_replicas 0 is held at 1" in out
    assert "prometheus.ingress_rate_query" in out and "Llama-3.1-8B-Instruct: min" not in out
    doc["prometheus"]["ingress_rate_query"] = "rate(gw_requests_total[1m])"
    f.write_text(yaml.safe_dump(doc))
    assert main(["check-config", str(f)]) == 2
    assert "must contain {window}" in capsys.readouterr().err


def test_check_config_cli_failure_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "models:\n  - name: m\n    deployment: m\n"
        "    sla: {ttft_p95_ms: -1, itl_p95_ms: 50}\n"
        "    replicas: {min_replicas: 3, max_replicas: 1}\n"
    )
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "FAILED" in err and "ttft_p95_ms" in err and "min_replicas (3)" in err


@pytest.mark.parametrize(
    "content", ["models: [", "\x00\x01", "- 1\n- 2\n"], ids=["bad-yaml", "binary", "list"]
)
def test_check_config_cli_garbage(tmp_path: Path, content: str) -> None:
    f = tmp_path / "g.yaml"
    f.write_text(content)
    assert main(["check-config", str(f)]) == 2


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_check_config_targets_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--targets`: a store's targets.yaml, validated as `governor run` applies stored
    targets (each entry alone, then the set with the file's global policy)."""
    entry = dict(MIN["models"][0])
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"models": [entry], "paused": ["m"]}))
    assert main(["check-config", str(EXAMPLE), "--targets", str(targets)]) == 0
    assert f"SUCCESS: {targets} is valid with it: 1 model(s), paused: m" in capsys.readouterr().out
    cases = [
        # an entry the governor refuses, named once (not again as an empty `models:`)
        (
            {"models": [{**entry, "knobs": {"max_num_seqs_max": 128}}]},
            "models[m].knobs: default_max_num_seqs (256) must lie in [8, 128]",
        ),
        # valid alone, refused as a set: a profile that does not load, an override
        # that empties the merged policy's limits
        ({"models": [{**entry, "profile": "no-such-profile"}]}, "profile 'no-such-profile'"),
        (
            {"models": [{**entry, "policy": {"scale_up_limits": []}}]},
            "scale_up_limits must hold at least one limit",
        ),
        ({"models": [entry], "paused": ["other"]}, "paused: 'other' is not a configured model"),
        ({"models": []}, "models: "),
    ]
    for doc, needle in cases:
        targets.write_text(yaml.safe_dump(doc))
        assert main(["check-config", str(EXAMPLE), "--targets", str(targets)]) == 2, doc
        err = capsys.readouterr().err
        assert f"FAILED: {targets}" in err and needle in err, err
        assert "Tuple should have at least 1 item" not in err or not doc["models"], err
    assert main(["check-config", str(EXAMPLE), "--targets", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err
