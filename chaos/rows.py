"""A line of the result table, and the two kinds of line: a rule and a reported figure."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    """One line of the result table; ``ok`` is None for figures that are not a rule."""

    label: str
    value: str
    rule: str = ""
    ok: bool | None = None
    offenders: list[str] = field(default_factory=list)


def rule(label: str, offenders: list[str], what: str = "must be 0", value: str | None = None) -> Row:
    """A rule that holds when nothing offends it; its value is the number of offenders unless given."""
    return Row(label, value if value is not None else str(len(offenders)), what, not offenders, offenders)


def info(label: str, value: object) -> Row:
    """A figure the table reports without judging it."""
    return Row(label, str(value))


def first_line(error: str | None) -> str:
    """An error recorded for an attempt, as one line: a traceback's last line, else the first."""
    if not error:
        return "no error recorded"
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
