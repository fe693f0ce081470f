"""Which topics the sidecar reads dead letters from: ``failed_topic``, the error routes'
named dead-letter topics (``dlt:<topic>``) and other systems' dead-letter topics named in
``foreign_dead_letters`` (read through ``retryd.policy.foreign``), nothing else.

Both come from the deployment's settings, so a request can only name a topic this deployment
writes dead letters to: the sidecar reads with its own Kafka credentials, and a ``topic`` that
could name anything would let every API token read every topic those credentials reach.
"""

from __future__ import annotations

from retryd.config import Settings
from retryd.policy.foreign import ForeignFormat, TopicFormat, parse_format
from retryd.replay.errors import NotADeadLetterTopic


def foreign_formats(settings: Settings) -> dict[str, TopicFormat]:
    """``foreign_dead_letters`` as topic -> format (validated with the settings)."""
    return {topic: parse_format(name) for topic, name in settings.foreign_dead_letters.items()}


def topic_format(settings: Settings, topic: str) -> TopicFormat:
    """How the dead letters of ``topic`` are read: retryd's own unless it is foreign."""
    return foreign_formats(settings).get(topic, ForeignFormat.RETRYD)


def dead_letter_topics(settings: Settings) -> tuple[str, ...]:
    """``failed_topic`` first, then the routes' dead-letter topics in the order of the
    routes (``RetryPlan.dlt_topics``), then the foreign dead-letter topics."""
    routes = settings.plan.dlt_topics
    foreign = [t for t in settings.foreign_dead_letters if t not in routes]
    return (settings.failed_topic, *routes, *foreign)


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
            f"failed_topic, a dlt: topic of error_routes or a topic of foreign_dead_letters "
            f"({', '.join(allowed)})"
        )
    return topic
