"""The kinds of value the command line reads (a JSON payload, seconds, a duration, a job id),
checked by click so that a wrong one is a usage error before anything reaches the database."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import click

from ..core.errors import ConfigError, InvalidInput
from ..core.scaling import parse_cpu_ceiling, parse_workers
from ..core.validation import JOB_ID_RANGE, parse_json


class JsonText(click.ParamType):  # type: ignore[type-arg]
    """A JSON document given on the command line (a payload)."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_json(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class _Scaling(click.ParamType):  # type: ignore[type-arg]
    """A setting of the autoscaler, read by ``parse`` (a value already read, a default, passes as
    it is); the rule it breaks is the usage error."""

    read: ClassVar[type]
    parse: Callable[[str], Any]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, self.read):
            return value
        try:
            return self.parse(str(value))
        except ConfigError as exc:
            self.fail(f"{value!r}: {str(exc).split(' is invalid: ', 1)[-1]}", param, ctx)


class WorkerCount(_Scaling):
    """``--workers``: a number, or ``MIN:MAX`` (autoscaling): ``(low, high or None)``."""

    name = "n|min:max"
    read = tuple
    parse = staticmethod(parse_workers)


class CpuCeiling(_Scaling):
    """``--scale-cpu-ceiling``: a busy share above 0 and at most 1, or ``off``."""

    name = "share|off"
    read = float
    parse = staticmethod(parse_cpu_ceiling)


class Seconds(click.FloatRange):
    """A number of seconds within a range (click's FloatRange lets NaN through: it compares false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as 90s, 30m, 24h, 7d or 2w."""

    name = "duration"
    UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        text = str(value).strip().lower()
        try:
            number, unit = (float(text[:-1]), text[-1]) if text[-1:] in self.UNITS else (float(text), "s")
        except ValueError:
            self.fail(f"{value!r} is not a duration: use a number with s, m, h, d or w (e.g. 7d)", param, ctx)
        if not number >= 0:
            self.fail(f"{value!r} is not a duration: it must not be negative", param, ctx)
        return number * self.UNITS[unit]


#: A job id: the column is a BIGINT from a sequence starting at 1, so anything else is a typo
#: (and a larger number would reach the database only to fail there).
JOB_ID = click.IntRange(*JOB_ID_RANGE)
