"""The real-engine world, started once per test session (module `realengine`).

One vLLM engine (started with `governor engine-args --live`), one Prometheus scraping it,
one `governor run` reading that Prometheus: engine start-up dominates (~50 s idle, more on
a loaded machine), so every engine test shares this world. Where the engine cannot run,
every test that needs it SKIPS with the reason (missing CPU feature, failed install).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.engine.realengine import EngineUnavailable, EngineWorld, start_world
from tests.engine.recorded import keep_recording
from tests.engine.test_real_engine import OUT, ROOT

RECORDED = ROOT / "out" / "recorded"
"""Where the suite leaves its capacity run recorded (tests/engine/recorded.py): copy
the two files into tests/engine/data/runs to keep it."""


@pytest.fixture(scope="session")
def engine_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineWorld]:
    """Engine + Prometheus + governor (see the module docstring). When the world has
    stopped, its capacity run (if out/engine.json holds one of this world) is recorded
    into out/recorded/ (`ci-` under CI, else `local-`), so a run worth keeping needs no
    copy of pytest's temporary folder."""
    try:
        with start_world(tmp_path_factory.mktemp("engine")) as world:
            yield world
    except EngineUnavailable as exc:
        pytest.skip(f"real vLLM engine unavailable: {exc}")
    keep_recording(OUT, world.workdir, RECORDED, "ci" if os.environ.get("CI") else "local")
