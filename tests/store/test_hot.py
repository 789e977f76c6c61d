"""Hot statements (the lean reserve): compiled once per dialect and run on the driver's cursor,
they answer exactly what SQLAlchemy's own execution of the same statement answers — type
conversions, values fixed in the statement (an IN over literals) and new ids included — on
SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, bindparam, insert, select
from sqlalchemy import update as sa_update

from ledger.store.dialects import make_engine
from ledger.store.hot import Hot
from tests.support.backends import BACKENDS

META = MetaData()
THINGS = Table(
    "hot_things",
    META,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(20), nullable=False),
    Column("flag", Boolean, nullable=False),
    Column("size", Integer, nullable=True),
)
_INSERT = Hot(insert(THINGS), keys=("name", "flag", "size"), returning_id=THINGS.c.id)
_BY_STATE = select(THINGS.c.id, THINGS.c.name, THINGS.c.flag).where(
    THINGS.c.name.in_(["a", "b"]), THINGS.c.size > bindparam("least")
).order_by(THINGS.c.id)
_FLAG = sa_update(THINGS).where(THINGS.c.id == bindparam("b_id"))


@pytest.fixture
def url(ledger_db: str | None, tmp_path: Path) -> str:
    return ledger_db or f"sqlite:///{tmp_path}/hot.db"


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_a_hot_statement_answers_what_sqlalchemy_answers(url: str) -> None:
    engine = make_engine(url, busy_timeout_ms=10_000)
    try:
        META.create_all(engine)
        with engine.begin() as conn:
            ids = [
                _INSERT.new_id(conn, {"name": name, "flag": flag, "size": size})
                for name, flag, size in (("a", True, 5), ("b", False, 9), ("c", True, 9))
            ]
            assert ids == sorted(ids)
            assert len(set(ids)) == 3  # each insert's own new id
            hot = Hot(_BY_STATE)
            mine = hot.all(conn, {"least": 4})
            theirs = conn.execute(_BY_STATE, {"least": 4}).all()
            assert [tuple(r) for r in mine] == [tuple(r) for r in theirs]
            assert [r.flag for r in mine] == [True, False]
            assert {type(r.flag) for r in mine} == {bool}  # booleans, not 1 and 0
            assert mine[0]._mapping == {"id": ids[0], "name": "a", "flag": True}
            assert hot.first(conn, {"least": 100}) is None
            assert Hot(select(THINGS.c.size).where(THINGS.c.id == ids[2])).scalar(conn, {}) == 9
            flag = Hot(_FLAG, keys=("flag",))
            assert flag.rowcount(conn, {"b_id": ids[1], "flag": True}) == 1
            assert flag.rowcount(conn, {"b_id": -1, "flag": True}) == 0
            assert conn.execute(select(THINGS.c.flag).where(THINGS.c.id == ids[1])).scalar()
    finally:
        engine.dispose()


def test_a_hot_statement_refuses_what_it_cannot_run_exactly() -> None:
    engine = make_engine("sqlite://", busy_timeout_ms=1_000)
    try:
        listed = select(THINGS.c.id).where(THINGS.c.name.in_(bindparam("names", expanding=True)))
        with engine.connect() as conn, pytest.raises(ValueError, match="list given at run time"):
            Hot(listed).all(conn, {"names": ["a"]})
    finally:
        engine.dispose()
