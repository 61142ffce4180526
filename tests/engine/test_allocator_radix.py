"""Page allocator and radix cache: plain Python, no torch."""

from __future__ import annotations

import sys

import pytest

from sglaunch.engine.allocator import PageAllocator
from sglaunch.engine.radix_cache import RadixCache


def test_allocator_hands_out_and_takes_back_pages():
    alloc = PageAllocator(4)
    first = alloc.alloc(3)
    assert first == [0, 1, 2] and alloc.num_free == 1 and alloc.num_used == 3
    assert alloc.alloc(2) is None and alloc.num_free == 1  # all or nothing
    alloc.free([1])
    assert sorted(alloc.alloc(2)) == [1, 3]
    assert alloc.num_free == 0


def test_allocator_rejects_double_free_and_bad_sizes():
    alloc = PageAllocator(2)
    pages = alloc.alloc(1)
    alloc.free(pages)
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.free(pages)
    with pytest.raises(ValueError):
        PageAllocator(0)
    with pytest.raises(ValueError):
        alloc.alloc(-1)


def make_cache(num_pages: int, page_size: int) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages)
    return alloc, RadixCache(page_size, alloc.free)


def test_radix_match_insert_page_granular():
    alloc, cache = make_cache(16, page_size=2)
    pages = alloc.alloc(3)
    assert cache.insert([1, 2, 3, 4, 5, 6], pages) == 0
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).pages == pages
    # only whole pages match: [1,2,3] shares one full page
    assert cache.match_prefix([1, 2, 3, 9]).pages == pages[:1]
    assert cache.match_prefix([1]).pages == []
    assert cache.match_prefix([2, 1]).pages == []
    assert cache.cached_pages == 3 and cache.evictable_pages == 3


def test_radix_insert_reports_already_cached_prefix_and_splits():
    alloc, cache = make_cache(16, page_size=1)
    a = alloc.alloc(4)
    cache.insert([1, 2, 3, 4], a)
    b = alloc.alloc(3)
    # shares [1, 2] with the cached sequence: 2 pages already there (caller frees its copies)
    assert cache.insert([1, 2, 9], b) == 2
    assert cache.match_prefix([1, 2, 9]).pages == a[:2] + b[2:]
    assert cache.match_prefix([1, 2, 3, 4]).pages == a
    assert cache.cached_pages == 5


def test_radix_lock_protects_from_eviction_and_lru_order():
    alloc, cache = make_cache(8, page_size=1)
    old, new = alloc.alloc(2), alloc.alloc(2)
    cache.insert([1, 2], old)
    cache.insert([7, 8], new)
    held = cache.match_prefix([7, 8])
    cache.lock(held.node)
    assert cache.evictable_pages == 2
    assert cache.evict(10) == 2  # only the unlocked [1, 2]
    assert cache.match_prefix([1, 2]).pages == []
    assert alloc.num_free == 6
    cache.unlock(held.node)
    assert cache.evictable_pages == 2
    assert cache.evict(1) >= 1
    assert cache.cached_pages == 0 or cache.match_prefix([7, 8]).pages == []


def test_radix_eviction_prefers_least_recently_used():
    alloc, cache = make_cache(8, page_size=1)
    cache.insert([1], alloc.alloc(1))
    cache.insert([2], alloc.alloc(1))
    cache.match_prefix([1])  # touch [1]: [2] is now the LRU leaf
    cache.evict(1)
    assert cache.match_prefix([1]).num_pages == 1
    assert cache.match_prefix([2]).num_pages == 0


def test_radix_evicts_parents_after_children():
    alloc, cache = make_cache(8, page_size=1)
    cache.insert([1, 2, 3], alloc.alloc(3))
    cache.insert([1, 2, 4], [*cache.match_prefix([1, 2]).pages, *alloc.alloc(1)])
    assert cache.cached_pages == 4
    assert cache.evict(100) == 4
    assert alloc.num_free == 8 and cache.cached_pages == 0


def test_radix_split_keeps_locks_consistent():
    alloc, cache = make_cache(8, page_size=1)
    cache.insert([1, 2, 3, 4], alloc.alloc(4))
    whole = cache.match_prefix([1, 2, 3, 4])
    cache.lock(whole.node)
    part = cache.match_prefix([1, 2])  # splits the locked node
    cache.lock(part.node)
    cache.unlock(whole.node)
    assert cache.evictable_pages == 2  # [3, 4] unlocked, [1, 2] still held
    cache.unlock(part.node)
    assert cache.evictable_pages == 4
    with pytest.raises(RuntimeError):
        cache.unlock(part.node)


def test_radix_flush_frees_every_unlocked_page_and_keeps_held_paths():
    """/flush_cache's tree operation: branches and split nodes all go, the pool is whole again;
    a path a request holds (never on an idle engine, but flush must not break it) stays."""
    alloc, cache = make_cache(16, page_size=2)
    cache.insert([1, 2, 3, 4, 5, 6], alloc.alloc(3))
    cache.insert([1, 2, 3, 4, 7, 8], [*cache.match_prefix([1, 2, 3, 4]).pages, *alloc.alloc(1)])
    cache.insert([9, 9, 8, 8], alloc.alloc(2))
    assert cache.cached_pages == 6 and alloc.num_free == 10
    assert cache.flush() == 6
    assert alloc.num_free == 16 and cache.cached_pages == cache.evictable_pages == 0
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 0]).pages == [] and not cache.root.children
    assert cache.flush() == 0  # nothing cached: nothing to do
    cache.insert([1, 2, 3, 4], alloc.alloc(2))
    cache.insert([5, 6], alloc.alloc(1))
    held = cache.match_prefix([1, 2, 3, 4, 0])
    cache.lock(held.node)
    assert cache.flush() == 1  # only [5, 6]
    assert cache.match_prefix([1, 2, 3, 4, 0]).pages == held.pages and cache.evictable_pages == 0
    cache.unlock(held.node)
    assert cache.flush() == 2 and alloc.num_free == 16


def test_radix_insert_rejects_partial_pages():
    alloc, cache = make_cache(4, page_size=4)
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], alloc.alloc(1))


def test_torch_free_modules_do_not_import_torch():
    import subprocess

    code = (
        "import sys; import sglaunch, sglaunch.config, sglaunch.engine.interface, sglaunch.engine.allocator, "
        "sglaunch.engine.radix_cache, sglaunch.engine.request, sglaunch.engine.scheduler, sglaunch.engine.step, "
        "sglaunch.engine.model_spec, sglaunch.engine.launch; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
