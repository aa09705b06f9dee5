"""The leader's read-index rounds (Raft dissertation §6.4): which waiting reads a majority confirmed.

Owns: ``ReadRounds``, the bookkeeping of one leader term: each read waits on a round number
(``read_seq``) the leader sends only after the read arrived; followers echo the highest they
saw in that term; a read is confirmed once a majority of the configuration's counted voters
(the leader included, if it is one) echoed its round or a later one. Reads arriving while a
round is in flight share the next round: one heartbeat round per batch, not per read.
Must never: confirm a read from an echo of another term, from a round sent before the read
arrived, or from a member the caller did not name as a counted voter. Pure: no clock, no
thread, no pysyncobj (read_index.py drives it on the Raft thread).
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable


class ReadRounds:
    """One term's rounds; ``reset(term)`` at every new term or loss of leadership."""

    def __init__(self) -> None:
        self.term: int | None = None
        self.sent = 0  # the last round put on the wire in this term (0: none yet)
        self._echoed: dict[Hashable, int] = {}  # peer -> highest round it echoed in this term
        self._confirmed = 0  # highest round a majority echoed
        self._waiting: list[tuple[int, Any]] = []  # (round, read), rounds never decreasing

    def reset(self, term: int | None) -> list[Any]:
        """Start ``term`` (None: not leading) afresh; the reads that were waiting (to fail)."""
        dropped = [read for _, read in self._waiting]
        self.term, self.sent, self._echoed, self._confirmed, self._waiting = term, 0, {}, 0, []
        return dropped

    def add(self, term: int, read: Any) -> int:
        """Wait ``read`` on the next round not yet sent: every round sent so far may have left
        before it arrived, so none of them can confirm it. Returns that round."""
        if term != self.term:
            raise ValueError(f"a read of term {term} while the rounds follow term {self.term}")
        seq = self.sent + 1
        self._waiting.append((seq, read))
        return seq

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def in_flight(self) -> bool:
        """A round was sent that a majority has not confirmed yet."""
        return self._confirmed < self.sent

    @property
    def confirmed(self) -> int:
        """The highest round a majority echoed in this term (0: none)."""
        return self._confirmed

    def round_due(self) -> bool:
        """A read waits on a round not sent yet, and no round is in flight (else the waiting
        reads go with the next round, once the one in flight is confirmed)."""
        return bool(self._waiting) and self._waiting[-1][0] > self.sent and self._confirmed >= self.sent

    def start_round(self) -> int:
        """The round the appends about to go out carry."""
        self.sent += 1
        return self.sent

    def echo(self, term: int, peer: Hashable, seq: int) -> None:
        """``peer`` accepted this leader's append of round ``seq`` in ``term``."""
        if term != self.term or seq > self.sent:
            return  # another term's, or a round this leader never sent in this term: proves nothing
        if seq > self._echoed.get(peer, 0):
            self._echoed[peer] = seq

    def take_confirmed(self, counted_peers: Iterable[Hashable], self_counts: bool, voters: int) -> list[Any]:
        """The waiting reads a majority of ``voters`` confirmed, removed from the wait.

        ``counted_peers``: the other members whose echoes count now (the configuration's
        voters, at the incarnation it names); ``self_counts``: this leader is one of them
        too; ``voters``: how many voters the configuration has.
        """
        marks = [self._echoed.get(peer, 0) for peer in counted_peers]
        if self_counts:
            marks.append(self.sent)  # the leader holds every round it sent
        quorum = voters // 2 + 1
        if voters <= 0 or len(marks) < quorum:
            return []
        marks.sort(reverse=True)
        self._confirmed = max(self._confirmed, marks[quorum - 1])
        done = 0
        while done < len(self._waiting) and self._waiting[done][0] <= self._confirmed:
            done += 1
        confirmed = [read for _, read in self._waiting[:done]]
        del self._waiting[:done]
        return confirmed
