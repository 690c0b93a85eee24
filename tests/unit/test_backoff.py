"""Backoff as a policy: exponential with full jitter, capped at 30 minutes (docs/guides/tasks.md),
and what a task publishes of it. No database: the delays whoever charges an attempt are
tests/db/test_retry.py's."""

from __future__ import annotations

import math
import random

import pytest

from miniqueue import App, default_backoff, exponential_backoff
from miniqueue.core.backoff import backoff_ceiling

THIRTY_MINUTES = 30 * 60.0


def test_default_backoff_is_bounded_per_attempt_and_capped() -> None:
    # As docs/guides/tasks.md states it: attempt 1 waits 0-2 s, 2 0-4 s, 3 0-8 s, 4 0-16 s, ..., never over 30 minutes.
    expected = {1: 2.0, 2: 4.0, 3: 8.0, 4: 16.0, 5: 32.0, 10: 1024.0, 11: THIRTY_MINUTES, 50: THIRTY_MINUTES}
    for attempt, ceiling in expected.items():
        assert backoff_ceiling(attempt) == ceiling
        delays = [default_backoff(attempt) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays), (attempt, max(delays))
    # Full jitter spreads over the whole range, not just near the ceiling.
    assert min(default_backoff(4) for _ in range(200)) < 8.0
    assert max(default_backoff(4) for _ in range(200)) > 8.0


def test_default_backoff_jitter() -> None:
    delays = [default_backoff(3) for _ in range(100)]
    assert len(set(delays)) >= 10


def test_huge_attempt_numbers_stay_capped() -> None:
    for attempt in (64, 1_000, 10_000, 2**40):
        assert backoff_ceiling(attempt) == THIRTY_MINUTES
        assert 0.0 <= default_backoff(attempt) <= THIRTY_MINUTES


def test_backoff_is_overridable() -> None:
    fast = exponential_backoff(base=0.01, cap=0.05)
    assert backoff_ceiling(1, base=0.01, cap=0.05) == 0.02
    assert backoff_ceiling(3, base=0.01, cap=0.05) == 0.05
    assert all(0.0 <= fast(attempt) <= 0.05 for attempt in range(1, 20) for _ in range(20))


def test_seeded_generator_makes_backoff_reproducible() -> None:
    one = exponential_backoff(rng=random.Random(42))
    two = exponential_backoff(rng=random.Random(42))
    assert [one(a) for a in range(1, 12)] == [two(a) for a in range(1, 12)]


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_attempts_count_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match=f"attempt {attempt} is invalid"):
        default_backoff(attempt)
    with pytest.raises(ValueError):
        backoff_ceiling(attempt)


@pytest.mark.parametrize(("base", "cap"), [(0.0, 60.0), (-1.0, 60.0), (1.0, 0.0), (1.0, -5.0)])
def test_base_and_cap_must_be_positive(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="must both be positive"):
        exponential_backoff(base=base, cap=cap)


@pytest.mark.parametrize(("base", "cap"), [(math.nan, 60.0), (1.0, math.nan)])
def test_base_and_cap_must_not_be_nan(base: float, cap: float) -> None:
    # NaN slips past `<= 0` checks and would make every delay NaN (an invalid interval in SQL).
    with pytest.raises(ValueError):
        exponential_backoff(base=base, cap=cap)


def test_a_task_publishes_its_exponential_backoff_only() -> None:
    app = App()
    app.task("a", backoff=exponential_backoff(base=0.5, cap=60))(lambda job: None)
    app.task("b", backoff=lambda attempt: 1.0)(lambda job: None)
    app.task("c")(lambda job: None)
    published = {d.task: (d.backoff_base, d.backoff_cap) for d in app.declarations()}
    assert published == {"a": (0.5, 60.0), "b": (None, None), "c": (1.0, THIRTY_MINUTES)}
