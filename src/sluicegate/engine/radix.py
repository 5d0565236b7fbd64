"""A radix tree over the prompt tokens each slot's KV holds: longest shared prefix at token granularity.

Every slot's cached prompt is one path from the root; a node is an edge of token ids shared by the same
set of slots (`holders`, its reference count). Edges split where paths diverge or end and merge back when
a split is no longer needed, so a node with one child always has more holders than that child. Holder
sets shrink going down a path, which gives two cheap questions:

- `common_prefixes(ids)`: for every slot, how many leading tokens of `ids` its KV holds (one walk);
- `unique_from(slot)`: from which position on the slot alone holds its path (what evicting it loses).

Hand-written because the KV lives in llama.cpp's per-slot streams, not in pages the tree could own (as in
SGLang's RadixCache or vLLM's block pool): the tree is an index over the slots, and the slot table
(prefix_cache.py) turns its answers into KV copies and truncations. Token ids are compared as Python lists
(slice equality runs in C); a mismatching edge is scanned token by token.
"""

from __future__ import annotations

from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "holders", "parent", "start", "tokens")

    def __init__(self, tokens: list[int], parent: _Node | None, start: int) -> None:
        self.tokens = tokens  # the edge from the parent
        self.parent = parent
        self.start = start  # depth (tokens from the root) where the edge begins
        self.children: dict[int, _Node] = {}  # by first token
        self.holders: set[int] = set()  # slots whose path runs through this edge

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def _shared(edge: list[int], ids: Sequence[int], pos: int, upto: int) -> int:
    """How many leading tokens of `edge` equal `ids[pos:upto]`."""
    n = min(len(edge), upto - pos)
    part = ids[pos : pos + n]
    if edge[:n] == (part if isinstance(part, list) else list(part)):
        return n
    k = 0
    while k < n and edge[k] == ids[pos + k]:
        k += 1
    return k


class RadixTree:
    def __init__(self, n_slots: int) -> None:
        self.root = _Node([], None, 0)
        self._end: list[_Node] = [self.root] * n_slots  # the node each slot's path ends at
        self.n_nodes = 0  # edges in the tree (the root excluded)

    def length(self, slot: int) -> int:
        return self._end[slot].end

    def tokens(self, slot: int) -> list[int]:
        """The slot's path (for tests and debugging)."""
        parts: list[list[int]] = []
        node: _Node | None = self._end[slot]
        while node is not None:
            parts.append(node.tokens)
            node = node.parent
        return [t for part in reversed(parts) for t in part]

    def common_prefixes(self, ids: Sequence[int]) -> dict[int, int]:
        """For every slot sharing at least one leading token with `ids`: how many it shares."""
        out: dict[int, int] = {}
        node, pos = self.root, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            k = _shared(child.tokens, ids, pos, len(ids))
            pos += k
            for slot in child.holders:
                out[slot] = pos
            if k < len(child.tokens):
                break
            node = child
        return out

    def unique_from(self, slot: int) -> int:
        """The position from which no other slot holds the slot's path (its length if none is its own)."""
        node = self._end[slot]
        while node is not self.root and node.holders == {slot}:
            assert node.parent is not None
            node = node.parent
        return node.end

    def extend(self, slot: int, ids: Sequence[int], upto: int) -> None:
        """The slot's path, a prefix of `ids`, becomes `ids[:upto]`."""
        node, pos = self._end[slot], self.length(slot)
        while pos < upto:
            if node is not self.root and not node.children and node.holders == {slot}:
                node.tokens.extend(ids[pos:upto])  # the slot's own leaf grows
                break
            child = node.children.get(ids[pos])
            if child is None:
                leaf = _Node(list(ids[pos:upto]), node, pos)
                leaf.holders.add(slot)
                node.children[ids[pos]] = leaf
                self.n_nodes += 1
                node = leaf
                break
            k = _shared(child.tokens, ids, pos, upto)
            node = self._split(child, k) if k < len(child.tokens) else child
            node.holders.add(slot)
            pos += k
        self._end[slot] = node
        while node is not self.root:  # an edge this slot now shares may merge with its parent
            assert node.parent is not None
            parent = node.parent
            self._merge(parent)
            node = parent

    def truncate(self, slot: int, n: int) -> None:
        """The slot's path keeps its first `n` tokens (0: the slot holds nothing)."""
        node = self._end[slot]
        touched: list[_Node] = []
        while node is not self.root and node.start >= n:
            assert node.parent is not None
            node.holders.discard(slot)
            parent = node.parent
            if not node.holders:
                del parent.children[node.tokens[0]]
                self.n_nodes -= 1
            else:
                touched.append(node)
            node = parent
        if node.end > n:  # ends inside this edge: split it there
            lower = node
            node = self._split(lower, n - lower.start)
            lower.holders.discard(slot)
            if not lower.holders:
                del node.children[lower.tokens[0]]
                self.n_nodes -= 1
            else:
                touched.append(lower)
        self._end[slot] = node
        for t in [*touched, node]:
            if t.parent is not None and t.parent.children.get(t.tokens[0]) is t:
                self._merge(t)

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut `node`'s edge after `k` tokens; returns the new upper part (same holders)."""
        assert node.parent is not None and 0 < k < len(node.tokens)
        upper = _Node(node.tokens[:k], node.parent, node.start)
        upper.holders = set(node.holders)
        node.parent.children[upper.tokens[0]] = upper
        node.tokens = node.tokens[k:]
        node.start += k
        node.parent = upper
        upper.children[node.tokens[0]] = node
        self.n_nodes += 1
        return upper

    def _merge(self, node: _Node) -> None:
        """Fold `node`'s only child into it when both have the same holders (no path ends between them)."""
        if node is self.root or len(node.children) != 1:
            return
        (child,) = node.children.values()
        if child.holders != node.holders:
            return
        node.tokens.extend(child.tokens)
        node.children = child.children
        for c in node.children.values():
            c.parent = node
        for slot in child.holders:
            if self._end[slot] is child:
                self._end[slot] = node
        self.n_nodes -= 1

    def check(self) -> None:
        """Assert the tree's invariants (tests)."""
        seen = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                seen += 1
                assert child.parent is node and child.tokens and child.tokens[0] == first
                assert child.start == node.end and child.holders
                assert node is self.root or child.holders <= node.holders
                only = list(child.children.values())
                assert not (len(only) == 1 and only[0].holders == child.holders), "an edge left unmerged"
                stack.append(child)
        assert seen == self.n_nodes
        for slot, end in enumerate(self._end):
            up: _Node | None = end
            while up is not None and up is not self.root:
                assert slot in up.holders
                up = up.parent
