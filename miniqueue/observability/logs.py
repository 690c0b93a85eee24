"""Logging for miniqueue's processes: one line per record on stderr, naming the process (its
label and pid), as text or as JSON objects."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from ..core.process import label


class _LabelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.mq_process = label()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601 UTC, ``2026-01-02T09:30:00.123Z``), level,
    process label and pid, logger, message; and ``job`` (id, task, queue, attempt,
    max_attempts, outcome, error) on the line a failed attempt leaves."""

    def format(self, record: logging.LogRecord) -> str:
        # UTC with its "Z": a log shipper must not guess the host's time zone.
        moment = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        entry = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "process": getattr(record, "mq_process", label()),
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        job = getattr(record, "job", None)
        if job is not None:
            entry["job"] = job
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Log to stderr, each line naming the process (label and pid): as text, or as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_LabelFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s [%(mq_process)s %(process)d] %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
