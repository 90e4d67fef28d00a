"""The paired bootstrap: how sure the difference between two models on the same items is."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean


@dataclass(frozen=True)
class Interval:
    """A difference (challenger minus champion) and its confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def bootstrap_difference(
    challenger: Sequence[float],
    champion: Sequence[float],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile interval of mean(challenger - champion), items resampled in pairs.

    Both models answered the same items, so pairs are resampled together: the
    spread of item difficulty cancels out and the interval is much tighter than
    two independent ones.
    """
    if len(challenger) != len(champion):
        raise ValueError(f"paired values differ in length: {len(challenger)} vs {len(champion)}")
    differences = [a - b for a, b in zip(challenger, champion, strict=True)]
    if not differences:
        return Interval(0.0, 0.0, 0.0, confidence)
    rng = random.Random(seed)
    n = len(differences)
    means = sorted(fmean(rng.choices(differences, k=n)) for _ in range(resamples))
    tail = (1.0 - confidence) / 2
    low = means[int(tail * (resamples - 1))]
    high = means[round((1.0 - tail) * (resamples - 1))]
    return Interval(fmean(differences), low, high, confidence)
