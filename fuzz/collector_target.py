"""Fuzz target: any record bytes, through the collector's native path and its steps.

Each input is one Kafka record value. Two processors take it: one with the C
extension's native path (wire bytes to store columns, ``spanmill._native``), one
that takes the Python steps for every record (the authority decodes, then translate,
redact, append).
They must store the same rows, send the same records to the dead-letter topic and
count the same redactions and translations; any difference, any exception out of
a processor and any sanitizer report is a finding. Run it through ``fuzz/run.py``,
which builds the extension with AddressSanitizer and UndefinedBehaviorSanitizer
first; libFuzzer's options (``-runs=N``, ``-max_total_time=S``, a corpus folder)
follow the target's own arguments.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from typing import Any

import atheris


def _load_native(path: str) -> None:
    """Make ``spanmill._native`` the extension at ``path`` (the sanitized build)."""
    spec = importlib.util.spec_from_file_location("spanmill._native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spanmill._native"] = module
    spec.loader.exec_module(module)


if os.environ.get("SPANMILL_FUZZ_NATIVE"):
    _load_native(os.environ["SPANMILL_FUZZ_NATIVE"])

# The Python side is instrumented too: coverage of which way a record took guides the
# fuzzer as much as the bytes it reads.
with atheris.instrument_imports(include=["spanmill"]):
    from spanmill import native
    from spanmill.collector.batch import BatchJob, BatchOutcome, BatchProcessor, ProcessingConfig
    from spanmill.store.layout import BatchId

BATCH = BatchId("spans", 0, 10, 10, "f")


class _Kept:
    """In place of the store writer: the batch's tables, kept for the comparison."""

    def __init__(self) -> None:
        self.tables: dict[Any, Any] = {}

    def write_batch(self, batch: BatchId, tables: dict[Any, Any]) -> list[str]:
        self.tables = tables
        return []


def _processor(root: str, *, native: bool) -> tuple[BatchProcessor, _Kept]:
    processor = BatchProcessor(ProcessingConfig(store_url=root), native=native)
    kept = _Kept()
    processor.writer = kept  # type: ignore[assignment]
    return processor, kept


_root = tempfile.mkdtemp(prefix="spanmill-fuzz-")
NATIVE, NATIVE_KEPT = _processor(_root, native=True)
STEPS, STEPS_KEPT = _processor(_root, native=False)


def _summary(outcome: BatchOutcome) -> tuple[Any, ...]:
    return (outcome.spans, outcome.dead, outcome.redactions, outcome.translations)


def test_one_input(data: bytes) -> None:
    NATIVE_KEPT.tables, STEPS_KEPT.tables = {}, {}
    job = BatchJob(BATCH, [10], [1_750_000_000_000], [data], [None])
    native, steps = NATIVE.process(job), STEPS.process(job)
    if _summary(native) != _summary(steps):
        raise AssertionError(f"outcomes differ: native {_summary(native)}, steps {_summary(steps)}")
    if NATIVE_KEPT.tables.keys() != STEPS_KEPT.tables.keys():
        hours = (NATIVE_KEPT.tables.keys(), STEPS_KEPT.tables.keys())
        raise AssertionError(f"hours differ: {hours[0]} {hours[1]}")
    for hour, table in STEPS_KEPT.tables.items():
        if not NATIVE_KEPT.tables[hour].equals(table):
            raise AssertionError(f"rows of {hour} differ")


def main() -> None:
    if native.module is None or NATIVE._native is None:
        raise SystemExit("the C extension spanmill._native is not built: nothing to fuzz")
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
