"""Arrays reused by searches instead of allocated for each.

The server has glibc serve every block of 128 KB or more from a mapping of its own, given
back when freed (process_memory.py: it keeps bulk loads' transient buffers from staying
resident). A search that allocates a large temporary array therefore pays a page fault for
every 4 KB page it touches, and the unmapping interrupts the other cores: under the C 8
mix at 100k rows, page faults were 10.6 % of the server's CPU (perf), most of them in the
full-text leg's dense score array (0.8 MB a search) and the scope vectors' float32
conversion (1.5 MB a chunk). A few such arrays kept here cost their size once.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt


class ScratchArrays:
    """A bounded pool of arrays of one dtype. An array taken is the caller's alone until
    given back; its contents are whatever its last user left (callers that need zeros keep
    them zeroed themselves). Thread-safe."""

    def __init__(self, dtype: type[np.generic], kept: int):
        self.dtype = np.dtype(dtype)
        self.kept = kept
        self._lock = threading.Lock()
        self._free: list[npt.NDArray[Any]] = []

    def take(self, rows: int, *rest: int) -> npt.NDArray[Any]:
        """An array of shape (at least `rows`, *rest): a kept one if one is large enough,
        else a new zeroed one. Kept arrays too small are dropped on the way."""
        with self._lock:
            while self._free:
                a = self._free.pop()
                if a.shape[0] >= rows and a.shape[1:] == rest:
                    return a
        return np.zeros((rows, *rest), self.dtype)

    def give_back(self, a: npt.NDArray[Any]) -> None:
        """Keep `a` for a later caller (up to `kept` arrays; beyond that it is freed)."""
        with self._lock:
            if len(self._free) < self.kept:
                self._free.append(a)

    def clear(self) -> None:
        """Free the kept arrays (sized for more than callers will ask from now on)."""
        with self._lock:
            self._free.clear()

    def held_bytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for a in self._free)
