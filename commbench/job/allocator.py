"""Steady memory allocation for CPU timings.

glibc's malloc serves large blocks with mmap below a threshold that it raises each time
such a block is freed; until it has, every large tensor costs fresh, page-faulting
memory. So a CPU worker speeds up once something has freed a large block (DDP's
buckets, say), and the compute-only reference measured before the run and after it
would differ for that reason alone. Fixing the thresholds at the start of a job puts
every measurement of the job in the same regime (PyTorch's CPU tuning guide makes the
same point for its allocator advice).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Dict, Optional

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic threshold on 64-bit machines
TRIM_THRESHOLD = 256 << 20  # keep freed memory for reuse rather than return it at once

applied: Optional[Dict[str, int]] = None  # what steady_malloc set (results record it)


def steady_malloc() -> Optional[Dict[str, int]]:
    """Fix glibc's thresholds for this process; what was set, or None (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    global applied
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        applied = {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
    return applied
