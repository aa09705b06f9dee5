"""The resource names in sorted order, kept as they come and go: what a List page reads.

Owns: ``SortedNames``, the names of a ``ResourceTable`` in blocks of sorted names (a block
splits when it doubles; an empty one goes), with the first name of each block in a list of its
own, so adding or removing a name costs two binary searches and a move of at most one block,
and a page starts in O(log n) and reads only the names it returns. ``ResourceTable`` keeps it
equal to its keys (state.py); a List page walks it (listing.py).
Must never: hold anything but the names (a str is shared with the table's key, so a name costs
a pointer here), or depend on the order names arrive in (every replica, whatever its history
or snapshot, holds the same sorted names).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

# Names per block, about: a block splits past twice this. Moving one block's pointers on an add
# or a removal (~8 KiB) stays far below the work of the entry itself, and a million names are
# ~1,000 blocks, so the search over the blocks' first names is ten steps.
BLOCK_NAMES = 512


class SortedNames:
    """Sorted distinct names: ``add`` (a name not held), ``discard``, and ``from_name``."""

    __slots__ = ("_blocks", "_firsts", "_count")

    def __init__(self, names: Iterable[str] = ()) -> None:
        ordered = sorted(names)
        self._blocks = [ordered[i:i + BLOCK_NAMES] for i in range(0, len(ordered), BLOCK_NAMES)]
        self._firsts = [block[0] for block in self._blocks]
        self._count = len(ordered)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        for block in self._blocks:
            yield from block

    def _block_of(self, name: str) -> int:
        """The block ``name`` belongs in: the last whose first name is not above it (or 0)."""
        return max(0, bisect_right(self._firsts, name) - 1)

    def add(self, name: str) -> None:
        """Add ``name``, which must not be held already (the table adds a key once)."""
        if not self._blocks:
            self._blocks.append([name])
            self._firsts.append(name)
        elif name > self._blocks[-1][-1]:  # past every name: a snapshot loads its names in order
            last = self._blocks[-1]
            last.append(name)
            if len(last) > 2 * BLOCK_NAMES:
                half = len(last) // 2
                self._blocks[-1:] = [last[:half], last[half:]]
                self._firsts[-1:] = [last[0], last[half]]
        else:
            i = self._block_of(name)
            block = self._blocks[i]
            insort(block, name)
            self._firsts[i] = block[0]
            if len(block) > 2 * BLOCK_NAMES:
                half = len(block) // 2
                self._blocks[i:i + 1] = [block[:half], block[half:]]
                self._firsts[i:i + 1] = [block[0], block[half]]
        self._count += 1

    def discard(self, name: str) -> None:
        """Remove ``name`` if held."""
        if not self._blocks:
            return
        i = self._block_of(name)
        block = self._blocks[i]
        j = bisect_left(block, name)
        if j == len(block) or block[j] != name:
            return
        del block[j]
        self._count -= 1
        if not block:
            del self._blocks[i]
            del self._firsts[i]
        else:
            self._firsts[i] = block[0]

    def from_name(self, start: str, *, inclusive: bool) -> Iterator[str]:
        """The names from ``start`` on, in order (``start`` itself only if ``inclusive``)."""
        if not self._blocks:
            return
        i = self._block_of(start)
        block = self._blocks[i]
        j = bisect_left(block, start) if inclusive else bisect_right(block, start)
        yield from block[j:]
        for block in self._blocks[i + 1:]:
            yield from block
