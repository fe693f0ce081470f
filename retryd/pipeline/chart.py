"""The report's PNG: dead letters per hour by dead reason, and the retry funnel.

Drawn with matplotlib's object API (no pyplot, no global backend), so it works headless.
Returns the plotted numbers so callers and tests can check what the picture shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def render_chart(dead_letters: pd.DataFrame, funnel: pd.DataFrame, path: Path) -> dict[str, Any]:
    from matplotlib.figure import Figure

    per_hour: dict[str, dict[str, int]] = {}
    known = dead_letters.dropna(subset=["hour"])
    for row in known.itertuples(index=False):
        reason = str(row.dead_reason) if row.dead_reason is not None else "unknown"
        hour = row.hour.strftime("%Y-%m-%d %H:00")
        bucket = per_hour.setdefault(reason, {})
        bucket[hour] = bucket.get(hour, 0) + int(row.count)
    hours = sorted({h for counts in per_hour.values() for h in counts})
    tiers = [str(t) for t in funnel["tier"]]
    messages = [int(v) for v in funnel["messages"]]
    reached = [int(v) for v in funnel["reached_failed"]]

    fig = Figure(figsize=(12, 5), dpi=100, layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    bottom = [0] * len(hours)
    for reason in sorted(per_hour):
        heights = [per_hour[reason].get(h, 0) for h in hours]
        ax1.bar(range(len(hours)), heights, bottom=bottom, label=reason)
        bottom = [b + v for b, v in zip(bottom, heights, strict=True)]
    ax1.set_xticks(range(len(hours)), hours, rotation=45, ha="right", fontsize=8)
    ax1.set_title("Dead letters per hour (UTC) by dead reason")
    ax1.set_ylabel("dead letters")
    if per_hour:
        ax1.legend()
    xs = range(len(tiers))
    ax2.bar([x - 0.2 for x in xs], messages, width=0.4, label="reached this stage")
    ax2.bar([x + 0.2 for x in xs], reached, width=0.4, label="of those, reached failed_topic")
    for x, value in zip(xs, messages, strict=True):
        ax2.annotate(str(value), (x - 0.2, value), ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(list(xs), tiers, rotation=20, ha="right", fontsize=8)
    ax2.set_title("Retry funnel (distinct messages)")
    ax2.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return {
        "per_hour": per_hour,
        "funnel": {t: (m, r) for t, m, r in zip(tiers, messages, reached, strict=True)},
    }
