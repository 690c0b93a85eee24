"""Fair share by key: ranking fair jobs as they are enqueued, the queues that are fair, and the
rules that set a key's limit and weight (see docs/guides/fairness.md and migration 034, whose
functions do the ranking and the re-ranking)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.fairness import KeyRule, KeyShare, like_pattern
from ..core.steps import Query, Steps
from ..core.validation import check_queue_name
from .base import Statement, StoreBase

# Rank fair jobs just inserted (in the enqueue's transaction), each of the key at its place.
_RANK = "SELECT {rank_fair}(%(ids)s::bigint[], %(keys)s::text[])"

# The queues whose every job is fair.
_FAIR_QUEUES = "SELECT name FROM {queues} WHERE fair ORDER BY name"

# Make a queue fair, or not. A queue made fair ranks the jobs it holds that have no rank yet, by
# their concurrency key, in their order (the producers rank the jobs enqueued after).
_SET_FAIR = """
INSERT INTO {queues} (name, fair) VALUES (%(name)s, %(fair)s)
ON CONFLICT (name) DO UPDATE SET fair = excluded.fair, updated_at = now()
"""
_UNRANKED = """
SELECT id, coalesce(substring(limits[1] FROM '^concurrency [^ ]+ (.*)$'), '')
  FROM {live}
 WHERE state IN ('waiting', 'available') AND queue = %(name)s AND rank_at IS NULL
 ORDER BY id
"""

# Set a rule (replacing the pattern's), or remove one; then apply the rules again to the keys the
# pattern matches.
_SET_RULE = """
INSERT INTO {key_rules} (pattern, "like", max_running, weight) VALUES (%(pattern)s, %(like)s, %(max)s, %(weight)s)
ON CONFLICT (pattern) DO UPDATE SET max_running = excluded.max_running, weight = excluded.weight, set_at = now()
"""
_REMOVE_RULE = 'DELETE FROM {key_rules} WHERE pattern = %(pattern)s RETURNING "like"'
_APPLY_RULES = "SELECT {apply_key_rules}(%(like)s)"

# The rules, most specific first (the order a key takes them in).
_RULES = """
SELECT pattern, max_running, weight FROM {key_rules}
 ORDER BY strpos(pattern, '*') = 0 DESC, length(pattern) DESC, pattern
"""

# Each fair key of the queues (all when NULL) with what it holds now: its jobs available and
# running, its weight, and the limit the rules give it; keys without a job are left out. It reads
# every fair job of those queues once (an operator's listing, not a worker's statement).
_SHARES = """
SELECT j.queue, j.fair_key, coalesce(k.weight, 1), j.available, j.running,
       (SELECT max_running FROM {key_rule}(j.fair_key))
  FROM (SELECT queue, fair_key, count(*) FILTER (WHERE state = 'available') AS available,
               count(*) FILTER (WHERE state = 'running') AS running
          FROM {live}
         WHERE state IN ('available', 'running') AND fair_key IS NOT NULL
           AND (%(queue)s::text IS NULL OR queue = %(queue)s)
         GROUP BY queue, fair_key) j
  LEFT JOIN {fair_keys} k ON k.queue = j.queue AND k.key = j.fair_key
 ORDER BY j.queue, j.fair_key
 LIMIT %(limit)s
"""


class Fairness(StoreBase):
    """Fair share by key."""

    _rank = Statement(_RANK)
    _fair_queues = Statement(_FAIR_QUEUES)
    _set_fair = Statement(_SET_FAIR)
    _unranked = Statement(_UNRANKED)
    _set_rule = Statement(_SET_RULE)
    _remove_rule = Statement(_REMOVE_RULE)
    _apply_rules = Statement(_APPLY_RULES)
    _rules = Statement(_RULES)
    _shares = Statement(_SHARES)

    def rank_fair_steps(self, ids: Sequence[int], keys: Sequence[str]) -> Steps[None]:
        """Give the fair jobs ``ids``, just inserted in this transaction, their turns: each of
        the key at the same place in ``keys``."""
        if ids:
            yield Query(self._rank, {"ids": list(ids), "keys": list(keys)})

    def fair_queues_steps(self) -> Steps[frozenset[str]]:
        """The queues whose every job is fair."""
        rows: list[tuple[Any, ...]] = yield Query(self._fair_queues, {})
        return frozenset(row[0] for row in rows)

    def set_queue_fair_steps(self, queue: str, fair: bool) -> Steps[int]:
        """Make ``queue`` fair (ranking the jobs it holds, by their concurrency key) or not (to
        run in one transaction). Returns the jobs ranked."""
        name = check_queue_name(queue)
        yield Query(self._set_fair, {"name": name, "fair": fair})
        if not fair:
            return 0
        rows: list[tuple[Any, ...]] = yield Query(self._unranked, {"name": name})
        yield from self.rank_fair_steps([row[0] for row in rows], [row[1] for row in rows])
        return len(rows)

    def set_key_rule_steps(self, rule: KeyRule) -> Steps[None]:
        """Store ``rule`` (checked) and apply the rules again to the keys it matches (to run in
        one transaction)."""
        like = like_pattern(rule.pattern)
        params = {"pattern": rule.pattern, "like": like, "max": rule.max_running, "weight": rule.weight}
        yield Query(self._set_rule, params)
        yield Query(self._apply_rules, {"like": like})

    def remove_key_rule_steps(self, pattern: str) -> Steps[bool]:
        """Remove the rule of ``pattern`` and apply the others to the keys it matched (to run in
        one transaction); False when there was none."""
        rows: list[tuple[Any, ...]] = yield Query(self._remove_rule, {"pattern": pattern})
        if not rows:
            return False
        yield Query(self._apply_rules, {"like": rows[0][0]})
        return True

    def key_rules_steps(self) -> Steps[list[KeyRule]]:
        """Every rule, most specific first."""
        rows: list[tuple[Any, ...]] = yield Query(self._rules, {})
        return [KeyRule(*row) for row in rows]

    def key_shares_steps(self, queue: str | None = None, limit: int = 1000) -> Steps[list[KeyShare]]:
        """Up to ``limit`` fair keys with jobs (of ``queue``, or of every queue), and what each holds."""
        rows: list[tuple[Any, ...]] = yield Query(self._shares, {"queue": queue, "limit": limit})
        return [KeyShare(*row) for row in rows]
