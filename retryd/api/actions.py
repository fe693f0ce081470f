"""What a replay request does, shared by ``/v1`` and the explorer's pages (``/ui``), so both go
through the same code, limits and audit trail. Blocking: callers run these on a thread of the
request's bulkhead (``retryd.api.limits.offload``)."""

from __future__ import annotations

from retryd.api.state import Sidecar
from retryd.replay import audit
from retryd.replay.browse import read_record
from retryd.replay.jobs import JobSpec, ReplayJob
from retryd.replay.replayer import ReplayOutcome


def replay_one(
    sc: Sidecar,
    partition: int,
    offset: int,
    *,
    topic: str,
    target: str | None,
    force: bool,
    actor: str,
) -> ReplayOutcome:
    """Replay the dead letter at ``topic``/``partition``/``offset`` once (the ledger, the rate
    ceiling and the audit line are the replayer's)."""
    rec = read_record(sc.pool, partition, offset, sc.timeout_s, topic)
    sc.ready_ledger(refresh=False)  # replay() re-reads it right before deciding
    return sc.replayer.replay(rec, target=target, force=force, actor=actor)


def start_job(sc: Sidecar, spec: JobSpec) -> ReplayJob:
    """Check the target, start a bulk job (or dry run) and write its ``job_created`` audit
    line; raises TooManyJobs past the process's limit of running jobs."""
    if spec.target is not None:
        sc.policy.require_allowed(spec.target)
        sc.policy.require_existing(spec.target)
    sc.ready_ledger(refresh=False)  # the job reads it to the end when it starts
    job = sc.jobs.create(spec)
    flt = spec.filter
    audit.job_event(
        "created",
        actor=spec.actor,
        job=job.id,
        topic=spec.topic,
        target=spec.target,
        filter=",".join(f"{k}:{v}" for k, v in flt.describe().items()) or None,
        max_per_second=spec.max_per_second,
        max_messages=spec.max_messages,
        dry_run=spec.dry_run,
        force=spec.force,
    )
    return job


def cancel_job(job: ReplayJob, actor: str) -> None:
    """Ask a job to stop (it stops after its copies in flight have an outcome); a running
    one gets its ``job_cancelled`` audit line."""
    if not job.finished:
        audit.job_event("cancelled", actor=actor, job=job.id)
    job.cancel()
