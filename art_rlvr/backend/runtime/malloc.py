"""Keeping a long training process's memory flat under glibc, without kernel time."""

from __future__ import annotations

import ctypes
import functools
import sys

# Activations of a microbatch (a few MB at most here) are reused from the heap; logits-sized
# buffers (tens of MB) are mapped and unmapped.
MMAP_THRESHOLD = 4 * 1024 * 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def pin_malloc_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Stop glibc from raising its mmap threshold as large tensors are freed.

    By default glibc raises the threshold after each free of an mmapped block, so later
    logits-sized buffers (tens of MB, varying shapes every step) land on the heap and are never
    returned: RSS grew by ~1 GB per training step here. A fixed threshold keeps them mapped.
    It was 64 KB until 2026-11-23: then every activation was a fresh mapping whose pages the
    kernel zeroed, and a third of a training step's CPU time was kernel time
    (`benchmarks/malloc_threshold.py`).
    """
    libc = _libc()
    return bool(libc and libc.mallopt(-3, threshold))  # -3 is M_MMAP_THRESHOLD


def release_free_memory() -> bool:
    """Return the heap's free pages to the system (`malloc_trim`): called after a training
    step and when the engine goes idle, it keeps RSS flat as the heap's free blocks fragment."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0))
