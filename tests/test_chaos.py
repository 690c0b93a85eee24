"""The chaos harness's short form, as CI runs it: a real supervisor, real kills, a real restart.

It runs ``python -m chaos`` as a subprocess and trusts its verdict (exit code 0), then checks the
headline numbers from its JSON. The harness starts an embedded PostgreSQL of its own in this
test's temporary folder rather than using the session's ``server_dsn``: restarting PostgreSQL
mid-run (fast, then immediate) is part of the short form, and the session's server is shared
with other tests (or, under ``TEST_DATABASE_URL``, not ours to restart at all).

It runs twice: with the chaos task as a ``def`` handler, and as an ``async def`` one (``--async``,
4 coroutines per worker, so a kill lands on several at once). The async run is shorter (20 s of
chaos): every scenario is still injected, each one once early on, and the suite stays near its
minute and a half.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SHORT_FORM = ["--jobs", "300", "--workers", "4", "--duration", "30", "--kill-interval", "0.5", "1.5", "--seed", "1"]
ASYNC_FORM = ["--jobs", "300", "--workers", "4", "--duration", "20", "--kill-interval", "0.5", "1.5", "--seed", "1",
              "--async", "--concurrency", "4"]  # fmt: skip


@pytest.mark.timeout(150)
@pytest.mark.parametrize("form", [SHORT_FORM, ASYNC_FORM], ids=["def", "async-def"])
def test_short_chaos_run_loses_nothing_and_completes_nothing_twice(
    form: list[str], tmp_path: Path, repo_root: Path
) -> None:
    result_file = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, "-m", "chaos", *form, "--workdir", str(tmp_path / "run"), "--json", str(result_file)],
        cwd=repo_root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, f"chaos run failed:\n{run.stdout}\n--- stderr (tail)\n{run.stderr[-6000:]}"
    result = json.loads(result_file.read_text())
    assert result["options"]["async_handlers"] is ("--async" in form)
    assert result["enqueued"] == 300
    assert result["completed"] == 300
    assert result["lost"] == []
    assert result["completed_more_than_once"] == []
    assert result["duplicated_effects"] == []
    assert result["effect_mismatches"] == []
    assert result["unexplained"] == []
    assert result["process_problems"] == []
    faults = result["faults"]
    for scenario in ("kill-worker", "kill-reaper", "stop-worker", "terminate-backend", "kill-supervisor",
                     "two-supervisors"):  # fmt: skip
        assert faults.get(scenario, 0) >= 1, f"{scenario} was never injected: {faults}"
    assert faults.get("restart-postgres", 0) >= 2, f"expected a fast and an immediate restart: {faults}"
    assert any(stop["taken_over"] for stop in result["stops"]), f"no SIGSTOP outlived its lease: {result['stops']}"
