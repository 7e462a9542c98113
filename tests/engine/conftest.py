"""The real-engine world, started once per test session (module `realengine`).

One vLLM engine (started with `governor engine-args --live`), one Prometheus scraping it,
one `governor run` reading that Prometheus: engine start-up dominates (~50 s idle, more on
a loaded machine), so every engine test shares this world. Where the engine cannot run,
every test that needs it SKIPS with the reason (missing CPU feature, failed install).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.realengine import EngineUnavailable, EngineWorld, start_world


@pytest.fixture(scope="session")
def engine_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineWorld]:
    """Engine + Prometheus + governor (see the module docstring)."""
    try:
        with start_world(tmp_path_factory.mktemp("engine")) as world:
            yield world
    except EngineUnavailable as exc:
        pytest.skip(f"real vLLM engine unavailable: {exc}")
