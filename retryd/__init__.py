"""retryd: retry-topic orchestration for Apache Kafka."""

from retryd.errors import NonRetryableError, RetrydError

__version__ = "0.1.0"

__all__ = ["NonRetryableError", "RetrydError", "__version__"]
