"""Deduplicated notices (R-DIAG-4): one row per dedup key, counted, never re-armed by restarts."""

from __future__ import annotations

from sqlalchemy import Connection, insert, select, update

from ledger.store.schema import notices


def record_notice(
    conn: Connection, now: int, category: str, dedup_key: str, message: str, source_id: str | None
) -> bool:
    """Record a notice once per dedup key; later occurrences only bump its count. True if new."""
    key = dedup_key[:700]
    existing = conn.execute(select(notices.c.id).where(notices.c.dedup_key == key)).scalar()
    if existing is None:
        conn.execute(
            insert(notices).values(
                dedup_key=key,
                category=category,
                message=message[:500],
                source_id=source_id,
                first_ms=now,
                last_ms=now,
                count=1,
            )
        )
        return True
    conn.execute(
        update(notices)
        .where(notices.c.id == existing)
        .values(last_ms=now, count=notices.c.count + 1)
    )
    return False


def record_pause(conn: Connection, now: int, source_id: str, reason: str) -> None:
    """The notice that a source was paused, with the reason `ledger status` shows (R-POL-5)."""
    record_notice(
        conn, now, "pause", f"pause:{source_id}:{reason}", f"source paused: {reason}", source_id
    )
