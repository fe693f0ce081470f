"""Which topics the sidecar reads dead letters from: ``failed_topic`` and the error routes'
named dead-letter topics (``dlt:<topic>``), nothing else.

Both come from the deployment's settings, so a request can only name a topic this deployment
writes dead letters to: the sidecar reads with its own Kafka credentials, and a ``topic`` that
could name anything would let every API token read every topic those credentials reach.
"""

from __future__ import annotations

from retryd.config import Settings
from retryd.replay.errors import NotADeadLetterTopic


def dead_letter_topics(settings: Settings) -> tuple[str, ...]:
    """``failed_topic`` first, then the routes' dead-letter topics in the order of the
    routes (``RetryPlan.dlt_topics``)."""
    return (settings.failed_topic, *settings.plan.dlt_topics)


def source_topic(settings: Settings, topic: str | None) -> str:
    """The dead-letter topic a request reads: ``topic`` when it is one of
    ``dead_letter_topics``, ``failed_topic`` when None; raises NotADeadLetterTopic (400)
    naming the topics it may be."""
    if topic is None:
        return settings.failed_topic
    allowed = dead_letter_topics(settings)
    if topic not in allowed:
        raise NotADeadLetterTopic(
            f"topic {topic[:249]!r} is not a dead-letter topic of this deployment: give "
            f"failed_topic or a dlt: topic of error_routes ({', '.join(allowed)})"
        )
    return topic
