"""The client's retry policy: which failures are retried, how long to wait, what to raise.

Owns: the classification of one failed attempt (retry? may it have applied? where next?)
and the backoff schedule. Must never: do I/O or sleep; the sync and async clients run the
loop and ask this module what to do.

The rules (DESIGN §4, the server's error contract):

- a definite refusal (Refused, InvalidArgument, AuthError, LimitExceeded, QuotaExceeded,
  EpochExhausted) is never retried: it changed nothing and would change nothing again;
- Overloaded (RESOURCE_EXHAUSTED/OVERLOADED) is back-pressure, not a refusal: nothing was
  applied, so it is retried after the backoff like NO_LEADER;
- UNAVAILABLE with NO_LEADER/NOT_LEADER/NO_QUORUM did not apply: retry anywhere, preferring
  the leader hint;
- OUTCOME_UNKNOWN, DEADLINE_EXCEEDED, CANCELLED and a transport UNAVAILABLE after the
  request may have been sent may have applied: retry with the **same op_id** (the server's
  dedup table returns the first outcome), or, for calls that are harmless to repeat, as is;
- when the attempts or the deadline run out after any maybe-applied attempt of a mutation,
  the answer is OutcomeUnknown, never a failure.
"""

from __future__ import annotations

import dataclasses
import enum
import random

from coordinator.client.exceptions import (
    FencingError,
    NoLeader,
    OutcomeUnknown,
    Overloaded,
    Unavailable,
    is_connect_failure,
)


class Kind(enum.Enum):
    """How a call may be retried."""

    READ = "read"  # changes nothing a caller can see (Describe, Read, Status, Snapshot)
    DEDUP = "dedup"  # a mutation carrying an op_id: retries reuse it and apply at most once
    REPEATABLE = "repeatable"  # harmless to apply twice (KeepAlive, SetEpochFloor)
    ONCE = "once"  # not safe to repeat blindly (Restore): retry only what surely did not apply


@dataclasses.dataclass(frozen=True)
class Verdict:
    retry: bool
    maybe_applied: bool  # this attempt may have changed state
    leader_hint: str = ""  # API address the server named as leader, if any


def classify(exc: FencingError, kind: Kind) -> Verdict:
    """What to do after one failed attempt that raised ``exc``."""
    if isinstance(exc, NoLeader):
        return Verdict(retry=True, maybe_applied=False, leader_hint=exc.leader_hint)
    if type(exc) is Unavailable:
        # Plain UNAVAILABLE: from the transport (no ErrorInfo) or an unknown reason. Only a
        # connection that never opened proves nothing was sent.
        maybe = kind is not Kind.READ and not is_connect_failure(exc)
        if maybe and kind is Kind.ONCE:
            return Verdict(retry=False, maybe_applied=True)
        return Verdict(retry=True, maybe_applied=maybe, leader_hint=exc.leader_hint)
    if isinstance(exc, Overloaded):
        return Verdict(retry=True, maybe_applied=False)
    if isinstance(exc, OutcomeUnknown):
        maybe = kind is not Kind.READ
        return Verdict(retry=kind is not Kind.ONCE, maybe_applied=maybe)
    # Refusals, invalid arguments, auth, limits and unexpected statuses.
    return Verdict(retry=False, maybe_applied=False)


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Bounded exponential backoff with jitter: attempt n waits in [d/2, d], d = base*2**n."""

    base_s: float
    max_s: float

    def delay_s(self, retry_number: int, rng: random.Random) -> float:
        ceiling = min(self.max_s, self.base_s * (2 ** min(retry_number, 30)))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)
