"""``retryd share-lag``: the share group's offsets and lag, as the share workers report them.

The same figures as ``retryd_consumer_lag{share_group=...}`` and the same columns as
``kafka-share-groups.sh --describe --offsets`` (which reads the same DescribeShareGroupOffsets
response), for an operator without the Kafka distribution at hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from retryd.cli.app import BootstrapOption, ConfigOption, app, settings_or_exit
from retryd.errors import KafkaRuntimeError


@app.command("share-lag")
def share_lag(
    config: Path | None = ConfigOption,
    bootstrap_servers: str | None = BootstrapOption,
    group: str | None = typer.Option(
        None, "--group", help="the share group (default: <group_id>.share)"
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per partition"),
    timeout: float = typer.Option(10.0, "--timeout", help="seconds per request"),
) -> None:
    """Print each partition's share-partition start offset and lag (consumer_mode = share).

    LAG is the broker's (Kafka 4.2+), else high watermark - start offset; ``-`` where the
    group holds no state yet. Exit 1 when the offsets cannot be read (the message names
    ``kafka-share-groups.sh`` when retryd cannot read them with this configuration): a broker
    error, a failed connection or an answer that does not decode (``WireError``), or the
    admin client's high-watermark request failing, all a one-line message, not a traceback.
    """
    from confluent_kafka import KafkaException

    from retryd.kafka.clients import common_config
    from retryd.kafka.share_offsets import ShareOffsetsClient
    from retryd.share.lag import ShareLagReader, lags_of
    from retryd.worker.events import NullSink

    overrides = {"bootstrap_servers": bootstrap_servers} if bootstrap_servers else {}
    settings = settings_or_exit(config, **overrides)
    common = common_config(settings)
    name = group or settings.share_group_id
    try:
        offsets = ShareOffsetsClient(common, name, timeout_s=timeout).describe()
        need = [p for p in offsets if p.lag < 0 and p.start_offset >= 0 and not p.error_code]
        reader = ShareLagReader(common, name, [], NullSink(), timeout_s=timeout)
        lags = lags_of(offsets, reader.high_watermarks(need) if need else {})
    except (KafkaRuntimeError, KafkaException) as exc:
        typer.echo(f"retryd: share group {name}: {exc}", err=True)
        raise typer.Exit(1) from None
    if not offsets:
        typer.echo(f"share group {name} has no offsets (it does not exist, or read nothing yet)")
        return
    rows = [
        {
            "group": name,
            "topic": p.topic,
            "partition": p.partition,
            "start_offset": p.start_offset if p.start_offset >= 0 else None,
            "lag": lags.get((p.topic, p.partition)),
            "error": p.error_message or (p.error_code or None),
        }
        for p in offsets
    ]
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    cells = [["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]]
    for row in rows:
        cells.append(
            [
                str(row["group"]),
                str(row["topic"]),
                str(row["partition"]),
                "-" if row["start_offset"] is None else str(row["start_offset"]),
                "-" if row["lag"] is None else str(row["lag"]),
            ]
        )
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    for c in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
