"""A queue spread over several distribution keys (issue 19, docs/scale-out.md "One hot queue on every node").

On Citus a queue lives on the shard its name hashes to. A queue whose `spread` is N > 1 keeps its jobs under N
names: key 0 is the queue's own name, key k (1 <= k < N) is `name#k`. `#` is a character no queue name may hold
(the API's pattern, QUEUE_PATTERN), so no queue can collide with another's key, and the database takes `#` only as
such a suffix (migrations/0051_queue_spread.sql). Each key is a queue in every statement: its jobs, its queue_state
row (a copy of the queue's configuration and pause), its counts. Every hot statement still names one key, so it
still runs on one shard; the service adds the keys up where a person reads a queue (stats, listings, job
documents), and takes from them in turn where a worker claims.

On plain PostgreSQL a spread queue works the same and gains nothing: it is for Citus."""

from __future__ import annotations

from functools import lru_cache
from random import randrange

SEP = "#"
MAX_SPREAD = 64  # keys of one queue: queue_state.spread's CHECK (migrations/0051_queue_spread.sql)


def key_name(queue: str, k: int) -> str:
    """The name under which key `k` of `queue` stores its jobs (key 0: the queue's own name)."""
    return queue if k == 0 else f"{queue}{SEP}{k}"


@lru_cache(maxsize=4096)
def key_names(queue: str, spread: int) -> tuple[str, ...]:
    """Every key of a queue spread over `spread` keys, key 0 first."""
    return tuple(key_name(queue, k) for k in range(max(spread, 1)))


def logical(name: str) -> str:
    """The queue a stored name belongs to: the name itself, or the queue of a key `queue#k`."""
    cut = name.find(SEP)
    return name if cut < 0 else name[:cut]


def is_key(name: str) -> bool:
    """Whether a stored name is key 1 or later of a spread queue (not a queue a person names)."""
    return SEP in name


# A single job of a spread queue that may go under any key is made with the name `queue#*N` (N: the spread), and
# given its key where the shared insert statement is built (app/core/jobs.py any_key_resolved): every such job of
# one queue in that statement gets the same key, so that on Citus the statement still writes one shard, and the
# keys even out over statements.
ANY = "#*"


def any_key(queue: str, spread: int) -> str:
    return f"{queue}{ANY}{spread}"


def spread_key(queue: str, spread: int) -> str:
    """The key a new job of a queue spread over `spread` keys goes to: any, at random (jobs even out over keys
    without any state shared between the service's processes)."""
    return key_name(queue, randrange(spread))
