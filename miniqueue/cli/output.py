"""What ``--json`` prints, and job ids shortened for one line of a table."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any


def to_json(value: Any) -> str:
    """``value`` as JSON text, timestamps in ISO 8601 (``2026-01-02T09:30:00.123456+00:00``)."""
    return json.dumps(value, default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)


def ids_line(ids: Sequence[int], shown: int = 10) -> str:
    """Job ids for one line: the first ``shown``, then how many more."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(map(str, ids[:shown])) + more
