"""Replay-buffer state in Redis: prompt pool with leases and No-Positive-Resampling, scored-group streams.

Every key of a job is `scalerl:<job_id>:<name>`; the service holding a `BufferStore` is stateless, so any
number of replicas can share one Redis. Multi-step updates run as Lua scripts (atomic on the server).

Keys of a job (prefix `scalerl:<job_id>:`):
  meta          hash    recipe knobs (max_staleness, prompts_per_batch, threshold, zero_variance_filter, ...)
  prompts       hash    prompt_id -> serialized `Prompt` (epoch unset)
  ids           list    every prompt id, in pool order (epochs are shuffles of its non-retired part)
  avail         list    prompt ids not yet leased in the current epoch
  leases        zset    prompt_id -> lease deadline (server time, seconds)
  lease_owner   hash    prompt_id -> "<epoch>|<lease_id>|<generator_id>"
  attempts      hash    prompt_id -> graded completions seen   (lifetime pass-rate history)
  successes     hash    prompt_id -> graded completions with reward > 0
  latest        hash    prompt_id -> "<epoch>|<attempts>|<successes>" of the latest epoch that graded the prompt
  retired       set     prompts whose latest epoch's pass rate reached the No-Positive-Resampling threshold:
                        not leased again, except as rechecks
  recheck       set     retired prompts put back into the current epoch to check the policy still solves them
  counters      hash    written, trained, dropped_<reason>, duplicates, lost_lease, epoch, device_seconds,
                        generated_tokens, learner_version, quota_accepted, ...
  seen          set     group ids received (write idempotency)
  trained       set     group ids acknowledged as trained (consumption idempotency)
  stream        stream  accepted groups: fields gid, v (oldest token version), g (ScoredGroup bytes);
                        consumer group "learner"; entries are XDEL'ed once acknowledged
  pending       zset    entry_id -> oldest token version, for every stream entry not yet acknowledged

Accounting invariant (checked by the tests):
  written = trained + dropped_stale + dropped_zero_variance + dropped_failed_to_grade + pending
`written` counts every distinct group received by write_groups (a retried write of the same group_id is
counted once, under `duplicates`). A learner-side drop (`ack(trained=False)`) is counted as stale: the only
reason a learner discards a group it read is that it went stale before it could be used.

A write whose lease was lost (it expired and the prompt is now leased under another lease id) is refused:
counted under `lost_lease`, not in `written` (the new holder's group is the one that counts). Generators renew
the leases of prompts still in flight (`renew_leases`), so only a dead or stuck generator loses one.

No-Positive-Resampling (ScaleRL §3.2: a prompt whose pass rate reaches the threshold, 0.9 by default, is never
sampled again) uses the pass rate of the prompt's *latest epoch*, not its lifetime history: the rule is there to
stop spending generations on prompts the *current* policy already solves, and a lifetime average keeps a
prompt the policy now always solves (say 0/8 in epoch 1, 8/8 in epoch 5: lifetime 0.5) in the pool for many
more epochs of zero-variance groups. Completions of one epoch that arrive in several groups (a re-leased
prompt) add up; a late group of an older epoch updates only the lifetime history.

Retirement is for good in the paper, which is safe only while the policy keeps solving what it retired: from the
second epoch on, the pool holds only the prompts it failed, and a policy that forgets the retired ones is never
corrected (the demo's collapse, docs/benchmarks/demo_recipe.md, session 15). `retired_recheck_fraction` puts
that share of the retired prompts back into each new epoch (each prompt drawn by a hash of the job seed, the epoch
and its id); a prompt whose latest epoch then scores below the threshold leaves `retired` and is counted under
`unretired` (so is one retired by a group whose epoch a later group pulls below the threshold). A pool whose every
prompt is retired is exhausted as before: rechecks still queued in that epoch are not run.

PPO-off-policy-k (ScaleRL §2: generate k batches with frozen weights, then update): the learner publishes every
k steps and the buffer caps generation per frozen version at `version_quota` = k * prompts_per_batch groups,
counted as groups *accepted* into the stream plus prompts under lease. Zero-variance and failed-to-grade
groups release their lease without using the quota (so the learner always gets its k batches: no deadlock
when drops leave it short), a group dropped as stale gives its place back, and the quota starts over when a
read reports a new learner version (the learner's publish). 0 (PipelineRL-k) means no quota.

Backpressure rule: a group waiting behind `backlog` others is trained about `backlog // prompts_per_batch`
learner versions after it was produced, so it will be stale (more than k versions behind) once
`backlog >= (k + 1) * prompts_per_batch`.  backlog = groups in the stream not yet delivered to a learner +
prompts under lease (each becomes a group). lease_prompts never lets the backlog pass that bound: it grants
at most `bound - backlog` prompts and sets slow_down (with retry_after_s) when it grants fewer than asked.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import NamedTuple

import redis
from pydantic import ValidationError

from scalerl import errors
from scalerl.recipe import PipelineMode, Recipe, parse_recipe
from scalerl.tasks import build_prompts
from scalerl.v1 import common_pb2, replay_buffer_pb2

CONSUMER_GROUP = "learner"
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
ENTRY_ID_RE = re.compile(r"^\d+-\d+$")
DROP_REASONS = ("stale", "zero_variance", "failed_to_grade")


class JobNotFound(errors.NotFound):
    """The job has no state in Redis (never initialised, or cleaned up)."""

    def __init__(self, job_id: str):
        super().__init__(f"unknown job {job_id!r} (InitJob it first)", field="job_id", job_id=job_id)


class RecipeConflict(errors.FailedPrecondition):
    """InitJob of an existing job with a different recipe."""


def parse_recipe_field(recipe_json: str, field: str, job_id: str | None = None) -> Recipe:
    """The recipe in a request's `field`; InvalidArgument naming the field (and the recipe's own field)."""
    try:
        return parse_recipe(recipe_json)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise errors.InvalidArgument(first["msg"], field=f"{field}.{where}" if where else field,
                                     job_id=job_id) from None


def _redis_unavailable(method):
    """Redis being down or failing is the caller's UNAVAILABLE: convert it here, at the store's boundary."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except redis.RedisError as err:
            raise errors.Unavailable(f"redis: {err}") from err

    return wrapper


class LeaseResult(NamedTuple):
    prompts: list[common_pb2.Prompt]
    lease_id: str
    slow_down: bool
    retry_after_s: float
    exhausted: bool


class WriteResult(NamedTuple):
    written: int
    """Groups appended to the stream (trainable)."""
    dropped_zero_variance: int
    dropped_failed_to_grade: int
    duplicates: int
    """Retries of a group_id already received: ignored."""
    lost_lease: int = 0
    """Refused: the group's lease expired and its prompt is now leased to another lease."""


class ReadResult(NamedTuple):
    groups: list[replay_buffer_pb2.BufferedGroup]
    dropped_stale: int


@dataclass(frozen=True)
class Snapshot:
    """A consistent (MULTI) view of a job's counters; BufferStats plus what backpressure and metrics need."""

    job_id: str
    written: int
    trained: int
    dropped_stale: int
    dropped_zero_variance: int
    dropped_failed_to_grade: int
    pending: int
    unread: int
    leased: int
    total_prompts: int
    retired_prompts: int
    epoch: int
    generator_device_seconds: float
    generated_tokens: int
    oldest_pending_version: int
    """-1 when nothing is pending."""
    learner_version: int
    """The latest learner_version seen by read_batch (-1 before the first read)."""
    duplicates: int
    leases_expired: int
    unretired: int = 0
    """Retired prompts returned to the pool: their latest epoch (mostly a recheck) fell below the threshold."""
    lost_lease: int = 0
    """Writes refused because their lease had gone to another lease id (not counted in `written`)."""
    quota_accepted: int = 0
    """PPO-off-policy-k: groups accepted into the stream under the current learner version's quota."""

    @property
    def pool_size(self) -> int:
        """Prompts that can still be leased (not retired)."""
        return self.total_prompts - self.retired_prompts

    @property
    def backlog(self) -> int:
        return self.unread + self.leased

    @property
    def oldest_pending_version_lag(self) -> int:
        if self.oldest_pending_version < 0 or self.learner_version < 0:
            return 0
        return max(0, self.learner_version - self.oldest_pending_version)

    def to_proto(self) -> replay_buffer_pb2.BufferStats:
        return replay_buffer_pb2.BufferStats(
            job_id=self.job_id, groups_written=self.written, groups_trained=self.trained,
            dropped_stale=self.dropped_stale, dropped_zero_variance=self.dropped_zero_variance,
            dropped_failed_to_grade=self.dropped_failed_to_grade, pending=self.pending, pool_size=self.pool_size,
            retired_prompts=self.retired_prompts, epoch=self.epoch,
            generator_device_seconds=self.generator_device_seconds, generated_tokens=self.generated_tokens,
            oldest_pending_version=self.oldest_pending_version, lost_lease=self.lost_lease, leased=self.leased)


# ------------------------------------------------------------------------------------------------ Lua
# KEYS: meta prompts ids avail leases lease_owner retired counters pending stream recheck
# ARGV: generator_id max_prompts lease_seconds(0 = recipe default) lease_id
# -> {status(-1 unknown job | 1), epoch, exhausted, slow_down, pid1, blob1, epoch1, pid2, blob2, epoch2, ...}
_LEASE = r"""
local meta, prompts, ids, avail, leases, owners, retired, counters, pending, stream, recheck =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
if redis.call('EXISTS', meta) == 0 then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local epoch = tonumber(redis.call('HGET', counters, 'epoch') or '0')

-- a prompt of the current epoch may be leased unless it is retired and not one of this epoch's rechecks
local function leasable(pid)
  return redis.call('SISMEMBER', retired, pid) == 0 or redis.call('SISMEMBER', recheck, pid) == 1
end

-- 1. leases past their deadline (crashed or slow generator): the prompt goes back to the current epoch
local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
for _, pid in ipairs(expired) do
  local owner = redis.call('HGET', owners, pid)
  redis.call('ZREM', leases, pid)
  redis.call('HDEL', owners, pid)
  redis.call('HINCRBY', counters, 'leases_expired', 1)
  local lease_epoch = owner and tonumber(string.match(owner, '^(%d+)|'))
  -- a lease of an older epoch needs no re-queue: the newer epoch's list holds every non-retired prompt
  if lease_epoch == epoch and leasable(pid) then
    redis.call('LPUSH', avail, pid)
  end
end

-- 2. exhausted pool
local live_count = redis.call('HLEN', prompts) - redis.call('SCARD', retired)
if live_count <= 0 then return {1, epoch, 1, 0} end

-- 3. backpressure: backlog (undelivered stream entries + leased prompts) stays below (k + 1) * prompts_per_batch
local k = tonumber(redis.call('HGET', meta, 'max_staleness'))
local ppb = tonumber(redis.call('HGET', meta, 'prompts_per_batch'))
local bound = (k + 1) * ppb
local pel = redis.call('XPENDING', stream, 'learner')[1]
local backlog = (redis.call('ZCARD', pending) - pel) + redis.call('ZCARD', leases)
local n = tonumber(ARGV[2])
local slow = 0
if backlog + n > bound then
  n = bound - backlog
  slow = 1
  if n <= 0 then return {1, epoch, 0, 1} end
end

-- 3b. PPO-off-policy-k: at most version_quota groups accepted (or leased) per frozen learner version
local quota = tonumber(redis.call('HGET', meta, 'version_quota') or '0')
if quota > 0 then
  local room = quota - tonumber(redis.call('HGET', counters, 'quota_accepted') or '0') - redis.call('ZCARD', leases)
  if room < n then
    n = room
    slow = 1
    if n <= 0 then return {1, epoch, 0, 1} end
  end
end

-- 4. pop prompts from the current epoch, starting a new shuffled epoch of non-retired prompts when it runs out
local lease_seconds = tonumber(ARGV[3])
if lease_seconds <= 0 then lease_seconds = tonumber(redis.call('HGET', meta, 'lease_seconds')) end
local deadline = now + lease_seconds
local out = {1, epoch, 0, slow}
local deferred = {}
local started = false
local got = 0
while got < n do
  local pid = redis.call('LPOP', avail)
  if not pid then
    if started then break end
    started = true
    deferred = {}  -- the new epoch holds them
    epoch = epoch + 1
    redis.call('HSET', counters, 'epoch', epoch)
    local all = redis.call('LRANGE', ids, 0, -1)
    local live = {}
    local seed = redis.call('HGET', meta, 'shuffle_seed')
    local recheck_fraction = tonumber(redis.call('HGET', meta, 'recheck_fraction') or '0')
    redis.call('DEL', recheck)
    for _, id in ipairs(all) do
      if redis.call('SISMEMBER', retired, id) == 0 then
        live[#live + 1] = id
      elseif recheck_fraction > 0
          -- a hash of (job seed, epoch, prompt): each epoch draws afresh, the same on every replay
          and tonumber(string.sub(redis.sha1hex(seed .. '|' .. epoch .. '|' .. id), 1, 8), 16)
              < recheck_fraction * 4294967296 then
        live[#live + 1] = id
        redis.call('SADD', recheck, id)
      end
    end
    -- Fisher-Yates with a Park-Miller generator seeded by (job seed, epoch): reproducible epochs
    local x = (tonumber(seed) + epoch * 7919) % 2147483646 + 1
    for i = #live, 2, -1 do
      x = (x * 48271) % 2147483647
      local j = (x % i) + 1
      live[i], live[j] = live[j], live[i]
    end
    for i = 1, #live, 1000 do
      redis.call('RPUSH', avail, unpack(live, i, math.min(i + 999, #live)))
    end
    out[2] = epoch
  elseif not leasable(pid) then
    -- retired after this epoch started: skip
  elseif redis.call('ZSCORE', leases, pid) then
    deferred[#deferred + 1] = pid  -- still leased from the previous epoch: later in this one
  else
    redis.call('ZADD', leases, deadline, pid)
    redis.call('HSET', owners, pid, epoch .. '|' .. ARGV[4] .. '|' .. ARGV[1])
    out[#out + 1] = pid
    out[#out + 1] = redis.call('HGET', prompts, pid)
    out[#out + 1] = epoch
    got = got + 1
  end
end
for i = 1, #deferred, 1000 do
  redis.call('RPUSH', avail, unpack(deferred, i, math.min(i + 999, #deferred)))
end
return out
"""

# KEYS: meta counters seen leases lease_owner attempts successes retired stream pending prompts latest
# ARGV: gid pid lease_id blob min_version n_graded n_success verdict(ok|failed_to_grade|zero_variance)
#       device_seconds tokens epoch
# -> {-1} unknown job | {0} duplicate | {1, entry_id} appended | {2} failed_to_grade | {3} zero_variance
#    | {4} lost lease (refused)
_WRITE = r"""
local meta, counters, seen, leases, owners, attempts, successes, retired, stream, pending, prompts, latest =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
if redis.call('EXISTS', meta) == 0 then return {-1} end
if redis.call('SADD', seen, ARGV[1]) == 0 then
  redis.call('HINCRBY', counters, 'duplicates', 1)
  return {0}
end
local pid = ARGV[2]
-- the lease: released when this group's lease still holds the prompt; a write whose lease expired and went to
-- another lease id is refused (that holder's group counts), so a re-leased prompt never lands twice
local owner = redis.call('HGET', owners, pid)
if owner then
  if string.match(owner, '^%d+|([^|]*)|') == ARGV[3] then
    redis.call('ZREM', leases, pid)
    redis.call('HDEL', owners, pid)
  elseif ARGV[3] ~= '' then
    redis.call('HINCRBY', counters, 'lost_lease', 1)
    return {4}
  end
end
redis.call('HINCRBY', counters, 'written', 1)
redis.call('HINCRBYFLOAT', counters, 'device_seconds', ARGV[9])
redis.call('HINCRBY', counters, 'generated_tokens', ARGV[10])
-- pass-rate history from graded completions; No-Positive-Resampling retires the prompt while the pass rate of
-- its latest epoch is at or above the threshold (a threshold above 1: never)
local graded = tonumber(ARGV[6])
if graded > 0 and redis.call('HEXISTS', prompts, pid) == 1 then
  redis.call('HINCRBY', attempts, pid, graded)
  redis.call('HINCRBY', successes, pid, ARGV[7])
  local epoch = tonumber(ARGV[11])
  local e_att, e_suc = graded, tonumber(ARGV[7])
  local prev = redis.call('HGET', latest, pid)
  local prev_epoch, prev_att, prev_suc
  if prev then
    prev_epoch, prev_att, prev_suc = string.match(prev, '^(%d+)|(%d+)|(%d+)$')
    prev_epoch, prev_att, prev_suc = tonumber(prev_epoch), tonumber(prev_att), tonumber(prev_suc)
  end
  if prev and prev_epoch > epoch then
    e_att = nil  -- a late group of an older epoch: lifetime history only
  else
    if prev and prev_epoch == epoch then
      e_att, e_suc = e_att + prev_att, e_suc + prev_suc
    end
    redis.call('HSET', latest, pid, epoch .. '|' .. e_att .. '|' .. e_suc)
  end
  local threshold = tonumber(redis.call('HGET', meta, 'retire_threshold'))
  if e_att and threshold <= 1 then
    if e_suc / e_att >= threshold then
      redis.call('SADD', retired, pid)
    elseif redis.call('SREM', retired, pid) == 1 then
      -- a recheck, or a later group of the epoch that retired it, fell below the threshold
      redis.call('HINCRBY', counters, 'unretired', 1)
    end
  end
end
if ARGV[8] == 'failed_to_grade' then
  redis.call('HINCRBY', counters, 'dropped_failed_to_grade', 1)
  return {2}
end
if ARGV[8] == 'zero_variance' and redis.call('HGET', meta, 'zero_variance_filter') == '1' then
  redis.call('HINCRBY', counters, 'dropped_zero_variance', 1)
  return {3}
end
local id = redis.call('XADD', stream, '*', 'gid', ARGV[1], 'v', ARGV[5], 'g', ARGV[4])
redis.call('ZADD', pending, ARGV[5], id)
redis.call('HINCRBY', counters, 'quota_accepted', 1)
return {1, id}
"""

# KEYS: leases lease_owner meta
# ARGV: lease_seconds(0 = recipe default) lease_id pid...
# -> the prompt ids whose lease is no longer held by lease_id (expired and re-leased, or written already)
_RENEW = r"""
local leases, owners, meta = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local lease_seconds = tonumber(ARGV[1])
if lease_seconds <= 0 then lease_seconds = tonumber(redis.call('HGET', meta, 'lease_seconds')) end
local deadline = tonumber(t[1]) + tonumber(t[2]) / 1000000 + lease_seconds
local lost = {}
for i = 3, #ARGV do
  local pid = ARGV[i]
  local owner = redis.call('HGET', owners, pid)
  if owner and string.match(owner, '^%d+|([^|]*)|') == ARGV[2] then
    redis.call('ZADD', leases, 'XX', deadline, pid)
  else
    lost[#lost + 1] = pid
  end
end
return lost
"""

# KEYS: counters
# ARGV: learner_version
# A new learner version (the learner published) starts a new PPO-off-policy quota; the learner's first read
# (-1 before) does not: what was generated before it is the first version's.
_OBSERVE_VERSION = r"""
local counters = KEYS[1]
local previous = redis.call('HGET', counters, 'learner_version')
if previous == ARGV[1] then return 0 end
redis.call('HSET', counters, 'learner_version', ARGV[1])
if previous and previous ~= '-1' then redis.call('HSET', counters, 'quota_accepted', 0) end
return 0
"""

# KEYS: stream pending counters trained
# ARGV: mode(trained | stale | duplicate_trained) entry_id...
# Counts only entries this call acknowledged (XACK == 1), so a repeated ack never counts twice.
_ACK = r"""
local stream, pending, counters, trained = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode = ARGV[1]
local field = (mode == 'trained') and 'trained' or ('dropped_' .. mode)
local n = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('XACK', stream, 'learner', id) == 1 then
    n = n + 1
    if mode == 'trained' then
      local e = redis.call('XRANGE', stream, id, id)
      if e[1] then
        local f = e[1][2]
        for j = 1, #f, 2 do
          if f[j] == 'gid' then redis.call('SADD', trained, f[j + 1]) break end
        end
      end
    end
    redis.call('HINCRBY', counters, field, 1)
    if mode == 'stale' and tonumber(redis.call('HGET', counters, 'quota_accepted') or '0') > 0 then
      redis.call('HINCRBY', counters, 'quota_accepted', -1)  -- a stale group gives its quota place back
    end
    redis.call('ZREM', pending, id)
    redis.call('XDEL', stream, id)
  end
end
return n
"""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _buffered_group_bytes(entry_id: bytes, group: bytes, redelivered: bool) -> bytes:
    """Wire format of BufferedGroup(entry_id, group, redelivered)."""
    return _field_bytes(1, entry_id) + _field_bytes(2, group) + (b"\x18\x01" if redelivered else b"")


def _int(v, default: int = 0) -> int:
    return default if v is None else int(v)


def version_quota(recipe: Recipe) -> int:
    """Groups per frozen learner version: k * prompts_per_batch under PPO-off-policy-k, 0 (none) otherwise."""
    p = recipe.pipeline
    if p.mode is PipelineMode.ppo_off_policy:
        return max(p.max_staleness, 1) * p.prompts_per_batch
    return 0


class BufferStore:
    """All replay-buffer state of all jobs, in one Redis (see the module docstring for keys and rules).

    `redis` must return bytes (decode_responses=False): stream entries hold serialized protobufs.
    `claim_idle_ms`: a group delivered to a consumer and not acknowledged for this long is redelivered
    (XCLAIM) to the next reader; it must exceed the learner's read-to-ack time. A reader never claims its own
    pending entries (they are in the batch it is filling), so a consumer name must be unique per process.
    `backpressure_retry_s`: the retry hint sent with slow_down.
    Errors are `scalerl.errors` classes naming the request field; a failing Redis raises errors.Unavailable.
    """

    def __init__(self, redis_client: redis.Redis, *, claim_idle_ms: int = 120_000,
                 backpressure_retry_s: float = 1.0):
        if redis_client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("BufferStore needs a Redis client with decode_responses=False")
        self.r = redis_client
        self.claim_idle_ms = int(claim_idle_ms)
        self.backpressure_retry_s = float(backpressure_retry_s)
        self._lease = self.r.register_script(_LEASE)
        self._write = self.r.register_script(_WRITE)
        self._ack = self.r.register_script(_ACK)
        self._renew = self.r.register_script(_RENEW)
        self._observe_version = self.r.register_script(_OBSERVE_VERSION)

    # ---------------------------------------------------------------------------------------- keys
    @staticmethod
    def prefix(job_id: str) -> str:
        return f"scalerl:{job_id}:"

    @staticmethod
    def check_job_id(job_id: str, field: str = "job_id") -> None:
        if not job_id:
            raise errors.InvalidArgument("is required", field=field)
        if not JOB_ID_RE.match(job_id):
            raise errors.InvalidArgument(f"{job_id!r} must match {JOB_ID_RE.pattern}", field=field)

    def _k(self, job_id: str, *names: str) -> list[str]:
        p = self.prefix(job_id)
        return [p + n for n in names]

    # ---------------------------------------------------------------------------------------- jobs
    @_redis_unavailable
    def init_job(self, job_id: str, recipe: Recipe | str | dict) -> tuple[int, bool]:
        """Build the job's prompt pool (idempotent) -> (pool_size, created)."""
        self.check_job_id(job_id)
        if not isinstance(recipe, Recipe):
            recipe = parse_recipe(recipe)
        recipe_json = recipe.model_dump_json()
        meta, = self._k(job_id, "meta")
        existing = self.r.hget(meta, "recipe_json")
        if existing is not None:
            return self._existing(job_id, existing, recipe_json)
        try:
            prompts = build_prompts(recipe.task, "train")
        except errors.ScaleRLError:
            raise
        except ValueError as err:  # e.g. a dataset the task's package does not know
            raise errors.InvalidArgument(str(err), field="job.recipe_json.task", job_id=job_id) from err
        seed = int.from_bytes(hashlib.sha256(f"{job_id}:{recipe.seed}".encode()).digest()[:4], "big") % 2147483646
        keys = dict(zip(("prompts", "ids", "counters", "stream"), self._k(job_id, "prompts", "ids", "counters",
                                                                       "stream")))
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(meta)
                if pipe.exists(meta):
                    pipe.unwatch()
                    return self._existing(job_id, self.r.hget(meta, "recipe_json"), recipe_json)
                pipe.multi()
                pipe.delete(keys["prompts"], keys["ids"], keys["stream"])
                for i in range(0, len(prompts), 1000):
                    chunk = prompts[i:i + 1000]
                    pipe.hset(keys["prompts"], mapping={
                        p.prompt_id: common_pb2.Prompt(job_id=job_id, prompt_id=p.prompt_id, text=p.text, task=p.task,
                                                       answer=p.answer, metadata_json=p.metadata_json
                                                       ).SerializeToString()
                        for p in chunk})
                    pipe.rpush(keys["ids"], *[p.prompt_id for p in chunk])
                pipe.hset(keys["counters"], mapping={"epoch": 0, "learner_version": -1, "quota_accepted": 0})
                pipe.xgroup_create(keys["stream"], CONSUMER_GROUP, id="0", mkstream=True)
                pipe.hset(meta, mapping={
                    "recipe_json": recipe_json,
                    "max_staleness": recipe.pipeline.max_staleness,
                    "prompts_per_batch": recipe.pipeline.prompts_per_batch,
                    "generations_per_prompt": recipe.pipeline.generations_per_prompt,
                    # None -> 2, above any pass rate: a number, so a replica older than the off switch reads it
                    "retire_threshold": repr(2.0 if recipe.data.no_positive_resampling_threshold is None
                                             else recipe.data.no_positive_resampling_threshold),
                    "recheck_fraction": repr(recipe.data.retired_recheck_fraction),
                    "zero_variance_filter": int(recipe.data.zero_variance_filter),
                    "lease_seconds": repr(recipe.data.lease_seconds),
                    "shuffle_seed": seed,
                    "pool_size": len(prompts),
                    "version_quota": version_quota(recipe),
                })
                pipe.execute()
            except redis.WatchError:  # another replica initialised it concurrently
                return self._existing(job_id, self.r.hget(meta, "recipe_json"), recipe_json)
        return len(prompts), True

    def _existing(self, job_id: str, existing: bytes | None, recipe_json: str) -> tuple[int, bool]:
        if existing is not None and existing.decode() != recipe_json:
            raise RecipeConflict("the job already exists with a different recipe", field="job.recipe_json",
                                 job_id=job_id)
        return _int(self.r.hget(self.prefix(job_id) + "meta", "pool_size")), False

    @_redis_unavailable
    def job_exists(self, job_id: str) -> bool:
        return bool(self.r.exists(self.prefix(job_id) + "meta"))

    @_redis_unavailable
    def list_jobs(self) -> list[str]:
        """Job ids with state in Redis (SCAN; used by the metrics collector)."""
        jobs = set()
        for key in self.r.scan_iter(match="scalerl:*:meta", count=1000):
            parts = key.decode().split(":")
            if len(parts) == 3 and JOB_ID_RE.match(parts[1]):
                jobs.add(parts[1])
        return sorted(jobs)

    @_redis_unavailable
    def cleanup_job(self, job_id: str) -> int:
        """Delete every key of the job -> number of keys deleted."""
        self.check_job_id(job_id)
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix(job_id)) + "*"
        deleted = 0
        batch: list[bytes] = []
        for key in self.r.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += self.r.unlink(*batch)
                batch = []
        if batch:
            deleted += self.r.unlink(*batch)
        return deleted

    # ---------------------------------------------------------------------------------------- generator side
    @_redis_unavailable
    def lease_prompts(self, job_id: str, generator_id: str, max_prompts: int,
                      lease_seconds: float | None = None) -> LeaseResult:
        """Lease up to max_prompts prompts for lease_seconds (None/0: the recipe's data.lease_seconds)."""
        self.check_job_id(job_id)
        if not generator_id:
            raise errors.InvalidArgument("is required", field="generator_id", job_id=job_id)
        if max_prompts <= 0:
            raise errors.InvalidArgument("must be > 0", field="max_prompts", job_id=job_id)
        if lease_seconds is not None and lease_seconds < 0:
            raise errors.InvalidArgument("must be >= 0 (0: the recipe's data.lease_seconds)", field="lease_seconds",
                                         job_id=job_id)
        lease_id = uuid.uuid4().hex
        keys = self._k(job_id, "meta", "prompts", "ids", "avail", "leases", "lease_owner", "retired", "counters",
                       "pending", "stream", "recheck")
        res = self._lease(keys=keys, args=[generator_id, int(max_prompts), float(lease_seconds or 0), lease_id])
        if res[0] == -1:
            raise JobNotFound(job_id)
        epoch, exhausted, slow = int(res[1]), bool(res[2]), bool(res[3])
        prompts = []
        for i in range(4, len(res), 3):
            p = common_pb2.Prompt.FromString(res[i + 1])
            p.epoch = int(res[i + 2])
            prompts.append(p)
        retry = self.backpressure_retry_s if (slow or (not prompts and not exhausted)) else 0.0
        return LeaseResult(prompts, lease_id if prompts else "", slow, retry, exhausted)

    @_redis_unavailable
    def renew_leases(self, job_id: str, lease_id: str, prompt_ids: list[str],
                     lease_seconds: float | None = None) -> list[str]:
        """Extend the leases `lease_id` still holds on `prompt_ids` to now + lease_seconds (None/0: the
        recipe's) -> the prompt ids it no longer holds (expired and re-leased, or already written)."""
        self.check_job_id(job_id)
        if not lease_id:
            raise errors.InvalidArgument("is required", field="lease_id", job_id=job_id)
        if lease_seconds is not None and lease_seconds < 0:
            raise errors.InvalidArgument("must be >= 0 (0: the recipe's data.lease_seconds)", field="lease_seconds",
                                         job_id=job_id)
        for i, pid in enumerate(prompt_ids):
            if not pid:
                raise errors.InvalidArgument("is empty", field=f"prompt_ids[{i}]", job_id=job_id)
        if not self.job_exists(job_id):
            raise JobNotFound(job_id)
        if not prompt_ids:
            return []
        keys = self._k(job_id, "leases", "lease_owner", "meta")
        lost = self._renew(keys=keys, args=[float(lease_seconds or 0), lease_id, *prompt_ids])
        return [p.decode() if isinstance(p, bytes) else p for p in lost]

    @staticmethod
    def _inspect(i: int, g: common_pb2.ScoredGroup):
        """Validate one group -> (verdict, min_version, n_graded, n_success, tokens)."""
        field = f"groups[{i}]"
        BufferStore.check_job_id(g.job_id, f"{field}.job_id")
        if not g.group_id:
            raise errors.InvalidArgument("is required", field=f"{field}.group_id", job_id=g.job_id)
        if not g.prompt.prompt_id:
            raise errors.InvalidArgument("is required", field=f"{field}.prompt.prompt_id", job_id=g.job_id)
        if not g.completions:
            raise errors.InvalidArgument("is empty", field=f"{field}.completions", job_id=g.job_id)
        min_version = None
        failed = False
        rewards = []
        tokens = 0
        for j, sc in enumerate(g.completions):
            c = sc.completion
            if not c.versions:
                raise errors.InvalidArgument("is empty: every token needs its policy version",
                                             field=f"{field}.completions[{j}].completion.versions", job_id=g.job_id)
            v = min(s.version for s in c.versions)
            min_version = v if min_version is None else min(min_version, v)
            tokens += len(c.token_ids)
            if sc.grade_status == common_pb2.GRADE_STATUS_GRADED:
                rewards.append(sc.reward)
            else:  # FAILED, or never graded: never counted as a reward
                failed = True
        if failed:
            verdict = "failed_to_grade"
        elif all(r == rewards[0] for r in rewards):
            verdict = "zero_variance"
        else:
            verdict = "ok"
        n_success = sum(1 for r in rewards if r > 0)
        return verdict, min_version, len(rewards), n_success, tokens

    @_redis_unavailable
    def write_groups(self, groups: list[common_pb2.ScoredGroup]) -> WriteResult:
        """Account and append scored groups (idempotent on group_id); see the module docstring."""
        inspected = [self._inspect(i, g) for i, g in enumerate(groups)]
        for job_id in {g.job_id for g in groups}:
            if not self.job_exists(job_id):
                raise JobNotFound(job_id)
        pipe = self.r.pipeline(transaction=False)
        for g, (verdict, min_v, graded, succ, tokens) in zip(groups, inspected):
            keys = self._k(g.job_id, "meta", "counters", "seen", "leases", "lease_owner", "attempts", "successes",
                           "retired", "stream", "pending", "prompts", "latest")
            self._write(keys=keys, args=[g.group_id, g.prompt.prompt_id, g.lease_id, g.SerializeToString(), min_v,
                                         graded, succ, verdict, repr(float(g.device_seconds)), tokens,
                                         int(g.prompt.epoch)], client=pipe)
        counts = {1: 0, 3: 0, 2: 0, 0: 0, 4: 0}
        for res in pipe.execute():
            if res[0] == -1:
                raise JobNotFound("?")  # cleaned up between the check and the write
            counts[res[0]] += 1
        return WriteResult(counts[1], counts[3], counts[2], counts[0], counts[4])

    # ---------------------------------------------------------------------------------------- learner side
    def read_batch(self, job_id: str, consumer: str, max_groups: int, learner_version: int,
                   block_ms: int = 0) -> ReadResult:
        """ReadResult(groups, dropped_stale); see read_batch_response."""
        res = self.read_batch_response(job_id, consumer, max_groups, learner_version, block_ms)
        return ReadResult(list(res.groups), res.dropped_stale)

    @_redis_unavailable
    def read_batch_response(self, job_id: str, consumer: str, max_groups: int, learner_version: int,
                            block_ms: int = 0) -> replay_buffer_pb2.ReadBatchResponse:
        """Up to max_groups trainable groups: first entries idle past claim_idle_ms at *other* (dead) consumers
        (redelivered=True; never the reader's own pending entries, which sit in the batch it is filling), then
        new ones (blocking up to block_ms when none). Groups whose oldest token is more than max_staleness
        versions behind learner_version are acknowledged and counted as stale. No entry and no group id appears
        twice in one response."""
        self.check_job_id(job_id)
        if not consumer:
            raise errors.InvalidArgument("is required", field="consumer", job_id=job_id)
        if max_groups <= 0:
            raise errors.InvalidArgument("must be > 0", field="max_groups", job_id=job_id)
        if block_ms < 0:
            raise errors.InvalidArgument("must be >= 0", field="block_ms", job_id=job_id)
        meta, counters, stream, trained = self._k(job_id, "meta", "counters", "stream", "trained")
        k = self.r.hget(meta, "max_staleness")
        if k is None:
            raise JobNotFound(job_id)
        k = int(k)
        self._observe_version(keys=[counters], args=[int(learner_version)])

        entries: list[tuple[bytes, dict | None, bool]] = []
        idle = self.r.xpending_range(stream, CONSUMER_GROUP, "-", "+", max(4 * max_groups, 256),
                                     idle=self.claim_idle_ms)
        others = [p["message_id"] for p in idle if p["consumer"].decode() != consumer][:max_groups]
        if others:
            claimed = self.r.xclaim(stream, CONSUMER_GROUP, consumer, self.claim_idle_ms, others)
            entries += [(eid, fields, True) for eid, fields in claimed]
            gone = set(others) - {eid for eid, _ in claimed}
            if gone:  # deleted under us (acknowledged elsewhere): drop them from the pending list
                self.r.xack(stream, CONSUMER_GROUP, *gone)
        remaining = max_groups - len(entries)
        if remaining > 0:
            block = int(block_ms) if (block_ms > 0 and not entries) else None
            res = self.r.xreadgroup(CONSUMER_GROUP, consumer, {stream: ">"}, count=remaining, block=block)
            for _, items in (res.items() if isinstance(res, dict) else (res or [])):
                if isinstance(items, list) and items and isinstance(items[0], list):  # RESP3 shape
                    items = items[0]
                entries += [(eid, fields, False) for eid, fields in items]

        gids = [f[b"gid"] if f else b"" for _, f, _ in entries]
        already = self.r.smismember(trained, gids) if gids else []
        kept, stale, dup = [], [], []
        in_batch: set[bytes] = set()
        for (eid, fields, redelivered), done in zip(entries, already):
            if not fields:  # deleted under us (acknowledged elsewhere): nothing to count
                self.r.xack(stream, CONSUMER_GROUP, eid)
            elif done or fields[b"gid"] in in_batch:  # a copy of a group trained on, or already in this batch
                dup.append(eid)
            elif int(learner_version) - int(fields[b"v"]) > k:
                stale.append(eid)
            else:
                in_batch.add(fields[b"gid"])
                kept.append(_buffered_group_bytes(eid, fields[b"g"], redelivered))
        dropped = self._ack_mode(job_id, "stale", stale) if stale else 0
        if dup:
            self._ack_mode(job_id, "duplicate_trained", dup)
        # The stored group bytes are spliced into the response's wire format and parsed once (in C), instead of
        # parsing each group and copying it into a BufferedGroup in Python: ~3x faster for 20 KB groups.
        return replay_buffer_pb2.ReadBatchResponse.FromString(
            b"".join(_field_bytes(1, g) for g in kept) + (b"\x10" + _varint(dropped) if dropped else b""))

    def _ack_mode(self, job_id: str, mode: str, entry_ids: list) -> int:
        keys = self._k(job_id, "stream", "pending", "counters", "trained")
        return int(self._ack(keys=keys, args=[mode, *entry_ids]))

    @_redis_unavailable
    def ack(self, job_id: str, entry_ids: list[str], trained: bool = True) -> int:
        """Acknowledge entries -> how many this call acknowledged (repeats count 0). trained=False: counted as
        a learner-side (stale) drop."""
        self.check_job_id(job_id)
        for i, e in enumerate(entry_ids):
            if not ENTRY_ID_RE.match(e if isinstance(e, str) else e.decode()):
                raise errors.InvalidArgument(f"{e!r} is not a stream entry id", field=f"entry_ids[{i}]",
                                             job_id=job_id)
        if not self.job_exists(job_id):
            raise JobNotFound(job_id)
        if not entry_ids:
            return 0
        return self._ack_mode(job_id, "trained" if trained else "stale", list(entry_ids))

    # ---------------------------------------------------------------------------------------- stats
    @_redis_unavailable
    def snapshot(self, job_id: str) -> Snapshot:
        self.check_job_id(job_id)
        meta, counters, pending, prompts, retired, leases, stream = self._k(
            job_id, "meta", "counters", "pending", "prompts", "retired", "leases", "stream")
        if not self.r.exists(meta):
            raise JobNotFound(job_id)
        with self.r.pipeline(transaction=True) as pipe:
            pipe.hgetall(counters).zcard(pending).zrange(pending, 0, 0, withscores=True)
            pipe.hlen(prompts).scard(retired).zcard(leases).xpending(stream, CONSUMER_GROUP)
            c, n_pending, oldest, n_prompts, n_retired, n_leased, pel = pipe.execute(raise_on_error=False)
        if isinstance(c, Exception):
            raise JobNotFound(job_id)
        c = {k.decode(): v for k, v in c.items()}
        pel_count = pel["pending"] if isinstance(pel, dict) else 0
        return Snapshot(
            job_id=job_id, written=_int(c.get("written")), trained=_int(c.get("trained")),
            dropped_stale=_int(c.get("dropped_stale")), dropped_zero_variance=_int(c.get("dropped_zero_variance")),
            dropped_failed_to_grade=_int(c.get("dropped_failed_to_grade")), pending=n_pending,
            unread=n_pending - pel_count, leased=n_leased, total_prompts=n_prompts, retired_prompts=n_retired,
            epoch=_int(c.get("epoch")), generator_device_seconds=float(c.get("device_seconds") or 0.0),
            generated_tokens=_int(c.get("generated_tokens")),
            oldest_pending_version=int(oldest[0][1]) if oldest else -1,
            learner_version=_int(c.get("learner_version"), -1), duplicates=_int(c.get("duplicates")),
            leases_expired=_int(c.get("leases_expired")), lost_lease=_int(c.get("lost_lease")),
            unretired=_int(c.get("unretired")),
            quota_accepted=_int(c.get("quota_accepted")))

    def stats(self, job_id: str) -> replay_buffer_pb2.BufferStats:
        return self.snapshot(job_id).to_proto()

    @_redis_unavailable
    def pass_rate(self, job_id: str, prompt_id: str) -> tuple[int, int]:
        """(successes, attempts) of a prompt's graded completions."""
        att, suc = self._k(job_id, "attempts", "successes")
        return _int(self.r.hget(suc, prompt_id)), _int(self.r.hget(att, prompt_id))
