"""The database's health for the queue: what holds the MVCC horizon back, and the jobs table's
dead rows, sizes and vacuum settings (what the reaper watches and ``miniqueue doctor`` prints).

One transaction anywhere that keeps an old snapshot (a long query, a session idle in a
transaction, a prepared transaction, a replication slot, a standby's feedback) stops every
vacuum from removing the rows dead since it began: each claim then wades through more of them.
Every reading here comes from the server's statistics views, at a cost that does not grow with
the jobs table, under the monitoring queries' statement timeout (the sizes need a lock on the
table, which a migration may hold).
"""

from __future__ import annotations

from typing import Any

from ..core.db import Connection
from ..core.records import HorizonHolder, TableHealth
from ..core.steps import Query, Steps, atomic, run
from .base import Statement, StoreBase
from .rows import monitoring

# What holds the oldest snapshots back for the queue's tables, oldest first: sessions of this
# database with a snapshot or a transaction id (a write not yet committed holds the horizon as
# a snapshot does; this session left out), its prepared transactions, and, for every database,
# replication slots' xmin and standbys' feedback. (A session of another database, or a logical
# slot's catalog_xmin, holds back only its own tables or the catalogs, not the jobs table.) `age` is how many
# transactions ago the snapshot was taken (xid age); `since` when it began, where the server
# knows (a slot has no such time).
_HORIZON = """
SELECT kind, pid, name, state, since, extract(epoch FROM now() - since)::float8 AS seconds, age, query FROM (
    SELECT 'transaction' AS kind, pid, nullif(application_name, '') AS name, state,
           coalesce(xact_start, query_start) AS since, greatest(age(backend_xmin), age(backend_xid)) AS age,
           left(query, 200) AS query
      FROM pg_stat_activity
     WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()
       AND backend_type = 'client backend' AND datname = current_database()
    UNION ALL
    SELECT 'prepared transaction', NULL, gid, NULL, prepared, age(transaction), NULL
      FROM pg_prepared_xacts WHERE database = current_database()
    UNION ALL
    SELECT 'replication slot', active_pid, slot_name, CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL,
           age(xmin), NULL
      FROM pg_replication_slots WHERE xmin IS NOT NULL
    UNION ALL
    SELECT 'standby feedback', pid, nullif(application_name, ''), state, backend_start, age(backend_xmin), NULL
      FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
) holders
 ORDER BY age DESC NULLS LAST, since NULLS LAST
 LIMIT %(limit)s
"""

# The jobs table as the server's statistics have it: live and dead rows, its size and its
# indexes' (the claim index's too), when a vacuum last ran, and the autovacuum settings in force
# for it (the table's own, else the server's).
_TABLE_HEALTH = """
SELECT pg_stat_get_live_tuples(c.oid) AS live_rows, pg_stat_get_dead_tuples(c.oid) AS dead_rows,
       pg_table_size(c.oid) AS table_bytes, pg_indexes_size(c.oid) AS index_bytes,
       pg_relation_size(to_regclass(%(claim_index)s)) AS claim_index_bytes,
       greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS last_vacuum,
       current_setting('autovacuum')::boolean AS autovacuum,
       coalesce((SELECT split_part(o, '=', 2) FROM unnest(c.reloptions) AS o
                  WHERE o LIKE 'autovacuum_vacuum_scale_factor=%%'),
                current_setting('autovacuum_vacuum_scale_factor')) AS vacuum_scale_factor,
       coalesce((SELECT split_part(o, '=', 2) FROM unnest(c.reloptions) AS o
                  WHERE o LIKE 'autovacuum_vacuum_threshold=%%'),
                current_setting('autovacuum_vacuum_threshold')) AS vacuum_threshold,
       extract(epoch FROM now())::float8 AS database_clock
  FROM pg_class c
 WHERE c.oid = %(table)s::regclass
"""


class Health(StoreBase):
    """What the reaper and ``miniqueue doctor`` read of the database's health."""

    _horizon = Statement(_HORIZON)
    _table_health = Statement(_TABLE_HEALTH)

    def horizon(self, conn: Connection, limit: int = 5) -> list[HorizonHolder]:
        """What holds the oldest snapshots back, oldest first (see :class:`HorizonHolder`)."""
        return run(conn, self.horizon_steps(limit))

    def horizon_steps(self, limit: int = 5) -> Steps[list[HorizonHolder]]:
        """:meth:`horizon` as steps."""
        rows: list[dict[str, Any]] = yield from atomic(monitoring(Query(self._horizon, {"limit": limit}, named=True)))
        return [HorizonHolder(**row) for row in rows]

    def table_health(self, conn: Connection) -> TableHealth:
        """The jobs table's rows, sizes and vacuum settings (see :class:`TableHealth`)."""
        return run(conn, self.table_health_steps())

    def table_health_steps(self) -> Steps[TableHealth]:
        """:meth:`table_health` as steps."""
        params = {
            "table": self.live_table_name,
            "claim_index": f"{self.identifiers['schema']}.idx_miniqueue_jobs_claim",
        }
        rows: list[dict[str, Any]] = yield from atomic(monitoring(Query(self._table_health, params, named=True)))
        row = rows[0]
        settings = {
            "vacuum_scale_factor": float(row["vacuum_scale_factor"]),
            "vacuum_threshold": int(row["vacuum_threshold"]),
        }
        return TableHealth(**{**row, **settings})
