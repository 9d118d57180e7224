"""A hand-written SVG of simulation runs: rate, batch size, processing/interval and lag per batch.

One row per scenario, four panels per row, one line per mode. No plotting library: plain SVG
elements, so it renders in a browser, on GitHub and in the README. Pure: no Airflow, Spark or
Kafka import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from .simulate import BatchRow, SimulationResult

PANEL_W, PANEL_H = 300, 150
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 58, 12, 26, 24
TITLE_H = 30
COLORS = {"spark": "#d9822b", "cost": "#2b6cb0"}
OTHER_COLOR = "#2f855a"


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def _ticks(top: float) -> list[float]:
    """About four round ticks from 0 to at least ``top``."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


Metric = tuple[str, Callable[[BatchRow, float], float | None]]

METRICS: tuple[Metric, ...] = (
    ("rate limit (records/s)", lambda r, b: r.rate if r.rate is not None and r.rate > 0 else None),
    ("batch size (records)", lambda r, b: float(r.records)),
    ("processing / interval", lambda r, b: r.ratio(b) if r.records > 0 else None),
    ("lag at plan (records)", lambda r, b: float(r.available)),
)


def _panel(
    x0: float,
    y0: float,
    title: str,
    series: Sequence[tuple[str, list[float | None]]],
    hlines: Sequence[tuple[float, str]],
) -> list[str]:
    plot_w, plot_h = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B
    values = [v for _, ys in series for v in ys if v is not None and math.isfinite(v)]
    top = max(values + [h for h, _ in hlines] + [0.0])
    ticks = _ticks(top * 1.05)
    y_max = ticks[-1]
    n = max((len(ys) for _, ys in series), default=1)
    left, bottom = x0 + MARGIN_L, y0 + MARGIN_T + plot_h

    def px(i: int) -> float:
        return left + (i / max(n - 1, 1)) * plot_w

    def py(v: float) -> float:
        return bottom - min(max(v, 0.0), y_max) / y_max * plot_h

    out = [f'<text x="{x0 + MARGIN_L}" y="{y0 + 16}" class="t">{escape(title)}</text>']
    for t in ticks:
        y = py(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="g"/>')
        out.append(f'<text x="{left - 4}" y="{y + 3:.1f}" class="a" text-anchor="end">{_fmt(t)}</text>')
    for i in (0, n - 1):
        out.append(f'<text x="{px(i):.1f}" y="{bottom + 14}" class="a" text-anchor="middle">{i + 1}</text>')
    for value, label in hlines:
        y = py(value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="h"/>')
        out.append(
            f'<text x="{left + plot_w - 2}" y="{y - 3:.1f}" class="a" text-anchor="end">{escape(label)}</text>'
        )
    for mode, ys in series:
        color = COLORS.get(mode, OTHER_COLOR)
        segments: list[list[str]] = [[]]
        for i, v in enumerate(ys):
            if v is None or not math.isfinite(v):
                if segments[-1]:
                    segments.append([])
                continue
            segments[-1].append(f"{px(i):.1f},{py(v):.1f}")
        for seg in segments:
            if seg:
                out.append(
                    f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.3"/>'
                )
    out.append(f'<rect x="{left}" y="{y0 + MARGIN_T}" width="{plot_w}" height="{plot_h}" class="f"/>')
    return out


def render_svg(
    rows: Sequence[tuple[str, Sequence[SimulationResult]]], *, target_ratio: float | None = None
) -> str:
    """One row of four panels per ``(title, results)``; each result is one mode's line."""
    width = 4 * PANEL_W
    height = len(rows) * (PANEL_H + TITLE_H) + 30
    modes = sorted({r.mode for _, results in rows for r in results})
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        "<style>.t{font-weight:bold}.a{fill:#555;font-size:9px}.g{stroke:#eee}.h{stroke:#999;stroke-dasharray:4 3}"
        ".f{fill:none;stroke:#bbb}.s{font-size:13px;font-weight:bold}</style>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    x = 8
    for mode in modes:
        color = COLORS.get(mode, OTHER_COLOR)
        out.append(f'<line x1="{x}" y1="14" x2="{x + 24}" y2="14" stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{x + 30}" y="18">mode {escape(mode)}</text>')
        x += 120
    for r_index, (title, results) in enumerate(rows):
        y0 = 30 + r_index * (PANEL_H + TITLE_H)
        out.append(f'<text x="8" y="{y0 + 16}" class="s">{escape(title)}</text>')
        for m_index, (label, value) in enumerate(METRICS):
            series = [
                (res.mode, [value(row, res.scenario.batch_interval_s) for row in res.rows]) for res in results
            ]
            hlines: list[tuple[float, str]] = []
            if label.startswith("processing"):
                hlines.append((1.0, "interval"))
                if target_ratio is not None:
                    hlines.append((target_ratio, f"target {target_ratio:g}"))
            out.extend(_panel(m_index * PANEL_W, y0 + TITLE_H - 8, label, series, hlines))
    out.append("</svg>")
    return "\n".join(out) + "\n"
