"""docs/deploy.md (the README's "Deploy" section) says only what the chart does: its values
file installs, its --set flags exist, its named templates are defined."""

from __future__ import annotations

import re

import yaml

from tests.helm.chart import CHART, ROOT, deep_merge, helm, render

DOC = (ROOT / "docs" / "deploy.md").read_text()


def _defined_templates() -> set[str]:
    names = set()
    for tpl in (CHART / "templates").glob("*.tpl"):
        names |= set(re.findall(r'define "([^"]+)"', tpl.read_text()))
    return names


def test_named_templates_in_the_docs_exist() -> None:
    used = set(re.findall(r'include "(llm-governor\.[^"]+)"', DOC))
    assert "llm-governor.sidecar.initContainers" in used
    assert used <= _defined_templates(), used - _defined_templates()


def _values_block() -> dict:
    m = re.search(r"```yaml\n# my-values.yaml\n(.*?)```", DOC, re.S)
    assert m, "the my-values.yaml example is gone"
    return yaml.safe_load(m.group(1))


def test_values_example_installs() -> None:
    objs = render(_values_block())
    assert any(o["kind"] == "ScaledObject" for o in objs)


def test_install_commands_use_existing_values() -> None:
    sets = re.findall(r"--set ([\w.]+=[\w.-]+)", DOC)
    assert {"scaling.via=kubernetes", "scaling.via=hpa", "mode=sidecar"} <= set(sets)
    base = _values_block()
    blocks = re.findall(r"```\n(helm install .*?)```", DOC, re.S)
    assert len(blocks) >= 4, "standalone, sidecar, direct scale and HPA installs"
    for commands in blocks:
        vals = base
        for expr in re.findall(r"--set ([\w.]+=[\w.-]+)", commands):
            vals = deep_merge(vals, helm.parse_set_string(expr))
        ns = re.search(r"--namespace (\S+)|-n (\S+)", commands)
        assert ns, commands
        # Renders (schema and template checks pass) with exactly the documented flags.
        assert render(vals, namespace=ns.group(1) or ns.group(2)), commands


def test_readme_deploy_section_is_this_file() -> None:
    """The README's "Deploy" section is docs/deploy.md verbatim (one text, two places)."""
    assert DOC in (ROOT / "README.md").read_text()


def test_deploy_doc_says_what_each_mode_does_without_the_governor() -> None:
    section = DOC.split("### When the governor is down, restarting or upgraded", 1)[1]
    section = section.split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == [
        "standalone, `keda`",
        "standalone, `hpa`",
        "standalone, `kubernetes`",
        "sidecar (any path)",
    ]
    assert "release: kube-prometheus-stack" in DOC


def _rbac_bullets() -> list[str]:
    """The sub-bullets of the Security section's RBAC item, one per scope."""
    m = re.search(r"\n- RBAC is namespaced.*?(?=\n- )", DOC, re.S)
    assert m, "the RBAC item is gone from the Security section"
    return m.group(0).split("\n  - ")[1:]


def test_rbac_doc_lists_every_rule_the_chart_grants() -> None:
    """Every Role rule the chart renders (any scaling path, either store mode) is in one
    of the RBAC item's sub-bullets with its resource and verbs; the pod rule that
    actuation.drainScaleIn adds is named with the value that removes it."""
    bullets = _rbac_bullets()
    assert bullets
    cases = [
        {},
        {"scaling": {"via": "kubernetes"}, "targets": {"managedByHelm": False}},
    ]
    seen = set()
    for over in cases:
        for role in (o for o in render(deep_merge(_values_block(), over)) if o["kind"] == "Role"):
            for rule in role["rules"]:
                words = [f"`{w}`" for w in (*rule["resources"], *rule["verbs"])]
                assert any(all(w in b for w in words) for b in bullets), (
                    f"docs/deploy.md's RBAC item does not list {rule}"
                )
                seen |= set(rule["resources"])
    assert "pods" in seen and "deployments/scale" in seen
    assert any("`actuation.drainScaleIn: false` removes the `pods` rule" in b for b in bullets)
    no_drain = render(deep_merge(_values_block(), {"actuation": {"drainScaleIn": False}}))
    pod_rules = [
        r for o in no_drain if o["kind"] == "Role" for r in o["rules"] if "pods" in r["resources"]
    ]
    assert not pod_rules
