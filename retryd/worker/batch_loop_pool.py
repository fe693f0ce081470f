"""``BatchLoopPool``: an async batch handler (``async def handle_batch``, HTTP bulk) on the
tasks of one event loop.

The ``LoopPool`` with batch calls: each of its ``size`` tasks (``max_in_flight // max_batch``,
at least one) takes up to ``max_batch`` ready records at once, claims each, awaits *one* call
cut at ``timeout_s`` (a timeout gives every record of the call a ``timeout`` result) and
completes each record with its own result (see ``batch_pool.complete``). Key lanes, the
circuit's gate and its probe decide what a task gets, exactly as for single records.

A loop that stops answering (a call that ignores its cancellation) is abandoned as a whole by
``LoopPool.watchdog``, record by record: the abandoned loop reports every record of its batch
calls (``_BatchLoop.abandon``), so an overdue call's records get ``timeout`` results and the
records of calls that did nothing wrong are parked and run again, as in ``LoopPool``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from retryd.handlers.base import AsyncBatchHandler
from retryd.policy.classify import timeout_result
from retryd.worker.batch_pool import BatchSlot, complete, results_for, running_of
from retryd.worker.lifecycle import Lifecycle
from retryd.worker.loop_pool import LoopPool, _Loop
from retryd.worker.slots import adapter_failure, perf
from retryd.worker.work import Work

log = logging.getLogger(__name__)


class BatchLoopPool(LoopPool):
    """``LoopPool`` whose tasks run batch calls (``handler`` is an ``AsyncBatchHandler``)."""

    handler: AsyncBatchHandler  # type: ignore[assignment]

    def _current(self) -> _Loop:
        if self._loop is None:
            self._generation += 1
            loop = self._loop = _BatchLoop(self, self._generation)
            loop.start_slots()  # once ``running()`` can see the loop's slots
        return self._loop

    def running(self) -> int:
        """Records in flight (a batch call counts each of its records)."""
        loop = self._loop
        parked = len(self._parked)
        if loop is None:
            return parked
        slots: list[BatchSlot] = loop.slots  # type: ignore[assignment]
        return sum(len(s.batch) for s in slots if s.work is not None) + parked

    def close(self, timeout_s: float) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop(self.handler, timeout_s)  # type: ignore[arg-type]
            # Calls that swallowed the cancellation are frozen in the stopped loop: cut off,
            # not failed. Their records stay unsettled (their offsets uncommitted).
            for slot in loop.slots:
                assert isinstance(slot, BatchSlot)
                for w, attempt in zip(slot.batch, slot.attempts, strict=False):
                    self.lifecycle.requeue(w, attempt)
        for p in self._parked:
            self.lifecycle.requeue(p.work, p.attempt)
        self._parked = []


class _BatchLoop(_Loop):
    """One event loop thread and its batch tasks."""

    def __init__(self, pool: LoopPool, generation: int) -> None:
        super().__init__(pool, generation)
        self.slots = [BatchSlot() for _ in range(pool.size)]  # before start_slots()

    async def _serve(self, slot: BatchSlot) -> None:  # type: ignore[override]
        pool = self.pool
        handler: AsyncBatchHandler = pool.handler  # type: ignore[assignment]
        acall_batch = handler.acall_batch
        max_batch = handler.max_batch
        timeout_s = pool.timeout_s
        done = pool.completions.append
        scheduler = pool.scheduler
        lifecycle = pool.lifecycle
        claim = lifecycle.claim
        before_claim = lifecycle.hooks.before_claim
        lock = scheduler.lock
        take = scheduler.take_locked
        release = scheduler.release_locked
        held: list[Work] = []
        while not self.abandoned:
            self.sleepers += 1  # before the last look: a submit after it will wake us
            with lock:
                if held:
                    release(held)  # lanes of the successes: records chained behind them run
                held = take(max_batch)
            if not held:
                fut = self.loop.create_future()
                self._waiters.append(fut)
                await fut
                self.sleepers -= 1
                continue
            self.sleepers -= 1
            slot.held = held
            batch: list[Work] = []
            attempts: list[int] = []
            slot.batch, slot.attempts = batch, attempts
            for w in held:
                before_claim()
                attempt = claim(w, slot)
                if attempt:
                    batch.append(w)
                    attempts.append(attempt)
            if slot.abandoned:  # taken on a loop given up on (maybe while claiming)
                self._give_back(lifecycle, held, batch, attempts)
                return
            if not batch:
                continue
            slot.started = started = perf()
            n = len(batch)
            try:
                async with asyncio.timeout(timeout_s):
                    results = results_for(await acall_batch([w.msg for w in batch]), n)
            except TimeoutError:
                results = [timeout_result(timeout_s)] * n
            except asyncio.CancelledError:
                if slot.abandoned:
                    return  # the watchdog gave up on this loop: the pool owns the records
                if self.abandoned or self.loop.is_closed():
                    # the pool is closing: the call was cut off, not failed; the records stay
                    # unsettled and their offsets uncommitted (the next owner runs them)
                    for w, attempt in zip(batch, attempts, strict=True):
                        lifecycle.requeue(w, attempt)
                    return
                results = [timeout_result(timeout_s)] * n
            except BaseException as exc:  # adapters never raise; if one does, retry all
                results = [adapter_failure(exc)] * n
            if not complete(lifecycle, slot, batch, attempts, results, perf() - started, done):
                # abandoned: the pool owns the records it did not finish; the lanes of those
                # it did are released here (the watchdog hands back only running records)
                scheduler.release_settled(held)
                return
        if held:
            scheduler.release_settled(held)  # abandoned right after a call: its lanes move on

    def _give_back(
        self, lifecycle: Lifecycle, held: list[Work], batch: list[Work], attempts: list[int]
    ) -> None:
        """Records a task of an abandoned loop took: back in line, in order, before their
        call starts (the loop will not run it). A claimed one goes back only if the watchdog
        did not take it over already (it times it out or parks it itself)."""
        claimed = dict(zip(map(id, batch), attempts, strict=True))
        back = []
        for w in held:
            attempt = claimed.get(id(w))
            if attempt is None or lifecycle.requeue(w, attempt):
                back.append(w)
        self.pool.scheduler.requeue(back)

    def abandon(self, lifecycle: Lifecycle) -> list[tuple[Work, int, list[Work], int, float]]:
        """Give up on this loop: every record of its batch calls still running, one by one
        (record, attempt, [record], 0, call start), so ``LoopPool.watchdog`` times out or
        parks each record of a call as it does single records."""
        self.abandoned = True
        running = []
        with lifecycle.lock:
            for slot in self.slots:
                assert isinstance(slot, BatchSlot)
                slot.abandoned = True
                for w, attempt in running_of(lifecycle, slot):
                    running.append((w, attempt, [w], 0, slot.started))
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        return running
