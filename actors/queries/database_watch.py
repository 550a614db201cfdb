"""The database watch's statements (:mod:`actors.database_watch`): the oldest open transaction
and the dead rows of the tables Stockade updates most, both read from PostgreSQL's statistics
views (no table of Stockade's is touched)."""

from __future__ import annotations

# The oldest transaction open in this database, other than this session's own: its age (by the
# server's clock, now and not at this statement's start), pid, application, client and state
# ('idle in transaction' for one left open). Only client backends count: an autovacuum worker's
# transaction holds no row versions back from vacuum the way a client's does. No row: none open.
# Sessions of other roles show no xact_start unless this role may read every session's
# statistics (pg_read_all_stats, which pg_monitor includes; superusers may): then they are not
# seen.
OLDEST_TRANSACTION = """
SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_s,
       pid, coalesce(application_name, '') AS application_name,
       coalesce(host(client_addr), '') AS client, coalesce(state, '') AS state
  FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend'
   AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
 ORDER BY xact_start
 LIMIT 1
"""

# $1 the tables' names. Their live and dead row versions as the statistics system last counted
# them (updated when a session's transaction ends, within a second or so), in this schema.
TABLE_ROWS = """
SELECT relname AS table_name, n_live_tup AS live_rows, n_dead_tup AS dead_rows
  FROM pg_stat_user_tables
 WHERE schemaname = current_schema() AND relname = ANY($1::text[])
 ORDER BY relname
"""

# $1 a table's name. Its row updates as the statistics system counted them: all of them, those
# that were HOT (no index entry written: the new version fit on the row's page and no indexed
# column changed), and its dead row versions now, in this schema (no row: no such table). The
# counts reach the view when the writing session's transaction ends, up to about a second
# later; pg_stat_clear_snapshot() first, so a reader in a transaction sees fresh counts.
TABLE_UPDATES = """
SELECT n_tup_upd AS updates, n_tup_hot_upd AS hot_updates, n_dead_tup AS dead_rows
  FROM pg_stat_user_tables, pg_stat_clear_snapshot()
 WHERE schemaname = current_schema() AND relname = $1
"""
