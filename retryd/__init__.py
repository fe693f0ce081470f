"""retryd: retry-topic orchestration for Apache Kafka."""

from retryd.errors import NonRetryableError, RetrydError
from retryd.outcomes import Dead, Retry

__version__ = "0.1.0"

__all__ = ["Dead", "NonRetryableError", "Retry", "RetrydError", "__version__"]
