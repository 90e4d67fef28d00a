"""The collector with a team's own redaction patterns, against the built-in rules alone.

The bench's GenAI chat call (:mod:`bench.foreign_conventions`), one span a record,
through :class:`BatchProcessor` with the default settings and one custom pattern more:
one whose matches all hold a literal (an employee id, ``EMP-``), one whose literals are
dashes but whose matches hold a run of nine digits (an SSN), one that ignores case (a
password, scanned for as every casing of ``wor``), and one with neither a literal nor
digits (a word of twenty lowercase letters or more), which sends every record through
the Python steps, and that one again on the authority's path (the native decoder left
out). The span holds none of them, as most spans do. Printed: microseconds a span, best
of the rounds (alternating), and each set-up's ratio to the built-in rules alone.
"""

from __future__ import annotations

import tempfile

from bench.foreign_conventions import SPANS, genai, records, run
from spanmill.collector.batch import BatchProcessor, ProcessingConfig
from spanmill.config import CollectorSettings

ROUNDS = 6
CASES: dict[str, dict[str, str]] = {
    "built-in rules": {},
    "+ EMP-\\d{6}": {"employee_id": r"\bEMP-\d{6}\b"},
    "+ ^\\d{3}-\\d{2}-\\d{4}$": {"ssn": r"^\d{3}-\d{2}-\d{4}$"},
    "+ (?i)password=\\S+": {"password": r"(?i)password\s*[:=]\s*\S+"},
    "+ \\b[a-z]{20,}\\b": {"word": r"\b[a-z]{20,}\b"},
}


def main() -> None:
    values = records(genai)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        processors = {
            name: BatchProcessor(
                ProcessingConfig.from_settings(
                    CollectorSettings(
                        store_url=folder, receiver_enabled=False, redact_patterns=patterns
                    )
                )
            )
            for name, patterns in CASES.items()
        }
        # The last pattern on the authority's path, which every record took before such a
        # pattern's rows were marked for the steps by the native decoder.
        last = list(CASES.values())[-1]
        processors["  the same, authority"] = BatchProcessor(
            ProcessingConfig.from_settings(
                CollectorSettings(store_url=folder, receiver_enabled=False, redact_patterns=last)
            ),
            native=False,
        )
        first = 0
        names = list(processors)
        for round_ in range(ROUNDS):
            # Each set-up first in turn: the first of a round runs a little slower.
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                seconds, _ = run(processors[name], values, first)
                first += len(values)
                best[name] = min(best.get(name, seconds), seconds)
    base = best["built-in rules"]
    print(f"{SPANS:,} GenAI spans, one a record, default settings and one pattern more")
    for name, seconds in best.items():
        path = "native" if processors[name]._native is not None else "authority"
        print(
            f"  {name:24} {seconds / SPANS * 1e6:7.1f} us a span  "
            f"x{seconds / base:5.1f} of the built-in rules alone  ({path})"
        )


if __name__ == "__main__":
    main()
