"""A supervisor's ``/metrics`` (and its other probes) read in tests: answered, parsed into
samples, polled until a condition holds."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from .helpers import wait_until

#: Each sample's value by its name and labels.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(port: int, path: str = "/metrics", data: bytes | None = None) -> tuple[int, str]:
    """GET (or POST, with ``data``) ``path`` from the supervisor; return the status and body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", data=data, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> Samples:
    status, body = get(port)
    assert status == 200, body
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def scrape_until(port: int, predicate: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``predicate`` holds (counters follow the workers' reports by up to a tick)."""

    def check() -> Samples | None:
        samples = scrape(port)
        return samples if predicate(samples) else None

    samples = wait_until(check, timeout=10, what=what)
    assert samples is not None
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))
