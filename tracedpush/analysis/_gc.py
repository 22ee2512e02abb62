"""Keep the cyclic garbage collector off the objects a report builds.

Loading and analysing create hundreds of thousands of dicts and dataclasses that hold
no reference cycles. Left alone, the collector rescans all of them on every older-
generation pass (and once more in one long pause when re-enabled), which made a
10,000-request report several times slower. So it is paused while they are built, and
what survived is moved to the permanent generation (`gc.freeze`): never rescanned,
still freed by reference counting when dropped.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
