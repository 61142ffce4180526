"""Page allocator of the paged KV pool. Plain Python (no torch) so the scheduler is unit-testable.

The pool holds `num_pages` pages of `page_size` token slots each; token slot `i` of page `p`
lives at row `p * page_size + i` of every layer's K and V buffers. The allocator only hands
out page ids; the model runner owns the buffers.
"""

from __future__ import annotations

from typing import Iterable


class PageAllocator:
    """Free list of page ids with double-free detection."""

    def __init__(self, num_pages: int):
        if num_pages <= 0:
            raise ValueError(f"the KV pool needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        # NOTE: pop() from the end hands out low ids first, which keeps tests readable
        self._free = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def alloc(self, count: int) -> list[int] | None:
        """`count` page ids, or None (and nothing taken) when fewer are free."""
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        if count > len(self._free):
            return None
        free = self._free
        pages = free[len(free) - count:][::-1]  # NOTE: what `count` pop()s return, in one slice
        del free[len(free) - count:]
        is_free = self._is_free
        for page in pages:
            is_free[page] = False
        return pages

    def free(self, pages: Iterable[int]) -> None:
        for page in pages:
            if self._is_free[page]:
                raise RuntimeError(f"page {page} freed twice")
            self._is_free[page] = True
            self._free.append(page)
