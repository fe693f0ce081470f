"""What may run now: key lanes, the circuit's gate and its probe. The one owner of that
decision: every record that becomes runnable, and every record that goes back in line (held
by the circuit breaker, cut off with an abandoned loop, handed back by a hung slot, a failed
probe), passes through here.

**Lanes.** Every record carries its *ordering key* (``lock``): ``(partition state, record
key)`` for ``ordering=key``, the partition state for ``partition``, ``None`` for ``none``.
The scheduler keeps, per busy key, the last record queued or running (``_tails``). A record
whose key is busy is *chained* behind that record (``work.next``) instead of being made ready;
when the record ahead *releases its lane*, the one chained behind it becomes ready, behind
the keys already waiting (keys take turns). So the records of one key never run
concurrently and start in offset order, while different keys run in parallel, and a chained
record is never "ready": a hot key holds back only its own records.

A record keeps its lane until its outcome is decided, not merely until its call ends:

- a success (or DROP) settles on its slot, which releases the lane at once (``release_locked``
  / ``handoff``: the hot path, no hand-off to the poll thread);
- a failure while the gate is open (the circuit closed) is released by its slot too: it will
  be routed, like any failure, and the key moves on at handler speed; unless calls have been
  failing in a row (``FAIL_STREAK``): the start of an outage, whose failures the breaker may
  want to hold;
- a failure while the gate is shut keeps the lane until the poll thread decided it: *held* by
  the circuit breaker (``keep``), the record runs again and its successors keep waiting
  behind it (``requeue`` puts it back at the front); routed, the key moves on (``release``).
  A failure whose lane is already gone (the circuit opened after its slot released it) is
  never held: a later record of its key may have started, so it is routed instead;
- strict key order (``key_order=strict``) keeps a failure's lane until its writes are done;
- a record whose assignment was closed or released never runs here: its lane is released so
  the records chained behind it drain the same way.

Releasing is idempotent (a record releases its successor once; the tail entry is removed only
by the record it names), so a slot and the poll thread may both look at one record.

**Runs** (``retryd.worker.runs``): the intake offers consecutive records of a partition as
one entry while calls are fast; whether it goes as one is decided here, at submit, with every
record of its partition in view (``retryd.worker.run_policy``). With ``ordering=key`` a run's
lane is its partition (state), and the two kinds of lane of one partition never hold records
at once: a run is unfolded into single records while the partition has a key lane (or records
held), and a single record submitted while a run holds the partition is *held* (``_held``)
until that lane is released, then queued in its key's lane, in offset order. Unfolding
rewrites the partition's ``pending``: only ``submit`` (the poll thread) unfolds; a slot that
releases a run's lane queues held single records, never a run.

**The gate.** The outage circuit breaker shuts it (``set_gate(False)``): ready records stay in
line, in order, and nothing starts except the one record offered as the *probe*
(``offer_probe``), which the circuit chose itself (``retryd.worker.circuit``).

Records are their own queue nodes (no run objects per key), and slots take ready records in
chunks under one lock acquisition, so a record costs a few dictionary and deque operations.

Thread safety: ``submit`` is called by the poll thread, ``take``/``handoff``/``release_*``
by the handler slots, ``release``/``requeue``/the gate by the poll thread; every structure is
guarded by ``lock``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING

from retryd.policy.classify import Outcome
from retryd.worker.lifecycle import DECIDING, DISCARDED, FAILED, QUEUED, SUCCEEDED
from retryd.worker.run_policy import RunPace, may_go, offered, unfold

if TYPE_CHECKING:
    from retryd.worker.partition import PartitionState
    from retryd.worker.work import Run, Work

_RETRY = Outcome.RETRY


# Retryable failures in a row (as slots finish them) past which a failure keeps its lane for the
# poll thread even while the gate is open: the first calls of an outage. The breaker's window
# decides within one poll iteration whether to hold them; a fast-failing handler would
# otherwise run through every fetched record, releasing lanes that a hold then cannot keep.
FAIL_STREAK = 8


class Scheduler:
    def __init__(self, pace: RunPace | None = None) -> None:
        self.lock = threading.Lock()
        self.ready: deque[Work] = deque()
        self._tails: dict[Hashable, Work] = {}  # last record (queued or running) of a busy key
        # wait_below's signal: a plain lock kept acquired while nobody should wake (releasing a
        # C-level lock costs a fraction of an Event's Python-level condition).
        self._signal = threading.Lock()
        self._signal.acquire()
        self._want = False
        self._low = 0
        # strict key order: lane heads to decide before they may run (retryd.worker.strict)
        self.decisions: deque[Work] = deque()
        self.gate_open = True  # False: the circuit is not closed; only the probe may start
        self.failing = 0  # retryable failures in a row, as slots finished them
        self.probe: Work | None = None  # the record offered as the probe, not yet taken
        # the thread pool's calls return in microseconds: records may run as runs
        # (``retryd.worker.runs``); only ``ThreadPool`` measures it, ``pace`` may pin it
        self.fast_calls = False
        self.pace = pace or RunPace()
        self._slowed: list[Work] = []  # runs stopped as calls turned slow, for the poll thread
        # ordering = key: single records of a partition submitted while a run holds it, in
        # offset order, queued when its lane is released
        self._held: dict[Hashable, list[Work]] = {}

    def __len__(self) -> int:
        """Records ready to start (not counting chained ones)."""
        return len(self.ready)

    @property
    def ready_items(self) -> int:
        return len(self.ready)

    @property
    def runnable(self) -> int:
        """Records a slot may take now: the ready ones, or the probe while the gate is shut."""
        if self.gate_open:
            return len(self.ready)
        return 1 if self.probe is not None else 0

    def has_work_locked(self) -> bool:
        """A slot would get a record now (the caller holds ``lock``)."""
        return bool(self.ready) if self.gate_open else self.probe is not None

    @property
    def busy_keys(self) -> int:
        return len(self._tails)

    # ------------------------------------------------------------------ the gate
    def set_gate(self, open_: bool) -> None:
        """Open: every ready record may start. Shut: none, except an offered probe."""
        with self.lock:
            self.gate_open = open_
            if open_:
                probe, self.probe = self.probe, None
                if probe is not None:
                    self.ready.appendleft(probe)  # not taken: back at the front of its line

    def offer_probe(self, w: Work) -> None:
        """Let ``w`` (a lane head that is not in the ready queue) through the shut gate."""
        with self.lock:
            self.probe = w

    def withdraw_probe(self) -> Work | None:
        """The offered probe if no slot took it yet (it goes back to its chooser)."""
        with self.lock:
            probe, self.probe = self.probe, None
            return probe

    def steal(self, accept: Callable[[Work], bool]) -> Work | None:
        """Take the first ready record ``accept`` likes out of the queue (the circuit picking a
        probe among records that never ran); None when there is none."""
        with self.lock:
            for w in self.ready:
                if accept(w):
                    self.ready.remove(w)
                    return w
        return None

    # ------------------------------------------------------------------ runs
    def calls_fast(self) -> bool:
        """May the intake offer runs at all (calls return in microseconds)?"""
        return self.pace.calls_fast(self.fast_calls)

    def offers_run(self, st: PartitionState, by_key: bool) -> bool:
        """Should the intake offer this batch's records of ``st`` as a run? A hint read
        without the lock (``run_policy.offered``); ``submit`` decides."""
        return offered(st, by_key, self._held)

    # ------------------------------------------------------------------ lanes
    def submit(self, works: Iterable[Work]) -> int:
        """Queue records in offset order (per key); returns how many became ready."""
        with self.lock:
            return self._submit_locked(works)

    def _submit_locked(self, works: Iterable[Work]) -> int:
        made_ready = 0
        tails = self._tails
        held = self._held
        append = self.ready.append
        for w in works:
            key = w.lock
            if key is None:
                append(w)
                made_ready += 1
                continue
            if w.many and not self._takes_run(w):  # a run offered: unfolded, queued as singles
                made_ready += self._submit_locked(unfold(w))  # type: ignore[arg-type]
                continue
            tail = tails.get(key)
            if tail is not None:
                tail.next = w
            else:
                if type(key) is tuple:  # a key lane (ordering = key): counted per partition
                    part = key[0]
                    if part in tails:  # a run holds the partition: this waits behind it
                        held.setdefault(part, []).append(w)
                        continue
                    part.lanes += 1
                if w.stage is DECIDING:  # strict key order: decided first
                    self.decisions.append(w)
                else:
                    append(w)
                    made_ready += 1
            tails[key] = w
        return made_ready

    def _takes_run(self, w: Work) -> bool:
        """Does ``w``, a run with a lane, go as one (``run_policy.may_go``)? With ``ordering =
        partition`` always: its records and single ones share the partition's lane."""
        run: Run = w  # type: ignore[assignment]
        return not run.by_key or may_go(run, self._held)

    def slowed(self, run: Work) -> None:
        """A slot stopped ``run`` as calls turned slow: the poll thread requeues the rest of
        it as single records (``take_slowed``); it keeps its lane meanwhile."""
        with self.lock:
            self._slowed.append(run)

    @property
    def has_slowed(self) -> bool:
        return bool(self._slowed)

    def take_slowed(self) -> list[Work]:
        with self.lock:
            out, self._slowed = self._slowed, []
            return out

    def detach(self, run: Work) -> list[Work]:
        """A failed run's lane (``retryd.worker.runs``): the records chained behind it, which
        never started, leave the scheduler with it, in order, and then the single records
        held behind its partition's runs (they are all queued again as single records, behind
        the failure)."""
        chain = []
        with self.lock:
            nxt, run.next = run.next, None
            while nxt is not None:
                chain.append(nxt)
                following = nxt.next
                nxt.next = None
                nxt = following
            key = run.lock
            last = chain[-1] if chain else run
            if key is not None and self._tails.get(key) is last:
                del self._tails[key]
                chain.extend(self._held.pop(key, ()))
        return chain

    def place(self, failed: Work, works: list[Work]) -> None:
        """Queue ``works`` behind ``failed``, a record that failed (its lane taken as if it had
        run from the queue: the records of its key wait for its routing), all in offset
        order."""
        with self.lock:
            key = failed.lock
            if key is not None:
                if type(key) is tuple:
                    key[0].lanes += 1
                self._tails[key] = failed
            self._submit_locked(works)

    def take_locked(self, n: int) -> list[Work]:
        """Up to ``n`` records that may start now; the caller holds ``lock``."""
        if not self.gate_open:
            probe = self.probe
            if probe is None:
                return []
            self.probe = None
            return [probe]
        ready = self.ready
        if not ready:
            return []
        if n == 1 or len(ready) == 1:
            out = [ready.popleft()]
        else:
            popleft = ready.popleft
            out = [popleft() for _ in range(min(n, len(ready)))]
        if self._want and len(ready) <= self._low:
            self._want = False
            self._signal.release()
        return out

    def take(self, n: int = 1) -> list[Work]:
        with self.lock:
            return self.take_locked(n)

    def _release_one(self, w: Work, into: Callable[[Work], None]) -> None:
        """``w`` leaves its lane: the record chained behind it goes to ``into``. Idempotent.
        The caller holds ``lock``."""
        key = w.lock
        if key is None:
            return
        nxt = w.next
        if nxt is not None:
            w.next = None  # released once: a record that runs again releases nothing
            if nxt.stage is DECIDING:  # strict key order: the next record is decided first
                if w.clean and w.stage is SUCCEEDED and nxt.msg._env is None:
                    # decided to run with no chain entry, and it succeeded: the key still has
                    # no entry (only a failure or a park adds one), so the next main-topic
                    # record runs too (a tier copy is always decided: it has an entry)
                    nxt.clean = True
                    nxt.hold = False
                    nxt.stage = QUEUED
                    into(nxt)
                else:
                    self.decisions.append(nxt)
            else:
                into(nxt)
        elif self._tails.get(key) is w:
            del self._tails[key]
            if type(key) is tuple:
                key[0].lanes -= 1
            elif self._held and key in self._held:  # a run's partition: what waited behind it
                self._submit_locked(self._held.pop(key))

    def _settled_here(self, w: Work) -> bool:
        """Does the slot that ran (or refused) ``w`` release its lane? Yes for a success
        settled on the slot, a record discarded with its assignment, a queued record its
        closed assignment will never start, and a failure while the gate is open and calls do
        not fail in a row (it will be routed); no for a failure while the gate is shut or at
        the start of what may be an outage (the poll thread decides: held to run again, or
        routed), for strict order's failures (their writes come first) and for a record that
        runs again. Keeps the count of failures in a row. The caller holds ``lock``."""
        stage = w.stage
        if stage is SUCCEEDED:
            self.failing = 0
            return True
        if stage is FAILED:
            result = w.result
            if result is not None and result.outcome is _RETRY:
                self.failing += 1
            # (a failed run keeps its lane: the poll thread splits it into its records)
            return (
                self.gate_open and self.failing <= FAIL_STREAK and not w.part.strict and not w.many
            )
        if stage is DISCARDED:
            return True
        if stage is QUEUED:
            part = w.part
            return part.closing and w.offset >= part.run_below  # not PartitionState.may_start
        return False

    def handoff(self, w: Work) -> Work | None:
        """A slot is done with ``w``: its lane is released if it settled there (the record
        chained behind it goes to the *back* of the ready queue), and the slot gets the record
        at the front. Keys take turns: a slot that kept running one key's chain would leave
        the last wave of long chains on a few slots while the others idle (200 keys of 100
        records on 64 slots: 4 waves of 2 s instead of 6.25 s of work)."""
        with self.lock:
            if self._settled_here(w) and w.lock is not None:
                self._release_one(w, self.ready.append)
            out = self.take_locked(1)
            return out[0] if out else None

    def release_locked(self, works: list[Work]) -> None:
        """Records a slot took together: the lanes of those settled there are released
        (``settled_here``); records chained behind them become ready (any slot may run them:
        a slot that took several keys must not keep them all to itself). The caller holds
        ``lock``."""
        append = self.ready.append
        for w in works:
            if self._settled_here(w) and w.lock is not None:
                self._release_one(w, append)

    def release_settled(self, works: list[Work]) -> None:
        """``release_locked`` under the lock (a slot given up on: what it finished)."""
        with self.lock:
            self.release_locked(works)

    def release(self, w: Work) -> None:
        """The poll thread decided ``w`` (routed, dead-lettered, or discarded): its key moves
        on."""
        if w.lock is None:
            return
        with self.lock:
            self._release_one(w, self.ready.append)

    def keep(self, w: Work, hold: Callable[[Work], bool]) -> bool:
        """Hold failed ``w`` in its lane (``hold``: the life-cycle transition), atomically
        with the lane check: False, and nothing done, when its lane was already released (a
        later record of its key may have started: ``w`` must be routed, not run again)."""
        with self.lock:
            key = w.lock
            if key is not None and w.next is None and self._tails.get(key) is not w:
                return False
            return hold(w)

    def admit(self, w: Work) -> None:
        """A decided lane head (strict key order) may run: to the back of the ready queue."""
        with self.lock:
            self.ready.append(w)

    def requeue(self, works: list[Work]) -> None:
        """Lane heads that go back in line to run again, at the front, in the given order:
        records a hung slot took but never started, calls cut off with an abandoned loop,
        failed records the circuit held. Their successors stay chained behind them."""
        if works:
            with self.lock:
                self.ready.extendleft(reversed(works))

    def forget(self, parts: Iterable[object]) -> None:
        """Assignments released (every record of theirs discarded): lanes that belong to them
        alone (a key of one partition, or a partition) leave the queue and the lanes are
        dropped. A strict key's lane may also hold records of other partitions (a tier copy
        of the key): its discarded records stay in line and release it as they are refused,
        so the records behind them run. A record still running releases its lane when it
        ends, like any discarded one."""
        gone = set(parts)
        if not gone:
            return

        def local(w: Work) -> bool:
            return w.part in gone and not isinstance(w.lock, bytes)

        with self.lock:
            ready = self.ready
            kept = [w for w in ready if not local(w)]
            if len(kept) != len(ready):
                ready.clear()  # in place: slots hold a reference to this deque
                ready.extend(kept)
            tails = self._tails
            for key in [k for k, w in tails.items() if local(w)]:
                del tails[key]
            for part in [p for p in self._held if p in gone]:
                del self._held[part]
            decisions = self.decisions
            if any(local(w) for w in decisions):
                kept = [w for w in decisions if not local(w)]
                decisions.clear()
                decisions.extend(kept)
            probe = self.probe
            if probe is not None and probe.part in gone:
                self.probe = None
                if isinstance(probe.lock, bytes):
                    self._release_one(probe, ready.append)

    def wait_below(self, low: int, timeout_s: float) -> None:
        """Block until at most ``low`` records are ready (slots took the rest), or the
        timeout: how the poll thread lets the pool catch up without consuming more."""
        with self.lock:
            if len(self.ready) <= low:
                return
            self._low = low
            self._want = True
        self._signal.acquire(timeout=timeout_s)
        with self.lock:
            if self._want:
                self._want = False  # timed out: nobody released the signal
            elif self._signal.acquire(blocking=False):
                pass  # released after our timeout: re-arm (keep it acquired)
