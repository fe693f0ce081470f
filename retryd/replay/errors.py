"""Errors of the replay layer; the HTTP API maps each class to one status code."""

from __future__ import annotations

from retryd.errors import RetrydError


class ReplayError(RetrydError):
    """Base of replay failures that carry a readable message for the caller."""


class RecordNotFound(ReplayError):
    """No failed record at that partition/offset (never written, deleted, or past the end)."""


class AlreadyReplayed(ReplayError):
    """The ledger says this record was replayed already; ``force`` replays it again."""

    def __init__(self, message: str, entry: object) -> None:
        super().__init__(message)
        self.entry = entry


class TargetRefused(ReplayError):
    """The target topic is outside the replay allow-list (or cannot be a target at all)."""


class InvalidTarget(TargetRefused):
    """No usable target: the record has no original topic, or the topic does not exist."""


class NothingToReplay(ReplayError):
    """The dead letter holds nothing to replay: another system dead-lettered its headers only
    (a share group without ``errors.deadletterqueue.copy.record.enable``)."""


class RecordTooLarge(NothingToReplay):
    """The target refuses the replayed copy for its size (the topic's ``max.message.bytes``,
    or the producer's ``message.max.bytes``), sent alone: nothing was written and the ledger
    has no entry. The API answers 422 ``too_large``; a job or a Spark replay skips the record
    with reason ``too_large`` and goes on."""

    reason = "too_large"


class InvalidRequest(ReplayError):
    """A request is well-formed but makes no sense here (bad cursor, unknown partition…)."""


class NotADeadLetterTopic(InvalidRequest):
    """A request names a topic to read that is neither ``failed_topic`` nor a dead-letter
    topic of an error route: the sidecar never reads any other topic."""


class BrokerUnavailable(ReplayError):
    """Kafka did not answer in time; nothing was changed."""


class ScanIncomplete(BrokerUnavailable):
    """A read that had to reach the end of a topic stopped at its deadline first: whatever was
    read is not the whole topic, so nothing may be decided from it (answer 503, retry later)."""


class LedgerMisconfigured(ReplayError):
    """The replay ledger topic exists but cannot keep its promise (e.g. it is not compacted)."""


class ShuttingDown(ReplayError):
    """The sidecar is shutting down: no new replay or job starts (503, retry elsewhere)."""


class RateLimited(ReplayError):
    """The sidecar's replay rate ceiling (``replay_max_per_second``) is reached (429)."""


class TargetReserved(TargetRefused):
    """The target is one of retryd's own topics or an internal ``__`` topic: never a target,
    whatever ``replay_allowlist`` says."""


class ReplayFailed(ReplayError):
    """Producing the replayed copy or its ledger record failed."""
