"""The collector's C extension (:mod:`spanmill.collector._otlp`), where the package has it.

``pip install`` compiles it when a C compiler is at hand; without one the package
installs all the same, and the collector uses its Python paths, which give the
same results more slowly. ``spanmill collector`` logs which it runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from spanmill.spans.record import MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_BYTES, MAX_NAME_CHARS
from spanmill.store.rows import SpanParts


def _load() -> ModuleType | None:
    try:
        module = importlib.import_module("spanmill.collector._otlp")
    except ImportError:
        return None
    module.configure(SpanParts, MAX_NAME_CHARS, MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_BYTES)
    return module


otlp: ModuleType | None = _load()
