"""Health checks for exec probes (``miniqueue healthcheck``)."""

from __future__ import annotations

import urllib.error
import urllib.request

from ..core.db import connect
from ..core.errors import MiniqueueError
from ..store.migrate import check_schema_version


def probe_url(url: str, timeout: float = 5.0) -> tuple[bool, str]:
    """GET ``url`` (a supervisor's /readyz or /livez): healthy on HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200, response.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read().decode(errors='replace').strip()}"
    except (urllib.error.URLError, OSError) as exc:
        return False, str(getattr(exc, "reason", exc))


def probe_database(dsn: str, timeout: float = 5.0, schema: str = "public") -> tuple[bool, str]:
    """Healthy when the database answers and its schema is up to date."""
    try:
        with connect(dsn, purpose="healthcheck", schema=schema, connect_timeout=max(1, round(timeout))) as conn:
            check_schema_version(conn, schema)
    except MiniqueueError as exc:
        return False, str(exc)
    return True, "database reachable, schema up to date"
