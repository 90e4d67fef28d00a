"""When a partition's log is taken for a new one: only once it has stayed shorter than
what was read of it, not for a moment's trailing high watermark."""

from __future__ import annotations

from spanmill.collector.loop import LogEnds


def test_a_high_watermark_that_trails_for_a_moment_is_no_new_log() -> None:
    # A new leader after a failover answers with an older high watermark, then catches up.
    ends = LogEnds(settle_s=10.0)
    assert not ends.settled(0, position=500, high=480, now=100.0)
    assert not ends.settled(0, position=500, high=480, now=104.0)
    assert not ends.settled(0, position=500, high=520, now=105.0)  # caught up
    # Shorter again later: the wait starts over.
    assert not ends.settled(0, position=530, high=400, now=112.0)
    assert not ends.settled(0, position=530, high=400, now=121.0)
    assert ends.settled(0, position=530, high=400, now=122.0)


def test_each_partition_waits_on_its_own_and_a_forgotten_one_starts_over() -> None:
    ends = LogEnds(settle_s=10.0)
    assert not ends.settled(0, position=10, high=0, now=0.0)
    assert not ends.settled(1, position=10, high=0, now=5.0)
    assert ends.settled(0, position=10, high=0, now=10.0)
    assert not ends.settled(1, position=10, high=0, now=10.0)
    ends.forget(0)  # reassigned, or taken for a new log already
    assert not ends.settled(0, position=10, high=0, now=11.0)
