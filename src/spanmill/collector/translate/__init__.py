"""Foreign conventions into the one schema, at the edge: one translator per convention.

Each translator rewrites a span's attributes in place into the GenAI semantic
conventions (see :mod:`spanmill.semconv`) and says whether it found anything to
translate. Native GenAI attributes always win over translated ones. Everything
after the collector's decoding — redaction, the store, the dataset builder — sees
only the GenAI names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from spanmill.collector.translate import openinference, openllmetry

Translator = Callable[[dict[str, Any]], bool]
TRANSLATORS: Final[dict[str, Translator]] = {
    openllmetry.NAME: openllmetry.translate,
    openinference.NAME: openinference.translate,
}
# The keys whose presence marks a span as each convention's; a translator finds
# nothing to do on a span without any of its convention's.
SIGNATURES: Final[dict[str, frozenset[str]]] = {
    openllmetry.NAME: openllmetry.SIGNATURE,
    openinference.NAME: openinference.SIGNATURE,
}


class Translation:
    """The translators a collector is configured with, applied in order."""

    def __init__(self, conventions: Sequence[str] = tuple(TRANSLATORS)) -> None:
        unknown = [name for name in conventions if name not in TRANSLATORS]
        if unknown:
            raise ValueError(f"unknown conventions {unknown}; known: {sorted(TRANSLATORS)}")
        self.steps = [(name, TRANSLATORS[name]) for name in conventions]
        # Keys one of which every translator needs to see: most spans have none of them.
        self.signature = frozenset().union(*(SIGNATURES[name] for name in conventions))

    def apply(self, attributes: dict[str, Any], counts: dict[str, int]) -> bool:
        """Translate in place; whether any translator changed something."""
        if self.signature.isdisjoint(attributes):
            return False
        changed = False
        for name, step in self.steps:
            if step(attributes):
                counts[name] = counts.get(name, 0) + 1
                changed = True
        return changed


__all__ = ["TRANSLATORS", "Translation", "Translator"]
