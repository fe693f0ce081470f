"""Medians, ratios and the issue's targets for ``bench/bench_peers.py``; its BENCHMARKS.md
section. Every figure is the median over the runs, each run listed beside it, so the noise
of a loaded machine shows rather than hides."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

# What issue 24 measured (CPU s per million records, msg/s; keyed wall s; retry drain s, p99 ms)
ISSUE: dict[str, dict[str, str]] = {
    "success": {
        "raw": "1.06 / 304k",
        "retryd": "3.23 / 106k",
        "spring": "5.50 (warm 3.50) / 163k",
        "quix-streams": "7.43 / 107k",
        "faststream-batch": "10.6 / 82k",
        "parallel-consumer": "56.9 / 15k",
        "faststream-message": "345 / 2k",
    },
    "keyed": {
        "retryd@16": "1.64 s",
        "parallel-consumer@16": "2.27 s",
        "retryd@64": "0.64 s",
        "parallel-consumer@64": "1.64 s",
    },
    "retry": {"retryd": "1.0 s, p99 7 ms", "spring": "40 s, p99 936 ms"},
}
# shape -> the per-run figures summarized by their median
FIGURES = {
    "success": ("cpu_s_per_million", "msgs_per_s", "warm_cpu_s_per_million", "warm_msgs_per_s"),
    "keyed": ("wall_s", "cpu_s_per_million", "msgs_per_s"),
    "retry": ("drain_s", "span_s", "p50", "p99", "max"),
}


def _flat(run: dict[str, Any]) -> dict[str, Any]:
    return {**run, **(run.get("lateness_ms") or {})}


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """shape -> system -> medians (and each run's value) of the shape's figures."""
    out: dict[str, Any] = {}
    for shape, by_system in results.items():
        for system, runs in by_system.items():
            flat = [_flat(r) for r in runs]
            row: dict[str, Any] = {
                "version": runs[-1].get("version"),
                "config": runs[-1].get("config"),
                "records": runs[-1].get("records"),
                "runs": len(runs),
            }
            for key in FIGURES.get(shape, ()):
                values = [r[key] for r in flat if r.get(key) is not None]
                if values:
                    row[key] = statistics.median(values)
                    row[f"{key}_runs"] = [round(v, 3) for v in values]
            if shape == "retry":
                early = [r.get("early") for r in runs if r.get("early") is not None]
                row["early"] = sum(early) if early else None
                mins = [r["min"] for r in flat if r.get("min") is not None]
                row["min"] = min(mins) if mins else None
            out.setdefault(shape, {})[system] = row
    return out


def _get(summary: dict[str, Any], shape: str, system: str, key: str) -> float | None:
    value = summary.get(shape, {}).get(system, {}).get(key)
    return None if value is None else float(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


# row -> (figure, shape, retryd's system, peer's system (None: an absolute), key, peer's key, op,
# target)
TARGETS: dict[str, tuple[str, str, str, str | None, str, str, str, float]] = {
    "success_cpu_vs_raw": (
        "success: retryd CPU per record ÷ the raw loop's",
        *("success", "retryd", "raw", "cpu_s_per_million", "cpu_s_per_million", "<=", 1.8),
    ),
    "success_cpu_vs_spring_warm": (
        "success: retryd CPU per record ÷ Spring's, warm",
        *("success", "retryd", "spring", "cpu_s_per_million", "warm_cpu_s_per_million"),
        *("<=", 0.5),
    ),
    "keyed_16_vs_parallel_consumer": (
        "keyed, 16 in flight: retryd wall ÷ Parallel Consumer's",
        *("keyed", "retryd@16", "parallel-consumer@16", "wall_s", "wall_s", "<=", 0.75),
    ),
    "keyed_64_vs_parallel_consumer": (
        "keyed, 64 in flight: retryd wall ÷ Parallel Consumer's",
        *("keyed", "retryd@64", "parallel-consumer@64", "wall_s", "wall_s", "<=", 0.75),
    ),
    "retry_p99_vs_spring": (
        "retry 1 s: retryd lateness p99 ÷ Spring @RetryableTopic's",
        *("retry", "retryd", "spring", "p99", "p99", "<=", 0.2),
    ),
    "retry_early": (
        "retry 1 s: retryd calls before their due time (every run)",
        *("retry", "retryd", None, "early", "early", "<=", 0),
    ),
}


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, (figure, shape, ours, peer, key, peer_key, op, target) in TARGETS.items():
        mine = _get(summary, shape, ours, key)
        theirs = _get(summary, shape, peer, peer_key) if peer else None
        measured = mine if peer is None else _ratio(mine, theirs)
        met = (
            None if measured is None else (measured <= target if op == "<=" else measured >= target)
        )
        rows.append(
            {
                "row": name,
                "figure": figure,
                "retryd": mine,
                "peer": theirs,
                "measured": None if measured is None else round(measured, 3),
                "target": f"{op} {target}",
                "met": met,
            }
        )
    return rows


def _met(row: dict[str, Any]) -> str:
    if row["met"] is None:
        return "not measured"
    return "met" if row["met"] else "not met"


def _n(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value / 1000:.0f}k" if abs(value) >= 10_000 else f"{value / 1000:.1f}k"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def tables(summary: dict[str, Any]) -> list[str]:
    """The three shapes as Markdown tables, retryd's figure compared with each system's."""
    lines: list[str] = []
    succ = summary.get("success", {})
    if succ:
        ours = _get(summary, "success", "retryd", "cpu_s_per_million")
        lines += [
            "**success** (CPU s per million records is the headline; warm: the second half of "
            "the run)",
            "",
            "| system | version | configuration | CPU s / 1M (median) | runs | msg/s | warm "
            "CPU s / 1M | warm msg/s | retryd CPU ÷ this | issue |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for system, r in succ.items():
            cpu = r.get("cpu_s_per_million")
            warm = r.get("warm_cpu_s_per_million")
            vs = _ratio(ours, cpu)
            vs_warm = _ratio(ours, warm)
            ratio = "-" if vs is None else f"{vs:.2f}x"
            if vs_warm is not None:
                ratio += f" (warm {vs_warm:.2f}x)"
            runs = ", ".join(_n(v) for v in r.get("cpu_s_per_million_runs", []))
            lines.append(
                f"| {system} | {r['version']} | {r['config']} | {_n(cpu)} | {runs} | "
                f"{_n(r.get('msgs_per_s'))} | {_n(warm)} | {_n(r.get('warm_msgs_per_s'))} | "
                f"{ratio} | {ISSUE['success'].get(system, '-')} |"
            )
        lines.append("")
    keyed = summary.get("keyed", {})
    if keyed:
        lines += [
            "**keyed** (key order kept, handler sleeping 0-5 ms; wall first → N-th handled)",
            "",
            "| system | in flight | version | wall s (median) | runs | msg/s | CPU s / 1M | "
            "issue |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for system, r in keyed.items():
            base, _, k = system.partition("@")
            runs = ", ".join(_n(v) for v in r.get("wall_s_runs", []))
            lines.append(
                f"| {base} | {k} | {r['version']} | {_n(r.get('wall_s'))} | {runs} | "
                f"{_n(r.get('msgs_per_s'))} | {_n(r.get('cpu_s_per_million'))} | "
                f"{ISSUE['keyed'].get(system, '-')} |"
            )
        lines.append("")
    retry = summary.get("retry", {})
    if retry:
        lines += [
            "**retry** (every record fails once, retried after 1 s; lateness = retried call "
            "minus due time; drain = first call to last retried call; span = first retried "
            "call to last)",
            "",
            "| system | version | configuration | drain s | retries span s | lateness p50 ms | "
            "p99 ms (runs) | max ms | min ms | early calls | issue |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for system, r in retry.items():
            runs = ", ".join(_n(v, 0) for v in r.get("p99_runs", []))
            lines.append(
                f"| {system} | {r['version']} | {r['config']} | {_n(r.get('drain_s'))} | "
                f"{_n(r.get('span_s'))} | {_n(r.get('p50'), 0)} | {_n(r.get('p99'), 0)} ({runs}) | "
                f"{_n(r.get('max'), 0)} | {_n(r.get('min'), 0)} | {_n(r.get('early'))} | "
                f"{ISSUE['retry'].get(system, '-')} |"
            )
        lines.append("")
    return lines


def target_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| target (issue 24) | retryd | peer | measured | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['figure']} | {_n(r['retryd'])} | {_n(r['peer'])} | {_n(r['measured'])} | "
            f"{r['target']} | {_met(r)} |"
        )
    return lines


def text(
    summary: dict[str, Any], rows: list[dict[str, Any]], notes: list[str], errors: list[dict]
) -> list[str]:
    """The console report: the same tables as the Markdown."""
    return [*tables(summary), *target_table(rows), *(f"note: {n}" for n in notes)] + [
        f"error: {e['shape']} {e['system']}: {e['error'][:300]}" for e in errors
    ]


HEADING = "## Peers (`bench/bench_peers.py`)"
INTRO = """retryd beside the raw confluent-kafka loop and its peers on one broker, as issue 24
measured them: `python bench/bench_peers.py` (`--quick`: tiny sizes, a check of the harness;
`--repeat`, `--shapes`, `--systems`). Records are produced before each consumer starts, on a
fresh topic per system per run; figures run from the first record handled to the N-th, CPU
of the system's whole process (all threads) over that span. Python peers run in environments
of their own (quix-streams pins confluent-kafka and pydantic below retryd's), each in its own
process; the Java peers through `bench/peers/java.py`. Runs alternate order; medians shown,
every run listed. The machine is shared and loaded (2 cores): read the runs' spread as the
noise."""


def _flat_row(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A bench_http row with its nested figures as ``outer.inner`` columns."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(_flat_row(value, f"{prefix}{key}."))
        elif isinstance(value, float):
            flat[f"{prefix}{key}"] = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def http_table(rows: list[dict[str, Any]]) -> list[str]:
    """bench_http's rows as one table: a column per figure any row has."""
    flat = [_flat_row(r) for r in rows]
    keys: list[str] = []
    for r in flat:
        keys += [k for k in r if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in flat]
    return lines


def write_markdown(path: Path, out: dict[str, Any]) -> None:
    """This broker kind's block between its markers under the Peers heading."""
    info = out["machine"]
    broker = info["broker"]
    begin, end = f"<!-- peers:{broker['kind']}:begin -->", f"<!-- peers:{broker['kind']}:end -->"
    sizes = out["sizes"]
    lines = [
        begin,
        f"### Peers on {broker['label']}",
        "",
        f"Machine: {info['cpus']} CPUs, {info['platform']}, Python {info['python']}, "
        f"confluent-kafka {info['confluent_kafka']} (librdkafka {info['librdkafka']}), retryd "
        f"{info['retryd_commit']}; broker JVM `{' '.join(broker.get('jvm_flags') or ['-'])}`; "
        f"load average at the start "
        f"{', '.join(str(x) for x in info['load_average_at_start'])}, at the end "
        f"{', '.join(str(x) for x in info['load_average_at_end'])}; {info['minutes']} min. "
        f"N = {sizes['success']:,} x 200 B on 6 partitions (FastStream per message: "
        f"{sizes['per_message']:,}: it commits each record), keyed {sizes['keyed']:,} on 50 keys, "
        f"retry {sizes['retry']:,}; {out['repeat']} runs each.",
        "",
        *tables(out["summary"]),
        *target_table(out["targets"]),
        "",
    ]
    if out.get("http"):
        lines += ["**http** (`bench/bench_http.py`)", "", *http_table(out["http"]), ""]
    lines += [f"- {n}" for n in out["notes"]]
    lines += [f"- error: {e['shape']} {e['system']}: {e['error'][:200]}" for e in out["errors"]]
    lines.append(end)
    block = "\n".join(lines)
    text_ = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text_:
        text_ = text_[: text_.index(begin)] + block + text_[text_.index(end) + len(end) :]
    elif HEADING in text_:
        cut = text_.index(HEADING) + len(HEADING)
        after = text_.find("\n## ", cut)
        at = len(text_) if after < 0 else after
        text_ = text_[:at].rstrip() + "\n\n" + block + "\n" + text_[at:]
    else:
        text_ = text_.rstrip() + f"\n\n{HEADING}\n\n{INTRO}\n\n{block}\n"
    path.write_text(text_)
