"""Worker heartbeat files as untrusted input (``retryd.runtime.heartbeat``), on a real state
dir: a hostile file beside a live worker's (this process's ``HeartbeatWriter``) is skipped,
logged once per file state without its content, and never raises out of any reader (the
sidecar's readiness, ``retryd_workers_alive``, ``GET /v1/circuit``, ``retryd health``, the
supervisor's drain watch, the start-up prune); the good heartbeat beside it still counts.
And the writer never writes more than the readers take, however many partitions it owns.
(Through a real sidecar over HTTP: tests/integration/test_heartbeat_hostile.py.)"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from retryd.api.circuit import circuit_view
from retryd.api.readiness import alive_workers, circuit_summary, worker_states
from retryd.config import Settings, load_settings
from retryd.hosting.drain import DrainWatch
from retryd.runtime import boundedjson, heartbeat
from retryd.runtime.health import worker_check
from retryd.runtime.heartbeat import (
    MAX_BYTES,
    HeartbeatWriter,
    prune_stale,
    read_heartbeats,
)
from retryd.runtime.paths import heartbeat_dir

GROUP = "orders-workers"
LOGGER = "retryd.runtime.heartbeat"
FORGED = "ERROR forged"  # in hostile files: must never reach the log
PID = 4_000_001  # the hostile file's name: <PID>.json (no such process here)


CIRCUIT: dict[str, object] = {
    "state": "closed",
    "since_ms": 1,
    "reason": "starting",
    "last_error": None,
    "next_probe_ms": None,
    "transitions": {"open": 0},
    "held": 0,
    "probes": 0,
}


def good(**fields: object) -> dict[str, object]:
    """A well-formed heartbeat of ``PID`` with ``fields`` replacing (``...``: dropping) its own."""
    doc: dict[str, object] = {
        "pid": PID,
        "role": "all",
        "group_id": GROUP,
        "ts": time.time(),
        "assigned_partitions": 2,
        "paused_partitions": 0,
        "state": "running",
        "drained": False,
        "positions": {"orders/0": 5},
        "produced": {"orders.retry_1s/0": 3},
        "circuit": CIRCUIT,
    }
    for name, value in fields.items():
        if value is ...:
            del doc[name]
        else:
            doc[name] = value
    return doc


def enc(doc: object) -> bytes:
    return json.dumps(doc).encode()


def raw(name: str, literal: str) -> bytes:
    """A good heartbeat whose field ``name`` is the JSON text ``literal``."""
    return enc(good(**{name: "@@"})).replace(b'"@@"', literal.encode())


def circuit(**fields: object) -> bytes:
    return enc(good(circuit={**CIRCUIT, **fields}))


HOSTILE: dict[str, bytes] = {
    # the reported faults: RecursionError out of json.loads, and 1e999 (inf: alive forever)
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "deep nesting in a field": raw("circuit", "[" * 2000 + "]" * 2000),
    "nested objects": b'{"a":' * 3000 + b"1" + b"}" * 3000,
    "ts 1e999": raw("ts", "1e999"),
    "ts -1e999": raw("ts", "-1e999"),
    "pid 1e999": raw("pid", "1e999"),
    "1 MiB": enc(good()) + b" " * (1 << 20),
    "just over the bound": enc(good()) + b" " * MAX_BYTES,
    "many numbers, within the bound": b"[" + b"1," * (MAX_BYTES // 2 - 8) + b"1]",
    "binary": bytes(range(256)) * 16,
    "not UTF-8": enc(good(role="all")).replace(b'"all"', b'"\xff\xfe"'),
    "empty": b"",
    "null": b"null",
    "a list": enc([PID, "running"]),
    "a string": enc(FORGED),
    "a number": b"4000001",
    "truncated": enc(good())[:50],
    "two documents": enc(good()) + enc(good()),
    "NaN ts": raw("ts", "NaN"),
    "Infinity ts": raw("ts", "Infinity"),
    "a 5000-digit pid": raw("pid", "9" * 5000),
    "a 30-digit offset": enc(good(positions={"orders/0": "@@"})).replace(b'"@@"', b"9" * 30),
    "a 100-character number": raw("ts", "1." + "0" * 98),
    # wrong types, one field at a time (every field)
    "pid a string": enc(good(pid=str(PID))),
    "pid true": enc(good(pid=True)),
    "pid a float": enc(good(pid=float(PID))),
    "pid zero": enc(good(pid=0)),
    "pid negative": enc(good(pid=-PID)),
    "pid beyond 2**31": enc(good(pid=2**40)),
    "pid of another file": enc(good(pid=PID + 1)),
    "role a number": enc(good(role=1)),
    "role null": enc(good(role=None)),
    "group_id a list": enc(good(group_id=[GROUP])),
    "ts a string": enc(good(ts=str(time.time()))),
    "ts true": enc(good(ts=True)),
    "ts negative": enc(good(ts=-1.0)),
    "assigned_partitions a string": enc(good(assigned_partitions="2")),
    "assigned_partitions negative": enc(good(assigned_partitions=-1)),
    "assigned_partitions a float": enc(good(assigned_partitions=2.0)),
    "paused_partitions true": enc(good(paused_partitions=True)),
    "state a number": enc(good(state=3)),
    "state an object": enc(good(state={"running": True})),
    "drained a string": enc(good(drained="yes")),
    "drained 1": enc(good(drained=1)),
    "positions a list": enc(good(positions=[["orders/0", 5]])),
    "positions of strings": enc(good(positions={"orders/0": "5"})),
    "positions of floats": enc(good(positions={"orders/0": 5.5})),
    "produced of booleans": enc(good(produced={"orders/0": True})),
    "produced null": enc(good(produced=None)),
    # text no HTTP answer can carry (escaped in the file; a lone surrogate once read)
    "a lone surrogate in last_error": circuit(last_error="\ud800 " + FORGED),
    "a lone surrogate in group_id": enc(good(group_id=GROUP + "\udc80")),
    "a lone surrogate in a position's name": enc(good(positions={"o\ud800/0": 1})),
    "a lone surrogate in a transition": circuit(transitions={"\udfff": 1}),
    # missing fields that have no default
    **{f"no {name}": enc(good(**{name: ...})) for name in ("pid", "role", "group_id", "ts")},
    "no assigned_partitions": enc(good(assigned_partitions=...)),
    "no paused_partitions": enc(good(paused_partitions=...)),
    "no state": enc(good(state=...)),
}


# A garbled circuit report: the heartbeat counts (the process is alive), its circuit is shown
# as unknown (tests/unit/test_circuit_api.py: test_garbled_circuit_in_a_heartbeat_is_...).
# built when a test runs, not at import: a heartbeat older than heartbeat_stale_s is not alive
GARBLED_CIRCUIT: dict[str, Callable[[], bytes]] = {
    "held 1e999": lambda: circuit(held="@@").replace(b'"@@"', b"1e999"),
    "circuit a list": lambda: enc(good(circuit=["closed"])),
    "circuit a string": lambda: enc(good(circuit="open")),
    "circuit state a number": lambda: circuit(state=2),
    "circuit reason a list": lambda: circuit(reason=[FORGED]),
    "circuit last_error a number": lambda: circuit(last_error=503),
    "circuit since_ms a string": lambda: circuit(since_ms="1"),
    "circuit next_probe_ms a float": lambda: circuit(next_probe_ms=1.5),
    "circuit held true": lambda: circuit(held=True),
    "circuit probes an object": lambda: circuit(probes={}),
    "circuit transitions a list": lambda: circuit(transitions=["open"]),
    "circuit transitions of strings": lambda: circuit(transitions={"open": "1"}),
    "circuit null": lambda: enc(good(circuit=None)),
    "circuit nested": lambda: circuit(state={"a": [[{"b": [FORGED]}]]}),
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(
        bootstrap_servers="127.0.0.1:1",  # never contacted
        main_topics="orders",
        group_id=GROUP,
        state_dir=tmp_path / "state",
        heartbeat_stale_s=30,
    )


@pytest.fixture
def mine(settings: Settings) -> Iterator[HeartbeatWriter]:
    """This process, a live worker: its heartbeat is beside the hostile files."""
    writer = HeartbeatWriter(settings.state_dir, "all", GROUP, interval_s=0)
    writer.beat(2, 0, positions={"orders/1": 9}, circuit={"state": "closed", "held": 0})
    yield writer
    writer.remove()


def hostile_path(settings: Settings, name: str = f"{PID}.json") -> Path:
    return heartbeat_dir(settings.state_dir) / name


def put(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` as a foreign writer would (a new file)."""
    tmp = path.with_name("foreign.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def assert_readers_see_only(settings: Settings, pid: int) -> None:
    """Every reader of heartbeats answers, counting ``pid`` (and nothing else) as alive."""
    assert [hb.pid for hb in read_heartbeats(settings.state_dir)] == [pid]
    workers = worker_states(settings)
    assert [w["pid"] for w in workers] == [pid] and workers[0]["alive"]
    assert circuit_summary(workers)["state"] == "closed"
    assert alive_workers(settings) == 1
    view = circuit_view(settings)
    assert [p.pid for p in view.processes] == [pid] and view.state is not None
    view.model_dump_json()  # the answer's body can be written out
    check = worker_check(settings.state_dir, settings.heartbeat_stale_s)
    assert check.ok and "1 worker process" in check.detail, check
    assert DrainWatch(settings.state_dir, 2).check([pid]) is False  # answers (not drained)
    assert prune_stale(settings.state_dir, settings.heartbeat_stale_s) == 0


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_heartbeat_is_skipped_and_logged_once(
    settings: Settings, mine: HeartbeatWriter, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    path = hostile_path(settings)
    put(path, HOSTILE[name])
    for _ in range(3):  # three probes, scrapes or views
        assert_readers_see_only(settings, os.getpid())
    logged = refusals(caplog)
    assert len(logged) == 1, logged  # once per file state, not per read
    assert repr(str(path)) in logged[0]
    assert FORGED not in caplog.text and "\ud800" not in caplog.text  # nothing of the content
    assert path.exists()  # skipped, left alone (prune removes only heartbeats it can read)

    # the same file made good counts again: nothing about it is remembered but its last state
    put(path, enc(good()))
    assert sorted(hb.pid for hb in read_heartbeats(settings.state_dir)) == sorted(
        [PID, os.getpid()]
    )


@pytest.mark.parametrize("name", list(GARBLED_CIRCUIT))
def test_a_garbled_circuit_report_is_unknown_and_the_heartbeat_counts(
    settings: Settings, mine: HeartbeatWriter, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    put(hostile_path(settings), GARBLED_CIRCUIT[name]())  # built now: its "ts" is fresh
    (hb,) = [hb for hb in read_heartbeats(settings.state_dir) if hb.pid == PID]
    for value in hb.circuit.values():  # what is kept is of its type
        assert value is None or isinstance(value, str | int | dict), hb.circuit
    workers = {w["pid"]: w for w in worker_states(settings)}
    assert workers[PID]["alive"] and workers[os.getpid()]["alive"]
    assert alive_workers(settings) == 2
    view = circuit_view(settings)
    assert sorted(p.pid for p in view.processes) == sorted([PID, os.getpid()])
    assert view.state is not None and FORGED not in view.model_dump_json()
    assert refusals(caplog) == []


def test_the_hostile_cases_are_refused_by_the_parser_alone() -> None:
    """Each case above is refused for its content (not, say, for a missing file)."""
    for name, data in HOSTILE.items():
        if name == "pid of another file":
            continue  # refused for its file name, not its content
        with pytest.raises(boundedjson.Refused):
            doc = boundedjson.loads(data, max_bytes=MAX_BYTES, max_depth=8, unicode_only=True)
            heartbeat.parse_heartbeat(doc)
    # and the well-formed ones are taken
    assert heartbeat.parse_heartbeat(good(unknown_field={"later": [1]})).pid == PID
    minimal = good(drained=..., positions=..., produced=..., circuit=...)
    assert heartbeat.parse_heartbeat(minimal).circuit == {}


def test_non_files_are_skipped_without_waiting(
    settings: Settings, mine: HeartbeatWriter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    path = hostile_path(settings)
    good_elsewhere = hostile_path(settings, "elsewhere.txt")
    good_elsewhere.write_bytes(enc(good()))
    makers: dict[str, Callable[[], None]] = {
        "a directory": lambda: path.mkdir(),
        "a FIFO": lambda: os.mkfifo(path),  # a plain open() would wait for a writer for good
        "a symlink loop": lambda: path.symlink_to(path),
        "a symlink to a heartbeat": lambda: path.symlink_to(good_elsewhere),
        "a symlink to /dev/zero": lambda: path.symlink_to("/dev/zero"),
        "a dangling symlink": lambda: path.symlink_to(path.with_name("gone.json")),
    }
    for what, make in makers.items():
        make()
        for _ in range(3):
            assert_readers_see_only(settings, os.getpid())
        assert len(refusals(caplog)) == 1, (what, refusals(caplog))
        caplog.clear()
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()


def test_badly_named_files_are_skipped_and_their_names_cannot_forge_log_lines(
    settings: Settings, mine: HeartbeatWriter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    for name in (f"x\n{FORGED}.json", "0.json", f"0{PID}.json", "12345678901.json", ".json"):
        path = hostile_path(settings, name)
        put(path, enc(good(pid=int(name[:-5]) if name[:-5].isdigit() else PID)))
        for _ in range(2):
            assert_readers_see_only(settings, os.getpid())
        path.unlink()
    logged = refusals(caplog)
    assert len(logged) == 5, logged
    assert all("\n" not in line for line in logged)
    assert repr(str(hostile_path(settings, f"x\n{FORGED}.json"))) in logged[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_heartbeat_is_skipped(settings: Settings, mine: HeartbeatWriter) -> None:
    path = hostile_path(settings)
    put(path, enc(good()))
    path.chmod(0)
    try:
        assert_readers_see_only(settings, os.getpid())
    finally:
        path.chmod(0o644)


def test_no_heartbeat_directory_or_one_that_is_a_file_is_no_worker(settings: Settings) -> None:
    assert read_heartbeats(settings.state_dir) == []
    settings.state_dir.mkdir()
    heartbeat_dir(settings.state_dir).write_text("not a directory")
    assert read_heartbeats(settings.state_dir) == []
    assert worker_states(settings) == [] and alive_workers(settings) == 0
    assert circuit_view(settings).processes == []
    assert not worker_check(settings.state_dir, 30).ok


def test_each_new_bad_state_is_logged_once_more(
    settings: Settings, mine: HeartbeatWriter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    path = hostile_path(settings)
    for name in ("ts 1e999", "deep nesting", "ts 1e999"):
        put(path, HOSTILE[name])
        for _ in range(5):
            assert_readers_see_only(settings, os.getpid())
    put(path, enc(good()))
    assert len(read_heartbeats(settings.state_dir)) == 2
    put(path, HOSTILE["binary"])
    assert_readers_see_only(settings, os.getpid())
    logged = refusals(caplog)
    assert len(logged) == 4, logged
    assert "ts" in logged[0] and "nest" in logged[1] and "ts" in logged[2]


def test_a_file_still_refused_is_not_parsed_again(
    settings: Settings, mine: HeartbeatWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile file within the bound costs one parse, not one per probe or scrape."""
    parsed: list[int] = []
    loads = boundedjson.loads

    def counting(data: bytes, **kw: object) -> object:
        parsed.append(len(data))
        return loads(data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(boundedjson, "loads", counting)
    put(hostile_path(settings), HOSTILE["many numbers, within the bound"])
    for _ in range(10):
        assert_readers_see_only(settings, os.getpid())
    assert sum(1 for n in parsed if n > MAX_BYTES // 2) == 1, parsed
    put(hostile_path(settings), HOSTILE["many numbers, within the bound"])  # a new file
    assert_readers_see_only(settings, os.getpid())
    assert sum(1 for n in parsed if n > MAX_BYTES // 2) == 2


# --- the writer ---------------------------------------------------------------------------------


def partitions(count: int, name_chars: int, tiers: int = 1) -> dict[str, int]:
    """``count`` partitions of ``tiers`` topics with names of ``name_chars`` characters, each
    at an offset of 13 digits."""
    per = count // tiers
    return {
        f"{f't{k}-':x<{name_chars}}/{p}": 1_700_000_000_000 + p
        for k in range(tiers)
        for p in range(per)
    }


def biggest_circuit() -> dict[str, object]:
    return {
        "state": "half_open",
        "since_ms": 2**62,
        "reason": "confirming: " + "x" * 300,
        "last_error": "E" * 200,  # ERROR_MAX
        "next_probe_ms": 2**62,
        "transitions": {"open": 2**40, "half_open": 2**40, "closed": 2**40},
        "held": 2**50,
        "probes": 2**50,
    }


@pytest.mark.parametrize("name_chars", [30, 100])
def test_2000_partitions_fit_the_bound_with_their_positions(
    tmp_path: Path, name_chars: int
) -> None:
    """A worker owning 2,000 partitions that routed copies to 2,000 more: with 30-character
    topic names its heartbeat is ~200 KiB (~0.4 of the bound), with 100 ~480 KiB."""
    writer = HeartbeatWriter(tmp_path, "all", "g" * 200, interval_s=0)
    positions = partitions(2000, name_chars, tiers=2)
    produced = partitions(2000, name_chars, tiers=4)
    writer.beat(2000, 2000, drained=True, positions=positions, produced=produced,
                circuit=biggest_circuit())  # fmt: skip
    size = writer.path.stat().st_size
    assert size <= MAX_BYTES and not writer.trimmed
    if name_chars == 30:
        assert size < 0.45 * MAX_BYTES, size
    (hb,) = read_heartbeats(tmp_path)
    assert hb.positions == positions and hb.produced == produced and hb.drained is True
    assert hb.circuit == biggest_circuit()


def test_a_heartbeat_too_big_for_the_bound_is_written_without_positions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Topic names of Kafka's maximum, 249 characters: 4,000 positions take ~1 MiB. The
    writer leaves them out (and never claims "drained" without them), logs it once while it
    lasts, and the heartbeat is read: the worker stays alive to readiness."""
    caplog.set_level(logging.WARNING, LOGGER)
    writer = HeartbeatWriter(tmp_path, "all", "g", interval_s=0)
    huge = partitions(2000, 249)
    for _ in range(3):
        writer.beat(2000, 0, drained=True, positions=huge, produced=huge,
                    circuit=biggest_circuit())  # fmt: skip
        assert writer.path.stat().st_size <= MAX_BYTES and writer.trimmed
        (hb,) = read_heartbeats(tmp_path)
        assert hb.positions == {} and hb.produced == {} and hb.drained is False
        assert hb.assigned_partitions == 2000 and hb.circuit == biggest_circuit()
    assert writer.failing is None
    assert len(refusals(caplog)) == 1 and "written without them" in caplog.text
    small = partitions(10, 249)
    writer.beat(10, 0, drained=True, positions=small, produced=small)
    (hb,) = read_heartbeats(tmp_path)
    assert hb.positions == small and hb.drained is True and not writer.trimmed
    assert len(refusals(caplog)) == 2 and "again" in refusals(caplog)[1]


def test_a_heartbeat_that_cannot_fit_at_all_is_a_failed_write(tmp_path: Path) -> None:
    writer = HeartbeatWriter(tmp_path, "all", "g" * (MAX_BYTES + 1), interval_s=0)
    writer.beat(1, 0)  # does not raise
    assert writer.failing is not None and "more than" in writer.failing
    assert not writer.path.exists()


def test_the_writer_writes_what_the_readers_take(tmp_path: Path) -> None:
    """Text a handler's error may carry: non-ASCII as it is, a lone surrogate as "?" (read
    back, never refused: the worker would vanish from readiness)."""
    writer = HeartbeatWriter(tmp_path, "all", "g", interval_s=0)
    error = 'ValueError: caf\u00e9 \ud800 [[[[[[[[[[{{{{{{{{ "quoted" \\ at orders/0/1'
    writer.beat(1, 0, circuit={**biggest_circuit(), "last_error": error})
    (hb,) = read_heartbeats(tmp_path)
    assert hb.circuit["last_error"] == error.replace("\ud800", "?")
    assert "caf\u00e9".encode() in writer.path.read_bytes()


# --- the shared bounded reader ------------------------------------------------------------------


def _nesting(doc: object) -> int:
    if isinstance(doc, dict):
        return 1 + max(map(_nesting, doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max(map(_nesting, doc), default=0)
    return 0


def test_the_nesting_check_counts_what_json_loads_recurses_into() -> None:
    """``too_deep`` (which bounds ``json.loads``' recursion before it runs) agrees with the
    real nesting of documents whose strings hold brackets, quotes and backslashes."""
    import random

    rnd = random.Random(7)
    tricky = ["[", "{", "]", "}", '"', "\\", '\\"', "[\\", "x"]

    def make(depth: int) -> object:
        if depth == 0 or rnd.random() < 0.2:
            return "".join(rnd.choice(tricky) for _ in range(rnd.randrange(6)))
        if rnd.random() < 0.5:
            return [make(depth - 1) for _ in range(rnd.randrange(1, 3))]
        return {make(0): make(depth - 1) for _ in range(rnd.randrange(1, 3))}  # type: ignore[misc]

    for _ in range(500):
        doc = make(rnd.randrange(12))
        text = json.dumps(doc)
        for limit in (0, 3, 8):
            assert boundedjson.too_deep(text, limit) == (_nesting(doc) > limit), text
    # after the first complete value json.loads stops: what follows cannot make it recurse
    assert not boundedjson.too_deep("]" * 20 + "[" * 20, 8)
    assert boundedjson.too_deep("[" * 9 + "]" * 9, 8) and not boundedjson.too_deep("[" * 8, 8)
