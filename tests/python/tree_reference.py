"""Draft trees as plain lists, for the tree tests (test_trees.py, test_batch_trees.py,
test_torch_pool_trees.py): a tree is its parents list (parents[0] = -1, then
0 <= parents[i] < i, docs/trees.md), an accepted path a list of node ids from the root."""

from __future__ import annotations

import numpy as np


def depths(parents: list[int]) -> list[int]:
    """Each node's depth (the root's is 0): its position is length + depth."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def ancestors_or_self(parents: list[int], i: int) -> set[int]:
    """Node i and every node on its way to the root: what i may see of its tree."""
    out = set()
    while i >= 0:
        out.add(i)
        i = parents[i]
    return out


def main_line(parents: list[int]) -> list[int]:
    """The root, its first child, that child's first child, ...: the nodes kvcore writes in place."""
    line = [0]
    while True:
        kids = [k for k in range(len(parents)) if parents[k] == line[-1]]
        if not kids:
            return line
        line.append(kids[0])


def random_tree(rng: np.random.Generator, n: int) -> tuple[list[int], list[int]]:
    """(parents, an accepted root path) of a random tree of n nodes: chains (40% of the
    nodes extend the one before) and bushes; the path often takes first children."""
    parents = [-1] + [int(i - 1 if rng.random() < 0.4 else rng.integers(0, i)) for i in range(1, n)]
    path = [0]
    while rng.random() < 0.8:
        children = [c for c in range(n) if parents[c] == path[-1]]
        if not children:
            break
        path.append(children[0] if rng.random() < 0.3 else int(rng.choice(children)))
    return parents, path
