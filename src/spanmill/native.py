"""spanmill's C extension (:mod:`spanmill._native`), where the package has it.

It holds the collector's hot paths: decoding OTLP protobuf into span parts and
turning span parts into store columns. ``pip install`` compiles it when a C
compiler is at hand; without one the package installs all the same, and the
collector decodes every record with the span decoder and appends rows in
Python, which gives the same results more slowly.
``spanmill collector`` logs which it runs. The modules that use it configure it
(:mod:`spanmill.collector.decode`, :mod:`spanmill.store.rows`).
"""

from __future__ import annotations

import importlib
from types import ModuleType


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("spanmill._native")
    except ImportError:
        return None


module: ModuleType | None = _load()
