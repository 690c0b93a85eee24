"""Autoscaling's decisions without processes: a backlog, a rate and the host's CPU in, one worker
more, fewer or as many out (see docs/operations/autoscaling.md)."""

from __future__ import annotations

import math
import re

import pytest
from click.testing import CliRunner

from miniqueue.cli import main
from miniqueue.core.errors import ConfigError
from miniqueue.core.scaling import (
    Autoscaler,
    Backlog,
    RateMeter,
    Reading,
    drain_seconds,
    parse_cpu_ceiling,
    parse_workers,
)
from miniqueue.supervise import reports

EMPTY = Backlog(due=0, walked=0, oldest_seconds=0.0, running=0)


def backlog(due: int, oldest: float = 0.0, running: int = 0) -> Backlog:
    return Backlog(due=due, walked=due, oldest_seconds=oldest, running=running)


def reading(due: int = 0, *, rate: float = 0.0, workers: int = 1, busy: int = 0, cpu: float = 0.2) -> Reading:
    return Reading(backlog(due), rate, workers, busy, cpu)


@pytest.mark.parametrize(
    ("text", "parsed"), [("4", (4, None)), ("1:4", (1, 4)), ("2:16", (2, 16)), ("3:3", (3, 3)), (" 2 : 5 ", (2, 5))]
)
def test_workers_is_a_number_or_a_range(text: str, parsed: tuple[int, int | None]) -> None:
    assert parse_workers(text) == parsed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("4:2", "MIN (4) is above MAX (2)"),
        ("0:0", "both ends of MIN:MAX are at least 1"),
        ("0:3", "both ends of MIN:MAX are at least 1"),
        ("0", "run at least 1 worker process"),
        ("a:b", "use a number (4) or a range MIN:MAX"),
        ("2:", "use a number (4) or a range MIN:MAX"),
        ("1:2:3", "use a number (4) or a range MIN:MAX"),
    ],
)
def test_a_bad_range_is_a_clear_error(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"--workers .*{re.escape(says)}"):
        parse_workers(text)


@pytest.mark.parametrize(("target", "cooldown"), [(-1.0, 30.0), (0.0, 30.0), (math.nan, 30.0), (30.0, -1.0)])
def test_a_bad_target_or_cooldown_is_a_clear_error(target: float, cooldown: float) -> None:
    with pytest.raises(ConfigError, match=r"--scale-(target|cooldown) .* is invalid"):
        Autoscaler(1, 4, target, cooldown)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", "4:2"], "Invalid value for '--workers': '4:2': MIN (4) is above MAX (2)"),
        (["--workers", "0:0"], "Invalid value for '--workers': '0:0': both ends of MIN:MAX are at least 1"),
        (
            ["--workers", "1:4", "--scale-target", "-5"],
            "Invalid value for '--scale-target': -5.0 is not in the range x>0",
        ),
        (["--workers", "1:4", "--scale-cooldown", "-1"], "Invalid value for '--scale-cooldown'"),
        (["--workers", "1:4", "--scale-cpu-ceiling", "1.5"], "Invalid value for '--scale-cpu-ceiling': '1.5'"),
    ],
)
def test_a_bad_scaling_option_stops_the_supervisor_before_anything_starts(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, ["supervise", "--app", "tests.apps.supervised:app", *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert "starting" not in result.output


def test_the_cpu_ceiling_is_a_share_or_off() -> None:
    assert parse_cpu_ceiling("0.8") == 0.8 and parse_cpu_ceiling("OFF") == math.inf
    for bad in ("0", "1.5", "-1", "most"):
        with pytest.raises(ConfigError, match="--scale-cpu-ceiling"):
            parse_cpu_ceiling(bad)


def test_time_to_drain_is_the_due_jobs_over_the_rate() -> None:
    assert drain_seconds(backlog(4000), 40.0) == 100.0
    assert drain_seconds(EMPTY, 0.0) == 0.0
    assert drain_seconds(backlog(1), 0.0) == math.inf


def test_a_backlog_that_would_drain_past_the_target_adds_a_worker() -> None:
    scaler = Autoscaler(1, 4, target=30)
    decision = scaler.decide(reading(4000, rate=45.0, workers=1, busy=1), now=10.0)
    assert decision.change == +1
    assert "4,000 due (89s to drain at 45 jobs/s; target 30s)" in decision.reason


def test_one_that_drains_within_the_target_adds_none() -> None:
    assert Autoscaler(1, 4, target=30).decide(reading(100, rate=45.0, busy=1), now=10.0).change == 0


def test_the_oldest_job_waiting_past_the_target_adds_a_worker_whatever_the_rate() -> None:
    scaler = Autoscaler(1, 4, target=30)
    decision = scaler.decide(Reading(backlog(10, oldest=45.0), 1000.0, 1, 1, 0.2), now=10.0)
    assert decision.change == +1 and "the oldest due 45s" in decision.reason


def test_jobs_due_and_none_finished_yet_adds_a_worker() -> None:
    decision = Autoscaler(1, 4).decide(reading(5, rate=0.0), now=10.0)
    assert decision.change == +1 and "no job finished lately" in decision.reason


def test_at_start_no_rate_yet_is_not_read_as_no_job_finishing() -> None:
    scaler = Autoscaler(1, 4, target=30)
    starting = Reading(backlog(4000), 0.0, 1, 1, 0.2, measured_for=1.0)
    assert scaler.decide(starting, now=1.0)[::2] == (0, "starting")
    assert scaler.decide(starting._replace(measured_for=5.0), now=5.0).change == +1
    late = Reading(backlog(4000, oldest=31.0), 0.0, 1, 1, 0.2, measured_for=1.0)
    assert Autoscaler(1, 4, target=30).decide(late, now=1.0).change == +1, "jobs waiting past the target do not wait"


def test_a_saturated_cpu_holds_and_says_so() -> None:
    scaler = Autoscaler(1, 4, target=30)
    decision = scaler.decide(reading(4000, rate=45.0, workers=2, busy=2, cpu=0.97), now=10.0)
    assert (decision.change, decision.hold) == (0, "cpu")
    assert "the host's CPU is saturated (97% busy)" in decision.reason
    off = Autoscaler(1, 4, target=30, cpu_ceiling=parse_cpu_ceiling("off"))
    assert off.decide(reading(4000, rate=45.0, workers=2, busy=2, cpu=1.0), now=10.0).change == +1


def test_the_maximum_holds() -> None:
    decision = Autoscaler(1, 2).decide(reading(4000, rate=45.0, workers=2, busy=2), now=10.0)
    assert (decision.change, decision.hold) == (0, "maximum") and "at the maximum of 2" in decision.reason


def test_additions_are_spaced_so_that_a_new_worker_shows_in_the_rate() -> None:
    scaler = Autoscaler(1, 4, target=30, step=2.0)
    assert scaler.decide(reading(4000, rate=45.0), now=10.0).change == +1
    waiting = scaler.decide(reading(4000, rate=45.0, workers=2), now=11.0)
    assert (waiting.change, waiting.hold) == (0, "starting")
    assert scaler.decide(reading(4000, rate=45.0, workers=2), now=12.0).change == +1


def test_idle_workers_are_retired_one_at_a_time_after_the_cooldown_never_below_the_minimum() -> None:
    scaler = Autoscaler(1, 4, cooldown=30)
    assert scaler.decide(reading(4000, rate=90.0, workers=2, busy=2), now=0.0).change == +1
    assert scaler.decide(reading(0, rate=90.0, workers=3, busy=1), now=10.0).change == 0  # idle from here
    assert scaler.decide(reading(0, workers=3, busy=0), now=39.0).change == 0
    retired = scaler.decide(reading(0, workers=3, busy=0), now=40.0)
    assert retired.change == -1 and "nothing due and 3 of 3 idle for 30s" in retired.reason
    assert scaler.decide(reading(0, workers=2, busy=0), now=60.0).change == 0  # a cool-down since the last change
    assert scaler.decide(reading(0, workers=2, busy=0), now=70.0).change == -1
    assert scaler.decide(reading(0, workers=1, busy=0), now=200.0).change == 0  # the minimum


def test_busy_workers_are_not_idle_even_with_nothing_due() -> None:
    scaler = Autoscaler(1, 4, cooldown=5)
    for now in (0.0, 10.0, 20.0):
        assert scaler.decide(reading(0, rate=50.0, workers=3, busy=3), now=now).change == 0


def test_work_arriving_ends_the_idle_spell() -> None:
    scaler = Autoscaler(1, 4, cooldown=10)
    scaler.decide(reading(0, workers=2), now=0.0)
    scaler.decide(reading(3, rate=100.0, workers=2, busy=2), now=5.0)  # due again: not idle
    assert scaler.decide(reading(0, workers=2), now=12.0).change == 0  # idle only since 12
    assert scaler.decide(reading(0, workers=2), now=22.0).change == -1


def test_the_rate_is_the_jobs_finished_over_the_window() -> None:
    meter = RateMeter(window=5.0)
    assert meter.rate(0.0) == 0.0
    meter.add(0, 100.0)
    meter.add(50, 101.0)
    meter.add(50, 102.0)
    assert meter.rate(102.0) == 50.0  # 100 jobs over the 2 s since the meter started
    assert meter.rate(105.0) == 20.0  # over the whole window
    assert meter.rate(107.5) == 0.0  # the window has passed them


def test_the_reapers_reading_crosses_the_pipe_whole() -> None:
    sent = reports.BacklogReading(Backlog(due=4000, walked=4000, oldest_seconds=12.5, running=2), desired=3)
    assert reports.decode(reports.encode(sent).rstrip(b"\n")) == sent
    unread = reports.BacklogReading(EMPTY, desired=None)
    assert reports.decode(reports.encode(unread).rstrip(b"\n")) == unread
