"""Line charts as small SVG documents, written by hand: a polyline per series, vertical lines at
marked instants (the faults), axes with a few ticks, a legend. No plotting library: the report
needs two charts, and a file a browser shows and a text editor reads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 30, 95
#: Series colours, in order; marks take theirs from MARK_COLOURS by kind, in order of appearance.
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b")
MARK_COLOURS = ("#ff7f0e", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#8c564b", "#9467bd", "#2ca02c", "#d62728")


@dataclass(frozen=True)
class Series:
    """One line: its name and its points (x, y); a None y breaks the line (no data there)."""

    name: str
    points: list[tuple[float, float | None]]


@dataclass(frozen=True)
class Mark:
    """An instant to mark with a vertical line: when, and its kind (the legend's entry)."""

    at: float
    kind: str
    label: str = ""


def chart(title: str, series: list[Series], marks: list[Mark], x_label: str, y_label: str) -> str:
    """An SVG document: ``series`` as polylines over a shared scale, ``marks`` as vertical lines."""
    xs = [x for s in series for x, _ in s.points] + [m.at for m in marks]
    ys = [y for s in series for _, y in s.points if y is not None]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    x1 = x1 if x1 > x0 else x0 + 1.0
    y1 = _nice(max(ys)) if ys and max(ys) > 0 else 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - y / y1 * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for tick in _ticks(0.0, y1):
        y = py(tick)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(tick)}</text>')
    for tick in _ticks(x0, x1):
        x = px(tick)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 4}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{_number(tick)}</text>')
    out.append(
        f'<polyline points="{LEFT},{TOP} {LEFT},{TOP + plot_h} {WIDTH - RIGHT},{TOP + plot_h}" '
        'fill="none" stroke="#333"/>'
    )
    kinds = list(dict.fromkeys(m.kind for m in marks))
    for mark in marks:
        colour = MARK_COLOURS[kinds.index(mark.kind) % len(MARK_COLOURS)]
        x = px(mark.at)
        tip = escape(f"{mark.kind} at {mark.at:.1f}s" + (f": {mark.label}" if mark.label else ""))
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="{colour}" '
            f'stroke-width="1" stroke-opacity="0.6"><title>{tip}</title></line>'
        )
    for index, line in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        for run in _runs(line.points):
            points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
            out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    x_middle = LEFT + plot_w / 2
    out.append(f'<text x="{x_middle:.1f}" y="{TOP + plot_h + 32}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text x="12" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2:.1f})">{escape(y_label)}</text>'
    )
    legend = [(line.name, COLOURS[i % len(COLOURS)], "line") for i, line in enumerate(series)]
    legend += [(kind, MARK_COLOURS[i % len(MARK_COLOURS)], "mark") for i, kind in enumerate(kinds)]
    x, y = float(LEFT), HEIGHT - 41
    for name, colour, shape in legend:
        width = 26 + 6.2 * len(name)
        if x + width > WIDTH - RIGHT and x > LEFT:  # the next legend row
            x, y = float(LEFT), y + 15
        if shape == "line":
            out.append(
                f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 14:.1f}" y2="{y - 4}" stroke="{colour}" stroke-width="2"/>'
            )
        else:
            out.append(f'<line x1="{x + 7:.1f}" y1="{y - 10}" x2="{x + 7:.1f}" y2="{y + 1}" stroke="{colour}"/>')
        out.append(f'<text x="{x + 18:.1f}" y="{y}">{escape(name)}</text>')
        x += width
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _runs(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """The stretches of a series between its gaps (a point of one is drawn as a tiny line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((x, y))
    return [run if len(run) > 1 else [run[0], (run[0][0] + 0.01, run[0][1])] for run in runs if run]


def _nice(value: float) -> float:
    """The round number at or above ``value`` an axis ends at (1, 2, 2.5 or 5 times a power of ten)."""
    power = 10.0 ** math.floor(math.log10(value))
    return float(next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value))


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values from ``lo`` to ``hi``, about ``count`` of them."""
    step = _nice((hi - lo) / count) if hi > lo else 1.0
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _number(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.2g}"
