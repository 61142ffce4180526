"""Radix-tree prefix cache over KV pages. Plain Python (no torch).

The tree maps token-id prefixes to the KV pages that hold them, at page granularity: every
edge key is a whole number of pages (`len(key) == len(pages) * page_size`), so a cached page is
only ever shared whole. Requests lock the path they reuse (lock_ref > 0 means in use); unlocked
leaves are evicted least-recently-used first when the allocator runs dry.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence


class RadixNode:
    __slots__ = ("children", "parent", "key", "pages", "lock_ref", "last_access")

    def __init__(self, parent: RadixNode | None, key: tuple[int, ...], pages: list[int]):
        self.children: dict[tuple[int, ...], RadixNode] = {}  # keyed by the child's first page
        self.parent = parent
        self.key = key  # token ids on the edge from parent to this node
        self.pages = pages  # one page id per page_size tokens of key
        self.lock_ref = 0
        self.last_access = 0


@dataclass
class PrefixMatch:
    pages: list[int]  # cached pages covering the matched prefix, in order
    node: RadixNode  # deepest matched node; lock it while the pages are in use

    @property
    def num_pages(self) -> int:
        return len(self.pages)


class RadixCache:
    """Prefix cache: match, insert, lock/unlock, LRU eviction of unlocked leaves."""

    def __init__(self, page_size: int, free_pages: Callable[[list[int]], None]):
        self.page_size = page_size
        self._free_pages = free_pages  # gives evicted pages back to the allocator
        self.root = RadixNode(None, (), [])
        self.root.lock_ref = 1  # the root is never evicted
        self._clock = itertools.count(1)
        self.cached_pages = 0  # pages held by the tree
        self.evictable_pages = 0  # of those, pages in unlocked nodes

    # ---- lookup -------------------------------------------------------------------------
    def _first_page(self, tokens: Sequence[int], start: int = 0) -> tuple[int, ...]:
        return tuple(tokens[start : start + self.page_size])

    def _common_pages(self, node: RadixNode, tokens: Sequence[int], start: int) -> int:
        """Number of leading whole pages of node.key equal to tokens[start:]."""
        ps, matched = self.page_size, 0
        while matched < len(node.pages):
            lo = start + matched * ps
            page_tokens = tuple(tokens[lo : lo + ps])
            if len(page_tokens) < ps or page_tokens != node.key[matched * ps : (matched + 1) * ps]:
                break
            matched += 1
        return matched

    def match_prefix(self, tokens: Sequence[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix of `tokens`; splits a node when matched partway."""
        node, pos, pages = self.root, 0, []
        stamp = next(self._clock)
        while pos + self.page_size <= len(tokens):
            child = node.children.get(self._first_page(tokens, pos))
            if child is None:
                break
            matched = self._common_pages(child, tokens, pos)
            if matched < len(child.pages):
                child = self._split(child, matched)
            child.last_access = stamp
            pages.extend(child.pages)
            pos += matched * self.page_size
            node = child
        return PrefixMatch(pages, node)

    def _split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages; returns the new upper half."""
        cut = num_pages * self.page_size
        parent = node.parent
        assert parent is not None and 0 < num_pages < len(node.pages)
        upper = RadixNode(parent, node.key[:cut], node.pages[:num_pages])
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        parent.children[self._first_page(upper.key)] = upper
        node.parent, node.key, node.pages = upper, node.key[cut:], node.pages[num_pages:]
        upper.children[self._first_page(node.key)] = node
        return upper

    # ---- insert -------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> int:
        """Cache `pages` for `tokens` (whole pages only); returns how many leading pages were
        already cached. The caller frees its own copies of those that differ from the tree's."""
        if len(tokens) != len(pages) * self.page_size:
            raise ValueError(f"{len(tokens)} tokens do not fill {len(pages)} pages of {self.page_size}")
        node, pos, done = self.root, 0, 0
        stamp = next(self._clock)
        while done < len(pages):
            child = node.children.get(self._first_page(tokens, pos))
            if child is None:
                leaf = RadixNode(node, tuple(tokens[pos:]), list(pages[done:]))
                leaf.last_access = stamp
                node.children[self._first_page(leaf.key)] = leaf
                self.cached_pages += len(leaf.pages)
                self.evictable_pages += len(leaf.pages)
                break
            matched = self._common_pages(child, tokens, pos)
            if matched < len(child.pages):
                child = self._split(child, matched)
            child.last_access = stamp
            node, pos, done = child, pos + matched * self.page_size, done + matched
        return done

    # ---- locking ------------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        """Pin the path root..node so eviction keeps it (one lock per request using it)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("radix node unlocked more often than locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_pages += len(node.pages)
            node = node.parent

    # ---- eviction -----------------------------------------------------------------------
    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages from unlocked leaves (LRU first) if possible;
        returns how many were freed."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            self._free_pages(leaf.pages)
            freed += len(leaf.pages)
            self.cached_pages -= len(leaf.pages)
            self.evictable_pages -= len(leaf.pages)
            del parent.children[self._first_page(leaf.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def flush(self) -> int:
        """Drop every cached page no request holds (the whole tree when none is locked, as on an
        idle engine: /flush_cache); returns how many pages went back to the allocator.

        NOTE: a lock pins the whole path up to the root, so every unlocked node's subtree is
        unlocked too; evicting all evictable pages therefore removes exactly the unlocked nodes."""
        return self.evict(self.evictable_pages) if self.evictable_pages else 0

    def _leaves(self) -> list[RadixNode]:
        leaves, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                leaves.append(node)
        return leaves
