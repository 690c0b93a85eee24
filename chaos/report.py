"""The result table (stdout), the offending job ids under it, and the JSON copy."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .verify import Verdict

WIDTH_LABEL = 66
WIDTH_VALUE = 44


def table(title: list[str], verdict: Verdict) -> str:
    lines = [*title, ""]
    lines.append(f"{'check':<{WIDTH_LABEL}} {'value':<{WIDTH_VALUE}} rule")
    lines.append(f"{'-' * WIDTH_LABEL} {'-' * WIDTH_VALUE} {'-' * 16}")
    for row in verdict.rows:
        mark = "" if row.ok is None else ("ok" if row.ok else "FAIL")
        rule = f"{row.rule} {mark}".strip()
        lines.append(f"{row.label:<{WIDTH_LABEL}} {row.value:<{WIDTH_VALUE}} {rule}".rstrip())
    lines.append("")
    for row in verdict.rows:
        if row.ok is None and row.offenders:
            lines.append(f"note: {row.label.strip()}:")
            lines += [f"    {entry}" for entry in row.offenders]
    failed = [row for row in verdict.rows if row.ok is False]
    if not failed:
        lines.append("RESULT: PASS (every rule held)")
        return "\n".join(lines)
    lines.append(f"RESULT: FAIL ({len(failed)} rule(s) broken)")
    for row in failed:
        lines.append(f"- {row.label.strip()}: {len(row.offenders)}")
        for offender in row.offenders[:50]:
            lines.append(f"    {offender}")
        if len(row.offenders) > 50:
            lines.append(f"    ... and {len(row.offenders) - 50} more (see the JSON)")
    return "\n".join(lines)


def write_json(path: Path, title: list[str], verdict: Verdict, extra: dict[str, Any]) -> None:
    document = {
        "title": title,
        "ok": verdict.ok,
        "rows": [asdict(row) for row in verdict.rows],
        **verdict.data,
        **extra,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
