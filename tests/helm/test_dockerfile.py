"""The Dockerfile, checked statically (no container engine here): multi-stage, pinned base,
numeric non-root user equal to the chart's, ports and entry point the chart relies on, and
a build context (.dockerignore) that still holds everything `pip install .` needs."""

from __future__ import annotations

import fnmatch
import re
import tomllib

from tests.helm.chart import CHART, ROOT, container, one, render, values

DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def test_multi_stage_with_a_pinned_base() -> None:
    ins = _instructions()
    args = dict(a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)
    froms = [a for w, a in ins if w == "FROM"]
    assert len(froms) >= 2, "multi-stage: build and runtime"
    for f in froms:
        image = f.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        name, _, tag = image.partition(":")
        # An exact patch release and distribution (or a digest), never a moving tag.
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim-[a-z]+(@sha256:[a-f0-9]{64})?", tag), image
        assert name == "python", image
    runtime = _stages()[-1]
    copies = [a for w, a in runtime if w == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies), (
        "the runtime stage copies only the built virtualenv"
    )
    assert not any(w == "RUN" and "pip install" in a for w, a in runtime)


def test_runs_as_the_charts_numeric_non_root_user() -> None:
    users = [a for w, a in _stages()[-1] if w == "USER"]
    assert users, "no USER in the runtime stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, "runAsNonRoot can only verify a numeric user"
    dep = one(render(values()), "Deployment")
    sc = container(dep["spec"]["template"]["spec"], "governor")["securityContext"]
    assert (int(uid), int(gid)) == (sc["runAsUser"], sc["runAsGroup"])
    pod_sc = dep["spec"]["template"]["spec"]["securityContext"]
    assert int(uid) == pod_sc["runAsUser"]


def test_entrypoint_ports_and_bytecode_fit_the_chart() -> None:
    runtime = dict(_stages()[-1])
    assert runtime["ENTRYPOINT"] == '["governor"]'
    exposed = {int(p) for p in runtime["EXPOSE"].split()}
    chart_values = (CHART / "values.yaml").read_text()
    grpc = int(re.search(r"^\s+grpc: (\d+)$", chart_values, re.M).group(1))  # type: ignore[union-attr]
    metrics = int(re.search(r"^\s+metrics: (\d+)$", chart_values, re.M).group(1))  # type: ignore[union-attr]
    assert exposed == {grpc, metrics}
    # Read-only root filesystem: bytecode compiled at build time, never written at run time.
    text = DOCKERFILE.read_text()
    assert "compileall" in text and "PYTHONDONTWRITEBYTECODE=1" in text
    # The container's args start with the subcommand: the image's entry point is `governor`.
    dep = one(render(values()), "Deployment")
    gov = container(dep["spec"]["template"]["spec"], "governor")
    assert "command" not in gov and gov["args"][0] == "run"


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        parts = path.split("/")
        hit = any(
            fnmatch.fnmatch("/".join(parts[: i + 1]), pat)
            or fnmatch.fnmatch(parts[i], pat.removeprefix("**/"))
            for i in range(len(parts))
        )
        if hit:
            ignored = not negate
    return ignored


def test_build_context_holds_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for w, a in _stages()[0]:
        if w == "COPY" and not a.startswith("--from="):
            *srcs, _dest = a.split()
            sources += srcs
    assert sources
    for src in sources:
        path = src.rstrip("/")
        assert (ROOT / path).exists(), f"COPY {src}: not in the repository"
        assert not _ignored(path, patterns), f"COPY {src}: excluded by .dockerignore"
    # Every package `pip install .` builds is copied (pyproject's packages.find include).
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    includes = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {s.rstrip("/") for s in sources}
    for pattern in includes:
        pkg = pattern.rstrip("*")
        assert pkg in copied, f"package {pkg} is not copied into the build stage"
    assert pyproject["project"]["readme"] in copied
    # Local state never enters the context.
    for path in (".venv", ".git", "tests", "out", "controller/__pycache__"):
        assert _ignored(path, patterns), path
