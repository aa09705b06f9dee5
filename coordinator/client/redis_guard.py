"""The Redis guard: the fencing rule (I3) enforced at a Redis server (redis-py).

Owns: how ``RedisGuard`` keeps the rule of ``guard_rule.Guard`` in Redis: a durable high-water
mark (hwm) per resource in the key ``{resource}:fencing:hwm``, read, judged, raised and the
caller's mutations applied by one server-side Lua script, which Redis runs atomically (no
other command runs between its first and its last step). The rule is ``Guard``'s: token < hwm
is refused (``StaleToken``, nothing written), token == hwm is accepted, token > hwm is
accepted and raises the hwm.
Must never: write a mutation whose token is below the hwm, write part of a call's mutations
(the script checks every key's type, and an INCRBY's overflow, before its first write, since
Redis does not roll a failed script back), raise the hwm without the mutations, trust a token
without a proof when it has a verifier, or touch a key outside the resource's hash slot.

    guard = RedisGuard(redis.Redis(...), ProofVerifier.from_files("cluster.pub"))
    orders = guard.key("orders/7", "state")          # "{orders/7}:state": the resource's slot
    guard.set("orders/7", proof, orders, "packed")   # StaleToken / InvalidProof: nothing written
    guard.apply("orders/7", proof,                   # several mutations, one atomic step
                Mutation.incrby(guard.key("orders/7", "count"), 1),
                Mutation.xadd(guard.key("orders/7", "events"), {"state": "packed"}))

Why a script, not a transaction of the client's: Redis has no row lock; a client that reads
the mark and then writes (even in MULTI/EXEC without WATCH) lets a newer holder write in
between, and the old write lands after it. In the script the check and the write are one step.

Keys: every key a call touches must hash to the resource's slot, so the script is legal on
Redis Cluster too (a script's keys must share one slot): name them ``guard.key(resource,
name)``, i.e. ``{resource}:name``; the hash tag is the ``{...}`` part, so any key whose tag
text is the resource's works. A key in another slot is refused before anything is sent.

Durability is the server's: with ``appendfsync everysec`` (the default when AOF is on) a
crash can lose the last second of writes, the hwm raise among them, and a replica promoted
after a failover may lack the last writes the old primary acknowledged; then an older holder
is accepted again. For a fence that holds across both, run AOF with ``appendfsync always``
and call ``WAIT numreplicas timeout`` (``guard.wait_for_replicas``) after a write before
acting on it; README, "What each guard protects, and what it does not".

Outcome of a failed call: a ``redis.ConnectionError`` or ``TimeoutError`` after the request
was sent leaves it unknown whether the script ran. Retrying with the same token is safe for
SET, HSET and DEL (same result twice), not for INCRBY, RPUSH/LPUSH or XADD (twice applied).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from coordinator.client.exceptions import StaleToken
from coordinator.client.guard_rule import check_resource, check_verifier, token_of
from coordinator.client.proof import ProofVerifier
from coordinator.core.limits import TOKEN_MAX

try:
    import redis
    from redis.cluster import RedisCluster
    from redis.crc import key_slot
except ImportError as exc:  # an optional extra: say which, not just the module's name
    raise ImportError(f"RedisGuard needs redis-py ({exc}): pip install 'fencing-coordinator[redis]'") from exc

__all__ = ["Mutation", "RedisGuard", "StaleToken"]

# Limits of one call, so one script stays a short step on a server that runs nothing else
# meanwhile, and below Lua's stack limit on unpacked arguments (about 8000).
REDIS_MUTATIONS_PER_CALL_MAX = 64
REDIS_ARGS_PER_MUTATION_MAX = 1024
_int64_range = range(-(2**63), 2**63)  # INCRBY's amounts: Redis's signed 64-bit integers
_token_digits = len(str(TOKEN_MAX))  # 20: the hwm is stored zero-padded, see the script
HWM_KEY_SUFFIX = ":fencing:hwm"

# KEYS[1]: the hwm key; KEYS[1+i]: mutation i's key. ARGV[1]: the token as 20 digits;
# ARGV[2]: the number of mutations; then per mutation its name, its argument count, its
# arguments. Returns {1, {result per mutation}} or {0, hwm} for a stale token.
# Lua numbers are doubles (exact below 2**53), so 64-bit values are compared and added as
# 10-digit and 9-digit halves, never converted whole.
_SCRIPT = r"""
local function well_formed(v)
  return type(v) == 'string' and #v == 20 and string.find(v, '^%d+$') ~= nil
end
local function less(a, b)  -- a < b for two 20-digit strings
  local ah, bh = tonumber(string.sub(a, 1, 10)), tonumber(string.sub(b, 1, 10))
  if ah ~= bh then return ah < bh end
  return tonumber(string.sub(a, 11)) < tonumber(string.sub(b, 11))
end
local function halves(s)  -- a canonical int64 text as {sign * high, sign * low}, low the last 9 digits
  local sign, digits = 1, s
  if string.sub(s, 1, 1) == '-' then sign, digits = -1, string.sub(s, 2) end
  local n = #digits
  local high = n > 9 and tonumber(string.sub(digits, 1, n - 9)) or 0
  return sign * high, sign * tonumber(string.sub(digits, math.max(1, n - 8)))
end
local function sum_fits_int64(a, b)
  local ah, al = halves(a)
  local bh, bl = halves(b)
  local h, l = ah + bh, al + bl
  local carry = math.floor(l / 1e9)
  h, l = h + carry, l - carry * 1e9
  -- -2**63 = -9223372037e9 + 145224192; 2**63-1 = 9223372036e9 + 854775807
  if h < -9223372037 or (h == -9223372037 and l < 145224192) then return false end
  if h > 9223372036 or (h == 9223372036 and l > 854775807) then return false end
  return true
end
local function canonical_int(v)
  return #v <= 20 and (v == '0' or string.find(v, '^-?[1-9]%d*$') ~= nil)
end

local token = ARGV[1]
local hwm = redis.call('GET', KEYS[1])
if hwm then
  if not well_formed(hwm) then
    return redis.error_reply('FENCING the hwm key ' .. KEYS[1] .. ' does not hold 20 digits: damaged?')
  end
  if less(token, hwm) then return {0, hwm} end
end

-- Every check before the first write: Redis keeps the writes of a script that fails halfway.
local wants = {SET = 'any', DEL = 'any', HSET = 'hash', RPUSH = 'list', LPUSH = 'list',
               XADD = 'stream', INCRBY = 'string'}
local mutations, pos = {}, 3
for i = 1, tonumber(ARGV[2]) do
  local name, count = ARGV[pos], tonumber(ARGV[pos + 1])
  local args = {}
  for j = 1, count do args[j] = ARGV[pos + 1 + j] end
  pos = pos + 2 + count
  local key, want = KEYS[i + 1], wants[name]
  if want == nil then return redis.error_reply('FENCING unknown mutation ' .. tostring(name)) end
  if want ~= 'any' then
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'none' and kind ~= want then
      return redis.error_reply('WRONGTYPE ' .. name .. ' on ' .. key .. ', which holds a ' .. kind ..
                               ': nothing written')
    end
    if name == 'INCRBY' and kind == 'string' then
      local value = redis.call('GET', key)
      if not canonical_int(value) or not sum_fits_int64(value, args[1]) then
        return redis.error_reply('FENCING INCRBY on ' .. key .. ': its value is not an integer or would ' ..
                                 'leave the 64-bit range: nothing written')
      end
    end
  end
  mutations[i] = {name, key, args}
end

if hwm == false or less(hwm, token) then redis.call('SET', KEYS[1], token) end
local results = {}
for i, m in ipairs(mutations) do
  if m[1] == 'XADD' then
    results[i] = redis.call('XADD', m[2], '*', unpack(m[3]))
  elseif m[1] == 'INCRBY' then
    -- As text: an integer reply passes through a Lua double, inexact beyond 2**53.
    redis.call('INCRBY', m[2], m[3][1])
    results[i] = redis.call('GET', m[2])
  else
    results[i] = redis.call(m[1], m[2], unpack(m[3]))
  end
end
return {1, results}
"""


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One write a fenced call applies; build it with the class methods."""

    name: str
    key: str | bytes
    args: tuple[Any, ...]

    @classmethod
    def set(cls, key: str | bytes, value: Any) -> Mutation:
        return cls("SET", key, (value,))

    @classmethod
    def hset(cls, key: str | bytes, mapping: Mapping[Any, Any]) -> Mutation:
        if not isinstance(mapping, Mapping) or not mapping:
            raise ValueError("hset needs a non-empty mapping of fields to values")
        return cls("HSET", key, tuple(x for pair in mapping.items() for x in pair))

    @classmethod
    def delete(cls, key: str | bytes) -> Mutation:
        return cls("DEL", key, ())

    @classmethod
    def incrby(cls, key: str | bytes, amount: int) -> Mutation:
        if type(amount) is not int or amount not in _int64_range:
            raise ValueError(f"incrby amount must be an int in -2**63..2**63-1, not {amount!r}")
        return cls("INCRBY", key, (str(amount),))

    @classmethod
    def rpush(cls, key: str | bytes, *values: Any) -> Mutation:
        if not values:
            raise ValueError("rpush needs at least one value")
        return cls("RPUSH", key, values)

    @classmethod
    def lpush(cls, key: str | bytes, *values: Any) -> Mutation:
        if not values:
            raise ValueError("lpush needs at least one value")
        return cls("LPUSH", key, values)

    @classmethod
    def xadd(cls, key: str | bytes, fields: Mapping[Any, Any]) -> Mutation:
        """A stream entry with a server-made id (``*``): an explicit id could be refused halfway."""
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError("xadd needs a non-empty mapping of fields to values")
        return cls("XADD", key, tuple(x for pair in fields.items() for x in pair))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisGuard:
    """Fences writes to one Redis (or Redis Cluster) client: one hwm key per resource.

    ``verifier``: as for ``Guard`` (None: trusted int tokens, no proofs). The client may
    decode responses or not; the guard changes none of its settings.
    """

    def __init__(self, client: redis.Redis | RedisCluster, verifier: ProofVerifier | None) -> None:
        if not isinstance(client, (redis.Redis, RedisCluster)):
            raise TypeError(f"client must be a redis.Redis or redis.RedisCluster, not {type(client).__name__}")
        check_verifier(verifier)
        self._client = client
        self._verifier = verifier
        # redis-py's Script runs EVALSHA and, on NOSCRIPT (a restarted or flushed server),
        # loads the script again and retries: the text is sent once per server, not per call.
        # redis-py annotates register_script's self as Redis, though RedisCluster has it as well.
        self._script = client.register_script(_SCRIPT)  # type: ignore[misc]

    @staticmethod
    def key(resource: str, name: str) -> str:
        """``{resource}:name``: a key in the resource's hash slot, for the guard's mutations."""
        check_resource(resource)
        return f"{{{resource}}}:{name}"

    @staticmethod
    def hwm_key(resource: str) -> str:
        check_resource(resource)
        return f"{{{resource}}}{HWM_KEY_SUFFIX}"

    def hwm(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or None if it has never been written."""
        value = self._client.get(self.hwm_key(resource))
        return None if value is None else self._decode(value, resource)

    def apply(self, resource: str, proof: bytes | str | int, *mutations: Mutation) -> list[Any]:
        """Check the token and apply ``mutations`` in order, all in one atomic step; their
        results (as the Redis commands return them). StaleToken / InvalidProof: nothing written."""
        hwm_key = self.hwm_key(resource)
        token = token_of(self._verifier, resource, proof)
        keys, argv = self._arguments(resource, hwm_key, mutations)
        reply = self._script(keys=[hwm_key, *keys], args=[f"{token:0{_token_digits}d}", len(mutations), *argv])
        if int(reply[0]) == 0:
            raise StaleToken.at_guard(resource, token, self._decode(reply[1], resource))
        return [int(_text(r)) if m.name == "INCRBY" else r for m, r in zip(mutations, reply[1], strict=True)]

    def set(self, resource: str, proof: bytes | str | int, key: str | bytes, value: Any) -> Any:
        return self.apply(resource, proof, Mutation.set(key, value))[0]

    def hset(self, resource: str, proof: bytes | str | int, key: str | bytes, mapping: Mapping[Any, Any]) -> int:
        return self.apply(resource, proof, Mutation.hset(key, mapping))[0]

    def delete(self, resource: str, proof: bytes | str | int, key: str | bytes) -> int:
        return self.apply(resource, proof, Mutation.delete(key))[0]

    def incrby(self, resource: str, proof: bytes | str | int, key: str | bytes, amount: int) -> int:
        return self.apply(resource, proof, Mutation.incrby(key, amount))[0]

    def rpush(self, resource: str, proof: bytes | str | int, key: str | bytes, *values: Any) -> int:
        return self.apply(resource, proof, Mutation.rpush(key, *values))[0]

    def lpush(self, resource: str, proof: bytes | str | int, key: str | bytes, *values: Any) -> int:
        return self.apply(resource, proof, Mutation.lpush(key, *values))[0]

    def xadd(self, resource: str, proof: bytes | str | int, key: str | bytes, fields: Mapping[Any, Any]) -> Any:
        return self.apply(resource, proof, Mutation.xadd(key, fields))[0]

    def wait_for_replicas(self, replicas: int, timeout_ms: int) -> int:
        """``WAIT``: how many replicas have the writes made so far on this connection (at most
        ``timeout_ms`` of waiting). Only a write a replica has can survive a failover."""
        return int(self._client.execute_command("WAIT", replicas, timeout_ms))

    # -- internals -------------------------------------------------------------------------

    def _arguments(self, resource: str, hwm_key: str, mutations: tuple[Mutation, ...]) -> tuple[list, list]:
        if not mutations:
            raise ValueError("a fenced call needs at least one mutation")
        if len(mutations) > REDIS_MUTATIONS_PER_CALL_MAX:
            raise ValueError(f"{len(mutations)} mutations in one call, more than {REDIS_MUTATIONS_PER_CALL_MAX}")
        slot = key_slot(hwm_key.encode())
        keys: list[str | bytes] = []
        argv: list[Any] = []
        for m in mutations:
            if not isinstance(m, Mutation):
                raise TypeError(f"mutations must be Mutation objects, not {type(m).__name__}")
            if not isinstance(m.key, (str, bytes)) or not m.key:
                raise TypeError(f"a key must be a non-empty str or bytes, not {m.key!r}")
            raw = m.key.encode() if isinstance(m.key, str) else m.key
            if raw == hwm_key.encode():
                raise ValueError(f"{m.key!r} is the guard's own hwm key")
            if key_slot(raw) != slot:
                raise ValueError(
                    f"key {m.key!r} is not in the hash slot of resource {resource!r}: "
                    f"name it guard.key({resource!r}, ...), i.e. '{{{resource}}}:...'"
                )
            if raw in (k.encode() if isinstance(k, str) else k for k in keys):
                # The script checks every key's type against the store before any write; a key
                # touched twice could pass that check and still fail on its second mutation.
                raise ValueError(f"key {m.key!r} appears twice in one call: one mutation per key")
            if len(m.args) > REDIS_ARGS_PER_MUTATION_MAX:
                raise ValueError(f"{m.name} with {len(m.args)} arguments, more than {REDIS_ARGS_PER_MUTATION_MAX}")
            keys.append(m.key)
            argv += [m.name, len(m.args), *m.args]
        return keys, argv

    @staticmethod
    def _decode(value: Any, resource: str) -> int:
        text = _text(value)
        if not (len(text) == _token_digits and text.isascii() and text.isdigit() and int(text) > 0):
            raise ValueError(f"hwm of {resource!r} is {text!r}, not {_token_digits} digits: key damaged?")
        return int(text)
