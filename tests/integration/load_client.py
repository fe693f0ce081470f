"""A load generator for the liveness test, run as its own process (so its CPU use does not
delay the measuring client): keeps ``--readyz`` + ``--failed`` broker-bound requests in flight
against a sidecar for ``--seconds``, each connection sending its next request as soon as the
last one is answered, or, after a 503 with ``Retry-After``, that many seconds later as an HTTP
client should (``--ignore-retry-after``: at once, a request flood). Plain HTTP/1.1 over asyncio
streams: a full HTTP client costs more CPU per request than the server spends answering, and
would measure the client. Prints a JSON summary on stdout.

    python -m tests.integration.load_client PORT TOKEN --readyz 100 --failed 100 --seconds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter


async def _worker(
    port: int, path: str, token: str, until: float, counts: Counter[str], honor: bool
) -> None:
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.monotonic() < until:
            writer.write(request)
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            status = head.split(" ", 2)[1]
            length = next(
                int(line.split(":", 1)[1])
                for line in head.split("\r\n")
                if line.startswith("content-length:")
            )
            body = await reader.readexactly(length)
            retry = next(
                (
                    line.split(":", 1)[1]
                    for line in head.split("\r\n")
                    if line.startswith("retry-after:")
                ),
                None,
            )
            error = json.loads(body).get("error", "") if status != "200" else ""
            counts[f"{path.split('?')[0]} {status} {error}{' retry-after' if retry else ''}"] += 1
            if retry is not None and honor:
                await asyncio.sleep(min(float(retry), max(0.0, until - time.monotonic())))
    except (OSError, asyncio.IncompleteReadError, StopIteration) as exc:
        counts[f"{path} {exc.__class__.__name__}"] += 1
    finally:
        writer.close()


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    writer.write(request)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    length = next(
        int(line.split(":", 1)[1])
        for line in head.split("\r\n")
        if line.startswith("content-length:")
    )
    await reader.readexactly(length)
    return int(head.split(" ", 2)[1])


async def probe_latencies(port: int, seconds: float, interval: float = 0.025) -> list[float]:
    """Seconds each ``GET /healthz`` took, one sent every ``interval`` whether or not the ones
    before were answered (a stalled server shows as many slow probes, not one), on kept-alive
    connections (a new one is opened, and its connect time counted, only when all are busy)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(4):
        idle.append(await asyncio.open_connection("127.0.0.1", port))
    latencies: list[float] = []

    async def one() -> None:
        started = time.perf_counter()
        conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
        status = await _exchange(*conn, request)
        latencies.append(time.perf_counter() - started)
        assert status == 200, status
        idle.append(conn)

    tasks = []
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while next_at < end:
        tasks.append(asyncio.create_task(one()))
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return sorted(latencies)


async def main(args: argparse.Namespace) -> dict[str, object]:
    counts: Counter[str] = Counter()
    until = time.monotonic() + args.seconds
    paths = ["/readyz"] * args.readyz + ["/v1/failed?limit=1"] * args.failed
    started = time.monotonic()
    honor = not args.ignore_retry_after
    await asyncio.gather(*(_worker(args.port, p, args.token, until, counts, honor) for p in paths))
    return {"seconds": round(time.monotonic() - started, 2), "responses": dict(counts)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("token")
    parser.add_argument("--readyz", type=int, default=100)
    parser.add_argument("--failed", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--ignore-retry-after", action="store_true")
    print(json.dumps(asyncio.run(main(parser.parse_args()))), flush=True)
