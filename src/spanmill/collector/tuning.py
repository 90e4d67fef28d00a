"""Memory settings for a consumer process, made once as it starts.

A consumer process makes and drops objects and buffers at a steady, high rate:
kafka-python builds a record object per message, and each batch brings megabytes
of fetch responses and Arrow buffers. With the interpreter's and the C library's
defaults, much of a core goes to two things that do no work:

- the cyclic garbage collector, which runs every 700 allocations and now and then
  walks every object the process holds, modules and settings included;
- glibc's malloc, which hands freed memory back to the kernel at once, so the next
  batch's buffers are faulted in again, page by page.

Both matter to kafka-python alone as much as to the collector: the throughput
bench applies the same settings to its raw consumer, so that its ratio measures
the collector's own work.
"""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# Freed memory up to this much stays with the process for the next batch.
TRIM_THRESHOLD = 256 * 2**20
# The heap grows by at least this much at a time.
TOP_PAD = 64 * 2**20
# Blocks from this size up get their own mapping (glibc's ceiling on 64-bit); a fixed
# value also stops glibc raising its own threshold as large blocks come and go.
MMAP_THRESHOLD = 32 * 2**20
_MALLOC = (
    ("M_MMAP_THRESHOLD", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ("M_TOP_PAD", _M_TOP_PAD, TOP_PAD),
)
# Allocations between young-generation collections (the interpreter's default is 700).
GC_THRESHOLD = 20_000


def tune_process() -> list[str]:
    """Set the collector's memory settings for this process (call once, at its start).

    Returns the malloc settings the C library refused (all of them where it has no
    ``mallopt``).
    """
    # What the process holds once started lives as long as it does: no pass walks it.
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: its malloc keeps its defaults")
        return [name for name, _, _ in _MALLOC]
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    refused = [name for name, parameter, value in _MALLOC if mallopt(parameter, value) != 1]
    if refused:
        log.debug("the C library refused %s", ", ".join(refused))
    return refused
