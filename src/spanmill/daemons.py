"""Work on daemon threads: a call that may never return (an agent's tool, a Kafka client
waiting on lost brokers) is left behind at its caller's bound, and does not keep the
process alive at its exit, as a ThreadPoolExecutor's threads, joined then, would."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def on_daemon_threads(
    call: Callable[[Item], Result], items: Sequence[Item], threads: int
) -> list[Future[Result]]:
    """``call`` on each item, ``threads`` at a time; a future for each, in order. A future
    cancelled before its call began is skipped."""
    futures: list[Future[Result]] = [Future() for _ in items]
    queued: queue.SimpleQueue[tuple[Item, Future[Result]]] = queue.SimpleQueue()
    for pair in zip(items, futures, strict=True):
        queued.put(pair)

    def work() -> None:
        while True:
            try:
                item, future = queued.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it began
            try:
                future.set_result(call(item))
            except BaseException as exc:
                future.set_exception(exc)

    for n in range(max(1, min(threads, len(items)))):
        threading.Thread(target=work, name=f"daemon-{n}", daemon=True).start()
    return futures
