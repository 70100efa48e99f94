"""One torchrun launch for the 2-rank training jobs of every collected module.

A module that uses the ``two_rank_runs`` fixture defines ``two_rank_jobs(root) -> list[job]``
(``dist_worker.py`` jobs whose output_dirs lie under ``root``) and may set
``TWO_RANK_TIMEOUT_S`` (its jobs' share of the launch's time limit, 300 s unless set). The
jobs of all such modules selected in this session run in ONE ``dist_worker.py`` launch: each
rank imports torch and transformers and joins the process group once, not once per module.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from dist_helpers import TwoRankRuns, launch_two_rank_jobs


@pytest.fixture(scope="session")
def two_rank_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> TwoRankRuns:
    """Every selected module's 2-rank jobs, run once in one launch."""
    modules: dict[str, ModuleType] = {}
    for item in request.session.items:
        if "two_rank_runs" in getattr(item, "fixturenames", ()):
            module = item.module  # type: ignore[attr-defined]
            modules[module.__name__] = module
    return launch_two_rank_jobs(
        [modules[name] for name in sorted(modules)], tmp_path_factory.mktemp("two-rank-runs")
    )
