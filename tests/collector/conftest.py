"""Fixtures for collector tests: a fresh topic pair and group id per test."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from collector_helpers import Topics


@pytest.fixture
def topics(kafka: Any) -> Topics:
    """A fresh span topic, dead-letter topic and group id: tansu groups must not be reused."""
    suffix = uuid.uuid4().hex[:10]
    spans = kafka.create_topic(f"spans-{suffix}", 3)
    dlq = kafka.create_topic(f"spans-{suffix}.dlq", 1)
    return Topics(spans, dlq, f"collector-{suffix}", kafka.bootstrap_servers)
