"""Operators' circuit orders through the state dir (``retryd.runtime.circuit_control``), on a
real state dir: hostile order files are "no order" (never an exception out of the reader, the
sidecar's view or a worker's heartbeat), concurrent writers (threads and processes) each get a
unique, increasing ``seq`` and never leave a half-written file, and a reader sees two orders
written within one file-timestamp tick. (Through the sidecar's HTTP API:
tests/unit/test_circuit_api.py and tests/integration/test_circuit_orders_sidecar.py.)"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from retryd.policy.circuit import CircuitAction, CircuitState
from retryd.runtime.circuit_control import (
    MAX_BYTES,
    CommandReader,
    OrderRefused,
    command_path,
    lock_path,
    parse_command,
    read_command,
    write_command,
)
from retryd.runtime.heartbeat import read_heartbeats
from tests.stub_kafka import StubBroker
from tests.support import wait_for
from tests.unit.test_engine_loop import GROUP, make_worker

OPEN = CircuitAction.OPEN


def order(**fields: object) -> bytes:
    """A well-formed order's JSON with ``fields`` replacing (or, as ``...``, dropping) its own."""
    doc: dict[str, object] = {
        "seq": 7,
        "action": "open",
        "by": "ops",
        "at_ms": int(time.time() * 1000),
        "group": GROUP,
    }
    for name, value in fields.items():
        if value is ...:
            del doc[name]
        else:
            doc[name] = value
    return json.dumps(doc).encode()


def raw_order(seq: str) -> bytes:
    """An order whose ``seq`` is the literal JSON text ``seq``."""
    return order(seq=0).replace(b'"seq": 0', b'"seq": ' + seq.encode())


HOSTILE = {
    # the two reported faults: OverflowError from int(inf), RecursionError from json.loads
    "seq 1e999": raw_order("1e999"),
    "deep nesting": b"[" * 2000 + b"]" * 2000,
    "deep nesting in a field": raw_order("[" * 1500 + "]" * 1500),
    "nested objects": b'{"a":' * 1000 + b"1" + b"}" * 1000,
    "bigger than the bound": order() + b" " * (1 << 20),
    "binary garbage": bytes(range(256)) * 4,
    "not UTF-8": order(by="ops").replace(b"ops", b"\xff\xfe"),
    "empty": b"",
    "null": b"null",
    "a list": b'[7, "open"]',
    "a string": b'"open"',
    "seq true": order(seq=True),
    "seq negative": order(seq=-3),
    "seq zero": order(seq=0),
    "seq float": order(seq=2.0),
    "seq string": order(seq="5"),
    "seq NaN": raw_order("NaN"),
    "seq Infinity": raw_order("-Infinity"),
    "seq 30 digits": raw_order("9" * 30),
    "seq 5000 digits": raw_order("9" * 5000),  # ValueError from int() (digit limit)
    "seq beyond 2**53": order(seq=2**53),
    "action unknown": order(action="explode"),
    "action a list": order(action=["open"]),
    "action null": order(action=None),
    "by a number": order(by=5),
    "by with a newline": order(by="ops\nERROR forged log line"),
    "by a lone surrogate": order(by="\ud800"),  # json.dumps escapes it: "\\ud800"
    "at_ms negative": order(at_ms=-1),
    "at_ms a float": order(at_ms=1.5),
    "group a number": order(group=1),
    "no seq": order(seq=...),
    "no action": order(action=...),
    "no by": order(by=...),
    "no at_ms": order(at_ms=...),
    "no group": order(group=...),
}


def put(path: Path, data: bytes) -> None:
    """Replace the order file with ``data`` as a foreign writer would (a new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("foreign.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_order_file_is_no_order_and_a_later_order_is_applied(
    state_dir: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = command_path(state_dir, GROUP)
    reader = CommandReader(state_dir, GROUP)  # a worker running before the file went bad
    caplog.set_level(logging.WARNING, "retryd.runtime.circuit_control")
    put(path, HOSTILE[name])
    assert read_command(path) is None
    for _ in range(3):  # three heartbeats
        assert reader.poll() is None
    refused = [r for r in caplog.records if r.name == "retryd.runtime.circuit_control"]
    assert len(refused) == 1, [r.getMessage() for r in refused]  # once, not every heartbeat
    assert str(path) in refused[0].getMessage()
    assert "ERROR forged" not in caplog.text  # nothing from the file reaches the log
    # a fresh worker starting beside it finds no order either
    assert CommandReader(state_dir, GROUP).poll() is None

    cmd = write_command(state_dir, GROUP, OPEN, "ops")
    seen = reader.poll()
    assert seen == cmd and seen.action is OPEN and seen.seq >= 1
    assert reader.poll() is None


def test_the_same_bad_file_is_logged_once_and_each_new_bad_state_once_more(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = command_path(state_dir, GROUP)
    reader = CommandReader(state_dir, GROUP)
    caplog.set_level(logging.WARNING, "retryd.runtime.circuit_control")
    put(path, HOSTILE["seq 1e999"])
    for _ in range(5):
        assert reader.poll() is None and read_command(path) is None  # worker and sidecar
    put(path, HOSTILE["deep nesting"])
    for _ in range(5):
        assert reader.poll() is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "seq" in messages[0] and "nest" in messages[1]


def test_not_a_file_and_unusable_paths_are_no_order(state_dir: Path) -> None:
    path = command_path(state_dir, GROUP)
    reader = CommandReader(state_dir, GROUP)
    path.mkdir(parents=True)  # a directory where the file should be
    assert reader.poll() is None and read_command(path) is None
    with pytest.raises(OSError):  # the sidecar answers 503 (tests/unit/test_circuit_api.py)
        write_command(state_dir, GROUP, OPEN, "ops")
    path.rmdir()
    os.mkfifo(path)  # a FIFO: opening it for reading must not wait for a writer
    assert reader.poll() is None and read_command(path) is None
    path.unlink()
    path.symlink_to(path)  # a symlink loop
    assert reader.poll() is None and read_command(path) is None
    path.unlink()
    assert reader.poll() is None  # no file: no order
    cmd = write_command(state_dir, GROUP, OPEN, "ops")
    assert reader.poll() == cmd


def test_a_circuit_dir_that_is_a_file_is_no_order(state_dir: Path) -> None:
    state_dir.mkdir()
    (state_dir / "circuit").write_text("not a directory")
    reader = CommandReader(state_dir, GROUP)
    assert reader.poll() is None
    assert read_command(command_path(state_dir, GROUP)) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_order_file_is_no_order(state_dir: Path) -> None:
    path = command_path(state_dir, GROUP)
    reader = CommandReader(state_dir, GROUP)
    put(path, order(seq=1))
    path.chmod(0)
    try:
        assert reader.poll() is None and read_command(path) is None
    finally:
        path.chmod(0o644)
    assert reader.poll() is not None


def test_a_spoiled_file_does_not_reset_the_numbering(state_dir: Path) -> None:
    """Workers that applied order 5 ignore orders numbered 5 or less: the next order after a
    file went bad must still be numbered 6."""
    path = command_path(state_dir, GROUP)
    reader = CommandReader(state_dir, GROUP)
    for _ in range(5):
        write_command(state_dir, GROUP, OPEN, "ops")
    assert reader.poll() is not None
    put(path, HOSTILE["binary garbage"])
    assert reader.poll() is None
    path.unlink()
    cmd = write_command(state_dir, GROUP, CircuitAction.CLOSE, "ops")
    assert cmd.seq == 6
    assert reader.poll() == cmd


def test_a_spoiled_lock_file_does_not_reset_the_numbering_either(state_dir: Path) -> None:
    path = command_path(state_dir, GROUP)
    for _ in range(3):
        write_command(state_dir, GROUP, OPEN, "ops")
    for spoiled in (b"garbage", b"9" * 40, str(2**60).encode(), b"\xff" * 100):
        lock_path(path).write_bytes(spoiled)
        before = read_command(path)
        assert before is not None
        assert write_command(state_dir, GROUP, OPEN, "ops").seq == before.seq + 1


def test_brackets_and_quotes_in_names_are_not_nesting(tmp_path: Path) -> None:
    """Only nesting outside strings counts: a group or orderer may hold brackets, quotes and
    backslashes."""
    group = 'g[[[[[[[[[[{{{{{{{{{{"\\\\"]]'
    reader = CommandReader(tmp_path, group)
    cmd = write_command(tmp_path, group, OPEN, '[[[[[[[[[[\\"{{{{{{{{{{')
    assert reader.poll() == cmd and cmd.group == group
    # an escaped backslash ends a string: the nesting after it counts
    hidden = b'{"by": "x\\\\", "seq": ' + b"[" * 9 + b"1" + b"]" * 9 + b"}"
    assert json.loads(hidden)["by"] == "x\\"
    with pytest.raises(OrderRefused, match="nests deeper"):
        parse_command(hidden)
    assert parse_command(order(by="[" * 100, group="{" * 100)).by == "[" * 64


def test_the_numbering_ends_with_a_clear_error(state_dir: Path) -> None:
    put(command_path(state_dir, GROUP), order(seq=2**53 - 1))
    with pytest.raises(OSError, match="order numbers"):
        write_command(state_dir, GROUP, OPEN, "ops")


def test_two_orders_within_one_timestamp_tick_are_both_seen_in_order(state_dir: Path) -> None:
    """Same mtime, same size (close and probe are as long): only the seq tells them apart."""
    path = command_path(state_dir, GROUP)
    reader = CommandReader(state_dir, GROUP)
    first = write_command(state_dir, GROUP, CircuitAction.CLOSE, "ops")
    st = path.stat()
    assert reader.poll() == first
    second = write_command(state_dir, GROUP, CircuitAction.PROBE, "ops")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same mtime tick
    assert path.stat().st_size == st.st_size
    assert reader.poll() == second
    assert reader.poll() is None
    third = write_command(state_dir, GROUP, CircuitAction.CLOSE, "ops")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert reader.poll() == third
    assert [first.seq, second.seq, third.seq] == [1, 2, 3]


def test_a_stale_order_is_not_applied_by_a_worker_that_starts_later(state_dir: Path) -> None:
    put(command_path(state_dir, GROUP), order(seq=4, at_ms=int(time.time() * 1000) - 3_600_000))
    assert CommandReader(state_dir, GROUP).poll() is None
    put(command_path(state_dir, GROUP), order(seq=5))  # a recent one is
    seen = CommandReader(state_dir, GROUP).poll()
    assert seen is not None and seen.seq == 5


def test_another_groups_order_is_not_applied(state_dir: Path) -> None:
    put(command_path(state_dir, GROUP), order(group="someone-else"))
    assert CommandReader(state_dir, GROUP).poll() is None


# --- concurrent writers ---------------------------------------------------------------------

THREADS = 6
PROCESSES = 3
PER_WRITER = 12


def write_many(state_dir: Path, name: str, n: int) -> list[int]:
    return [write_command(state_dir, GROUP, OPEN, name).seq for _ in range(n)]


def threads_writing(state_dir: Path, prefix: str) -> dict[str, list[int] | str]:
    """``THREADS`` threads writing ``PER_WRITER`` orders each: writer -> seqs, or the error."""
    out: dict[str, list[int] | str] = {}

    def one(name: str) -> None:
        try:
            out[name] = write_many(state_dir, name, PER_WRITER)
        except Exception as exc:
            out[name] = repr(exc)

    threads = [threading.Thread(target=one, args=(f"{prefix}-t{i}",)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def process_main(state_dir: str, prefix: str, result: str) -> None:
    """A writer process (spawned): its threads' seqs to ``result`` as JSON."""
    out = threads_writing(Path(state_dir), prefix)
    Path(result).write_text(json.dumps(out))


@pytest.fixture
def spawned() -> Iterator[list[multiprocessing.process.BaseProcess]]:
    procs: list[multiprocessing.process.BaseProcess] = []
    yield procs
    for p in procs:  # stopped by PID if still running
        if p.is_alive():
            p.kill()
        p.join(10)


def test_concurrent_writers_get_unique_increasing_seqs_and_readers_see_whole_files(
    tmp_path: Path, state_dir: Path, spawned: list[multiprocessing.process.BaseProcess]
) -> None:
    path = command_path(state_dir, GROUP)
    ctx = multiprocessing.get_context("spawn")
    results = [tmp_path / f"p{i}.json" for i in range(PROCESSES)]
    for i, result in enumerate(results):
        p = ctx.Process(target=process_main, args=(str(state_dir), f"p{i}", str(result)))
        spawned.append(p)
    # a reader polling all along: once there is an order, every read is a whole one
    stop = threading.Event()
    seen: list[int | None] = []

    def read_all_along() -> None:
        while not stop.is_set():
            cmd = read_command(path)
            if cmd is not None or seen:
                seen.append(cmd.seq if cmd is not None else None)
            stop.wait(0.001)  # pacing (a heartbeat polls once a second), not a wait for a state

    reader = threading.Thread(target=read_all_along)
    reader.start()
    try:
        for p in spawned:
            p.start()
        mine = threads_writing(state_dir, "main")
        wait_for(lambda: all(not p.is_alive() for p in spawned), 120, what="writer processes")
    finally:
        stop.set()
        reader.join(10)
    assert [p.exitcode for p in spawned] == [0] * PROCESSES
    by_writer = dict(mine)
    for result in results:
        by_writer.update(json.loads(result.read_text()))
    errors = {w: s for w, s in by_writer.items() if isinstance(s, str)}
    assert not errors
    assert len(by_writer) == (PROCESSES + 1) * THREADS
    total = len(by_writer) * PER_WRITER
    every = [seq for seqs in by_writer.values() for seq in seqs]
    assert sorted(every) == list(range(1, total + 1))  # unique, none skipped
    for writer, seqs in by_writer.items():
        assert seqs == sorted(set(seqs)), writer  # strictly increasing per writer
    final = read_command(path)
    assert final is not None and final.seq == total
    assert None not in seen, "a reader saw no order (a half-written or missing file)"
    assert seen == sorted(seen)  # never back to an older order
    leftovers = sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".tmp"))
    assert leftovers == []


# --- a worker's heartbeat -------------------------------------------------------------------


def test_a_worker_keeps_running_through_hostile_order_files(tmp_path: Path) -> None:
    broker = StubBroker()
    state_dir = tmp_path / "state"
    path = command_path(state_dir, GROUP)
    put(path, HOSTILE["seq 1e999"])  # already there when the worker starts
    worker = make_worker(broker, tmp_path, lambda m: None, circuit_breaker=True)
    for name in ("seq 1e999", "deep nesting", "bigger than the bound", "by a lone surrogate"):
        put(path, HOSTILE[name])
        worker.circuit.apply_orders(int(time.time() * 1000))  # does not raise
    assert worker.circuit.breaker.state is CircuitState.CLOSED

    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(until_drained=False)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        for name in ("deep nesting", "seq 1e999"):
            put(path, HOSTILE[name])
            two_beats_after(state_dir, time.time())
            assert thread.is_alive() and not errors
        write_command(state_dir, GROUP, OPEN, "ops")
        wait_for(lambda: worker.circuit.breaker.state is CircuitState.OPEN, 10, what="the order")
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive() and not errors


def two_beats_after(state_dir: Path, after: float) -> None:
    """Wait for two heartbeats of this process after ``after``: the second one's poll of the
    order file began after ``after`` (``apply_orders`` runs just before each beat)."""

    def beat_after(t: float) -> float | None:
        beats = [b for b in read_heartbeats(state_dir) if b.pid == os.getpid() and b.ts > t]
        return beats[0].ts if beats else None

    first = wait_for(lambda: beat_after(after), 10, what="a heartbeat")
    wait_for(lambda: beat_after(first), 10, what="another heartbeat")


def test_the_bound_is_a_few_kib() -> None:
    assert 1024 <= MAX_BYTES <= 8192
