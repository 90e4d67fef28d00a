"""The collector: the span topic into the span store, nothing lost, nothing twice.

- :class:`Collector` (:mod:`~spanmill.collector.loop`): the consume loop.
- :mod:`~spanmill.collector.batch`: decode, translate, redact and write a batch, in
  worker processes.
- :mod:`~spanmill.collector.consumers`: more consumer processes in one collector.
- :mod:`~spanmill.collector.translate`: OpenLLMetry and OpenInference into GenAI names.
- :mod:`~spanmill.collector.redact`: patterns and attribute lists, before anything is written.
- :mod:`~spanmill.collector.receiver`: OTLP/HTTP ``POST /v1/traces`` and
  ``POST /v1/feedback`` into the topic.
- :func:`run_collector` / :func:`main` (:mod:`~spanmill.collector.run`): the service.

How it is exactly-once for readers is told in :mod:`spanmill.store.writer`.
"""

from spanmill.collector.batch import BatchJob, BatchOutcome, BatchProcessor, ProcessingConfig
from spanmill.collector.loop import Collector, CollectorError
from spanmill.collector.redact import BUILTIN_RULES, Redactor
from spanmill.collector.translate import Translation

__all__ = [
    "BUILTIN_RULES",
    "BatchJob",
    "BatchOutcome",
    "BatchProcessor",
    "Collector",
    "CollectorError",
    "ProcessingConfig",
    "Redactor",
    "Translation",
    "main",
    "run_collector",
]


def __getattr__(name: str) -> object:
    # The service runner pulls in FastAPI and uvicorn: only when asked for.
    if name in ("main", "run_collector"):
        from spanmill.collector import run

        return getattr(run, name)
    raise AttributeError(name)
