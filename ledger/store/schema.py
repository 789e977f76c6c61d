"""SQLAlchemy Core tables: the single description of the schema that the migrations must match.

Times are integer UTC milliseconds; money is integer micro-USD (R-DB-3b).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    false,
    text,
)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

ZERO = text("0")
# Renders `0` on SQLite (as before) and `false` on PostgreSQL, whose booleans reject `0`.
FALSE = false()

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(200), nullable=False),
)

# A single row: the newest time ever stored, so the ledger's clock never moves backwards.
clock = Table(
    "clock",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("newest_ms", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)

sources = Table(
    "sources",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("payload_ref", String(1000), nullable=True),
    Column("state", String(16), nullable=False),
    Column("in_queue", Boolean, nullable=False, server_default=FALSE),
    Column("created_ms", BigInteger, nullable=False),
    Column("last_checked_ms", BigInteger, nullable=False),
    Column("retry_at_ms", BigInteger, nullable=True),
    Column("lease_owner", String(200), nullable=True),
    Column("lease_expires_ms", BigInteger, nullable=True),
    Column("failures", Integer, nullable=False, server_default=ZERO),
    Column("output_failures", Integer, nullable=False, server_default=ZERO),
    Column("backoff_steps", Integer, nullable=False, server_default=ZERO),
    Column("correction_used", Boolean, nullable=False, server_default=FALSE),
    Column("correction_reason", String(64), nullable=True),
    Column("pause_reason", String(100), nullable=True),
    Column("finished_ms", BigInteger, nullable=True),
    # counters carried over when old reservations are compacted (R-DB-6)
    Column("archived_calls", Integer, nullable=False, server_default=ZERO),
    Column("archived_time_ms", BigInteger, nullable=False, server_default=ZERO),
    CheckConstraint("state IN ('queued', 'leased', 'done', 'paused')", name="state"),
    Index("ix_sources_claim", "in_queue", "state", "retry_at_ms", "last_checked_ms"),
)

source_models = Table(
    "source_models",
    metadata,
    Column("source_id", String(200), ForeignKey("sources.id"), primary_key=True),
    Column("model_key", String(300), primary_key=True),
    Column("first_ms", BigInteger, nullable=False),
)

reservations = Table(
    "reservations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # R-RES-10a, R-SC-3a: a caller's request id is unique within its namespace: '' (the default:
    # the socket, the service token, /v1, the CLI and the library) or `key:NAME` (each gateway key
    # its own, so one key can neither learn nor block another's ids; revision 0009)
    Column("request_id", String(200), nullable=True),
    Column("namespace", String(100), nullable=False, server_default=text("''")),
    Column("source_id", String(200), ForeignKey("sources.id"), nullable=False),
    Column("model_key", String(300), nullable=False),
    Column("provider", String(100), nullable=False),
    Column("role", String(16), nullable=False),
    Column("fallback_from", String(300), nullable=True),
    Column("created_ms", BigInteger, nullable=False),
    Column("deadline_ms", BigInteger, nullable=False),
    Column("input_bytes", BigInteger, nullable=False),
    Column("estimate_micro", BigInteger, nullable=True),
    Column("status", String(16), nullable=False),
    Column("settled_ms", BigInteger, nullable=True),
    Column("duration_ms", BigInteger, nullable=True),
    Column("kind", String(32), nullable=True),
    Column("subkind", String(64), nullable=True),
    Column("reason", String(64), nullable=True),
    Column("late", Boolean, nullable=False, server_default=FALSE),
    Column("side_effects", Boolean, nullable=False, server_default=FALSE),
    Column("input_tokens", BigInteger, nullable=True),
    Column("output_tokens", BigInteger, nullable=True),
    Column("actual_micro", BigInteger, nullable=True),
    # what the rolling 24 h ceiling counts: actual cost where known, else the estimate
    Column("cost_micro", BigInteger, nullable=True),
    Column("policy_fp", String(16), nullable=False),
    # on a failed reservation: the one immediate follow-up its decision permitted ('fallback' or
    # 'correction'; NULL none); on a follow-up: the failed reservation it follows (issue 12 item 6)
    Column("follow_up", String(16), nullable=True),
    Column("after_id", Integer, nullable=True),
    # prompt-cache tokens, apart from input_tokens (which are the uncached ones; issue 20)
    Column("cache_write_tokens", BigInteger, nullable=True),
    Column("cache_read_tokens", BigInteger, nullable=True),
    # routing (R-RT-2, R-RT-4, R-RT-6): the pool `model_key` was chosen from, the route's effort,
    # and the sticky lease's scope settle keeps (a source id, '' for a pool-wide lease)
    Column("pool", String(100), nullable=True),
    Column("effort", String(16), nullable=True),
    Column("sticky_scope", String(200), nullable=True),
    # R-TOK-2 (revision 0012): the token estimate a token window counts until usage settles
    Column("estimate_input_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("estimate_output_tokens", BigInteger, nullable=False, server_default=text("0")),
    # R-TOK-3 (revision 0015): the settle time of a reservation whose usage went above its
    # estimate (input or output), else NULL; only these rows are in ix_reservations_overrun
    Column("overrun_ms", BigInteger, nullable=True),
    CheckConstraint(
        "status IN ('open', 'succeeded', 'failed', 'cancelled', 'expired')", name="status"
    ),
    UniqueConstraint("namespace", "request_id"),
    Index("ix_reservations_created", "created_ms", "cost_micro"),
    Index("ix_reservations_source", "source_id", "status"),
    Index("ix_reservations_open", "status", "deadline_ms"),
    Index("ix_reservations_model", "model_key", "created_ms"),
    # R-TOK-3 (revision 0015): a token window's overruns, found by their settle time
    Index(
        "ix_reservations_overrun",
        "overrun_ms",
        "created_ms",
        sqlite_where=text("overrun_ms IS NOT NULL"),
        postgresql_where=text("overrun_ms IS NOT NULL"),
    ),
)

cooldowns = Table(
    "cooldowns",
    metadata,
    Column("scope", String(16), primary_key=True),
    Column("target", String(300), primary_key=True),
    Column("origin", String(16), primary_key=True),
    Column("until_ms", BigInteger, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("reason", String(200), nullable=True),
    Column("created_ms", BigInteger, nullable=False),
    CheckConstraint("scope IN ('provider', 'model')", name="scope"),
    CheckConstraint("origin IN ('policy', 'manual', 'hint')", name="origin"),
    Index("ix_cooldowns_until", "until_ms"),
)

# Recovery probes (R-POL-9, R-POL-10): a row arms a target whose policy or hint cooldown must end
# with one probe; `holder_id` is the reservation that is the probe in flight (until its settle or
# its deadline `holder_deadline_ms`); `streak` counts consecutive failed probes. No row: healthy.
probes = Table(
    "probes",
    metadata,
    Column("scope", String(16), primary_key=True),
    Column("target", String(300), primary_key=True),
    Column("streak", Integer, nullable=False, server_default=ZERO),
    Column("holder_id", Integer, nullable=True),
    Column("holder_deadline_ms", BigInteger, nullable=True),
    CheckConstraint("scope IN ('provider', 'model')", name="scope"),
    Index("ix_probes_holder", "holder_id"),
)

# Health per provider and per model (R-DIAG-6), kept by settle in its write transaction: failures
# in a row since the last success (cancellations do not count), the last failure and success.
health = Table(
    "health",
    metadata,
    Column("scope", String(16), primary_key=True),
    Column("target", String(300), primary_key=True),
    Column("consecutive_failures", Integer, nullable=False, server_default=ZERO),
    Column("last_failure_kind", String(32), nullable=True),
    Column("last_failure_ms", BigInteger, nullable=True),
    Column("last_success_ms", BigInteger, nullable=True),
    CheckConstraint("scope IN ('provider', 'model')", name="scope"),
)

transport_strikes = Table(
    "transport_strikes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model_key", String(300), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Index("ix_transport_strikes_model", "model_key", "at_ms"),
)

notices = Table(
    "notices",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dedup_key", String(700), nullable=False, unique=True),
    Column("category", String(16), nullable=False),
    Column("message", String(500), nullable=False),
    Column("source_id", String(200), nullable=True),
    Column("first_ms", BigInteger, nullable=False),
    Column("last_ms", BigInteger, nullable=False),
    Column("count", Integer, nullable=False, server_default=text("1")),
    Index("ix_notices_last", "last_ms"),
)

# Per-day aggregates of compacted history (R-DB-6): status keeps reporting them.
daily_totals = Table(
    "daily_totals",
    metadata,
    Column("day", String(10), primary_key=True),
    Column("model_key", String(300), primary_key=True),
    Column("attempts", Integer, nullable=False),
    Column("succeeded", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("cancelled", Integer, nullable=False),
    Column("expired", Integer, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost_micro", BigInteger, nullable=False),
    Column("unknown_cost", Integer, nullable=False),
    Column("cache_write_tokens", BigInteger, nullable=False, server_default=ZERO),
    Column("cache_read_tokens", BigInteger, nullable=False, server_default=ZERO),
)

# Per-hour cost totals of reservations (R-RES-2): reserve adds a reservation's cost to the hour it
# was created in, settle adds (new cost - old cost), both in the same write transaction (R-DB-2).
# So for every hour: cost_micro = SUM(reservations.cost_micro), attempts = COUNT(*) of the rows
# created in it. The rolling 24 h sum reads at most one partial hour of reservations plus these
# rows. Hours before the 24 h window are never read again; compaction leaves them (R-DB-6).
cost_hours = Table(
    "cost_hours",
    metadata,
    Column("hour_start_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("cost_micro", BigInteger, nullable=False),
    Column("attempts", Integer, nullable=False),
    CheckConstraint("hour_start_ms % 3600000 = 0", name="hour_aligned"),
)

# Pool cursors (R-RT-5): the index of the candidate a round-robin pool granted last, moved in the
# reserve's write transaction, so every process and service continues one rotation.
pool_cursors = Table(
    "pool_cursors",
    metadata,
    Column("pool", String(100), primary_key=True),
    Column("position", Integer, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
)

# Sticky leases (R-RT-6): per pool and scope (a source id, or '' for stickyScope pool), the
# candidate that last succeeded, when it was first chosen and its last success. Written by settle,
# read (and dropped when its candidate is no longer eligible) by reserve.
pool_sticky = Table(
    "pool_sticky",
    metadata,
    Column("pool", String(100), primary_key=True),
    Column("scope", String(200), primary_key=True),
    Column("model_key", String(300), nullable=False),
    Column("chosen_ms", BigInteger, nullable=False),
    Column("success_ms", BigInteger, nullable=True),
)

# Scopes (R-SC-1): the scopes a reservation was granted under, one row each, with its creation
# time copied so the partial hour a scope's rolling hour and 24 h window read row by row comes
# from one index; its cost and status are read from the reservation itself (settle writes them
# there only). The index leads with the time (revision 0008): a grant under N scopes adds its N
# entries side by side, one index page written rather than one per scope.
reservation_scopes = Table(
    "reservation_scopes",
    metadata,
    Column("reservation_id", Integer, ForeignKey("reservations.id"), primary_key=True),
    Column("scope", String(64), primary_key=True),
    Column("created_ms", BigInteger, nullable=False),
    Index("ix_reservation_scopes_window", "created_ms", "scope", "reservation_id"),
    sqlite_with_rowid=False,  # the primary key is the table (revision 0008)
)

# Per-scope, per-hour totals (R-SC-1), kept like cost_hours: a grant adds its estimate and one call
# to the hour it was created in for each of its scopes, a settle adds (new cost - old cost) to the
# same rows, both in their write transaction. So for every scope and hour: cost_micro =
# SUM(cost_micro) and calls = COUNT(*) of the reservations of that scope created in it, and a
# scope's rolling 24 h cost and rolling hour's calls each read at most one partial hour of its
# rows plus these totals, however busy the scope (calls since revision 0008).
scope_cost_hours = Table(
    "scope_cost_hours",
    metadata,
    Column("scope", String(64), primary_key=True),
    Column("hour_start_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("cost_micro", BigInteger, nullable=False),
    Column("calls", BigInteger, nullable=False, server_default=ZERO),
    # R-TOK-3 (revision 0015): the tokens its reservations count, kept like token_hours
    Column("input_tokens", BigInteger, nullable=False, server_default=ZERO),
    Column("output_tokens", BigInteger, nullable=False, server_default=ZERO),
    CheckConstraint("hour_start_ms % 3600000 = 0", name="hour_aligned"),
)

# Per-hour token totals (R-TOK-3, revision 0015), per model key and provider: reserve adds a
# grant's token estimate to the hour it was created in, settle adds what its usage changes (the
# usage once settled with usage, prompt-cache tokens on the input side, else the estimate), both in
# their write transaction. So for every hour, model and provider the totals equal the rows' token
# parts, and a day's token window reads at most one partial hour of rows plus these totals.
token_hours = Table(
    "token_hours",
    metadata,
    Column("hour_start_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("model_key", String(300), primary_key=True),
    Column("provider", String(100), primary_key=True),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    CheckConstraint("hour_start_ms % 3600000 = 0", name="hour_aligned"),
)

# Per-second token totals (R-TOK-2, revision 0016), kept exactly as token_hours (per model key and
# provider) and for each scope (scope_token_seconds): a minute's token window reads at most one
# partial second of rows plus at most 60 of these rows, however busy the minute. Only the last two
# minutes are kept: the reserve that opens a second's row deletes the rows older than that.
token_seconds = Table(
    "token_seconds",
    metadata,
    Column("second_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("model_key", String(300), primary_key=True),
    Column("provider", String(100), primary_key=True),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    CheckConstraint("second_ms % 1000 = 0", name="second_aligned"),
    Index("ix_token_seconds_model", "model_key", "second_ms"),
    Index("ix_token_seconds_provider", "provider", "second_ms"),
)
scope_token_seconds = Table(
    "scope_token_seconds",
    metadata,
    Column("scope", String(64), primary_key=True),
    Column("second_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    CheckConstraint("second_ms % 1000 = 0", name="second_aligned"),
    Index("ix_scope_token_seconds_second", "second_ms"),
)

# Per-minute token totals (R-TOK-3, revision 0016), kept exactly as token_hours (per model key and
# provider) and for each scope (scope_token_minutes): a day's token window reads at most one
# partial minute of rows, the minute totals up to its first whole hour and the hour totals after.
# Kept 25 hours (a day and its partial first hour): the reserve that opens a minute's row deletes
# the rows older than that.
token_minutes = Table(
    "token_minutes",
    metadata,
    Column("minute_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("model_key", String(300), primary_key=True),
    Column("provider", String(100), primary_key=True),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    CheckConstraint("minute_ms % 60000 = 0", name="minute_aligned"),
    Index("ix_token_minutes_model", "model_key", "minute_ms"),
    Index("ix_token_minutes_provider", "provider", "minute_ms"),
)
scope_token_minutes = Table(
    "scope_token_minutes",
    metadata,
    Column("scope", String(64), primary_key=True),
    Column("minute_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    CheckConstraint("minute_ms % 60000 = 0", name="minute_aligned"),
    Index("ix_scope_token_minutes_minute", "minute_ms"),
)

# The scopes a source was added under (`ledger source add --scope`): every reservation of the
# source carries them, besides the ones its caller names.
source_scopes = Table(
    "source_scopes",
    metadata,
    Column("source_id", String(200), ForeignKey("sources.id"), primary_key=True),
    Column("scope", String(64), primary_key=True),
)

# Gateway keys (R-SC-3): never the key itself. `key_id` is the public part of a key (it finds the
# row in one read); `digest` is HMAC-SHA256 over the whole key under the row's random `salt`.
gateway_keys = Table(
    "gateway_keys",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("key_id", String(32), nullable=False, unique=True),
    Column("salt", String(64), nullable=False),
    Column("digest", String(64), nullable=False),
    # space-separated scope names (a scope name has no space)
    Column("scopes", String(4000), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("expires_ms", BigInteger, nullable=True),
    Column("revoked_ms", BigInteger, nullable=True),
    Column("last_used_ms", BigInteger, nullable=True),
)

# --- refusal counts (revision 0010) ------------------------------------------------------------
# Refusals answered by a service (the gateway), counted per minute: one row per (minute, reason,
# the scope that refused, the gateway key that asked), never one per refusal. A service counts in
# memory and adds its counts here in one statement per row at most once a second, so a flood of
# refusals never costs the writer a transaction each. `scope` and `key_name` are '' when none
# (a primary key column is never NULL). Rows older than two hours are deleted as counts arrive.
refusal_minutes = Table(
    "refusal_minutes",
    metadata,
    Column("minute_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("reason", String(64), primary_key=True),
    Column("scope", String(64), primary_key=True),
    Column("key_name", String(64), primary_key=True),
    Column("count", BigInteger, nullable=False),
    CheckConstraint("minute_ms % 60000 = 0", name="minute_aligned"),
)

# --- stored responses (revision 0011) ----------------------------------------------------------
# R-FMT-2: the provider and model that answered a Responses request whose answer the provider
# keeps (`store` true or omitted), so a `previous_response_id` request is pinned to it. Metadata
# only, never a body; rows older than 30 days are deleted as new ones arrive.
stored_responses = Table(
    "stored_responses",
    metadata,
    Column("response_id", String(200), primary_key=True),
    Column("provider", String(100), nullable=False),
    Column("model", String(400), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Index("ix_stored_responses_created", "created_ms"),
)

# --- learned limits (revision 0013) ------------------------------------------------------------
# R-TOK-4: what a provider last reported left of its token limits, per (provider, upstream model
# id) and kind (`tokens`, `input_tokens`, `output_tokens`), written by the settle that carried the
# answer's headers. A reading counts until its reset (`reset_ms`); later ones are ignored and
# deleted as new readings arrive. A reserve on the key subtracts from `remaining` the estimates of
# the reservations on it granted after `read_at_ms`.
learned_limits = Table(
    "learned_limits",
    metadata,
    Column("provider", String(100), primary_key=True),
    Column("model_id", String(200), primary_key=True),
    Column("kind", String(16), primary_key=True),
    Column("remaining", BigInteger, nullable=False),
    Column("limit_tokens", BigInteger, nullable=True),
    Column("read_at_ms", BigInteger, nullable=False),
    Column("reset_ms", BigInteger, nullable=False),
)
