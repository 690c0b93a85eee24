"""A ready-made redact hook: mask the values of sensitive keys anywhere in a payload."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

MASK = "••••••"
DEFAULT_KEYS = ("password", "secret", "token", "api_key", "authorization", "credit_card")


def redact_keys(keys: Iterable[str] = DEFAULT_KEYS, mask: str = MASK) -> Callable[[Any], Any]:
    """A ``redact(payload) -> payload`` hook that replaces the value of every key whose name
    contains one of ``keys`` (case-insensitive), in nested objects and lists too."""
    needles = tuple(k.lower() for k in keys)

    def redact(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: mask if any(n in str(k).lower() for n in needles) else redact(v) for k, v in value.items()}
        if isinstance(value, list):
            return [redact(v) for v in value]
        return value

    return redact
