"""Hot statements: the few a reserve and a settle send, run at the driver's speed.

They are built with SQLAlchemy like every other statement and compiled once per dialect; each
run then goes straight to the DB-API cursor of the caller's connection, in the caller's
transaction. SQLAlchemy's per-execute work (a cache key walked over the statement, an
execution context, a result object) cost more than SQLite's own execution of these small
statements, and a reserve sends a dozen of them. Bind and result type processing is kept: a
statement whose types convert values runs those conversions here, as SQLAlchemy would.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Connection, Dialect
from sqlalchemy.sql.expression import Executable

Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the bind names (in order, for a positional paramstyle)
    positional: bool
    defaults: dict[str, Any]  # values fixed in the statement (literals turned into binds)
    binds: dict[str, Processor]  # bind name -> its type's conversion, where one exists
    row: Any  # a named tuple class over the result's columns, or None (no rows)
    results: tuple[tuple[int, Processor], ...]  # (column index, its conversion) where one exists


class Hot:
    """One statement, compiled once per dialect and run on the driver's cursor."""

    __slots__ = ("_by_dialect", "_keys", "_returning", "statement")

    def __init__(
        self,
        statement: Executable,
        keys: Sequence[str] | None = None,
        returning_id: Column[Any] | None = None,
    ) -> None:
        self.statement: Any = statement
        # an INSERT or UPDATE given its values as parameters: the columns it sets (as
        # SQLAlchemy compiles such a statement for the keys of the parameters it is given)
        self._keys = None if keys is None else list(keys)
        # an INSERT whose new id is wanted: SQLite gives it as lastrowid, others by RETURNING
        self._returning = returning_id
        self._by_dialect: dict[str, _Compiled] = {}

    def _compiled(self, dialect: Dialect) -> _Compiled:
        found = self._by_dialect.get(dialect.name)
        if found is not None:
            return found
        statement = self.statement
        if self._returning is not None and dialect.name != "sqlite":
            statement = statement.returning(self._returning)
        compiled: Any = statement.compile(dialect=dialect, column_keys=self._keys)
        if compiled.insert_prefetch or compiled.update_prefetch:
            raise ValueError("a hot statement cannot compute Python-side column defaults")
        required = {name for bind, name in compiled.bind_names.items() if bind.required}
        sql = str(compiled)
        positions = compiled.positiontup
        values = compiled.construct_params(_check=False)
        if compiled.post_compile_params:  # an IN over values fixed in the statement
            if any(bind.required for bind in compiled.post_compile_params):
                raise ValueError("a hot statement cannot expand a list given at run time")
            expanded = compiled._process_parameters_for_postcompile(values)
            sql, positions, values = expanded.statement, expanded.positiontup, expanded.parameters
        positional = dialect.paramstyle in ("qmark", "numeric", "format")
        binds = {
            name: fn for name, fn in _bind_processors(compiled).items() if fn is not None
        }
        columns = list(compiled._result_columns)  # (key, name, objects, type) per column
        row = None
        results: tuple[tuple[int, Processor], ...] = ()
        if columns:
            row = _row_class([c[0] for c in columns])
            procs = (c[3]._cached_result_processor(dialect, None) for c in columns)
            results = tuple((i, fn) for i, fn in enumerate(procs) if fn is not None)
        found = _Compiled(
            sql=sql,
            names=tuple(positions) if positional else tuple(values),
            positional=positional,
            defaults={k: v for k, v in values.items() if k not in required and v is not None},
            binds=binds,
            row=row,
            results=results,
        )
        self._by_dialect[dialect.name] = found
        return found

    def _cursor(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, _Compiled]:
        compiled = self._by_dialect.get(conn.dialect.name) or self._compiled(conn.dialect)
        values: Mapping[str, Any]
        if compiled.defaults or compiled.binds:
            values = {**compiled.defaults, **params}
            for name, fn in compiled.binds.items():
                if name in values:
                    values[name] = fn(values[name])
        else:  # the common case: nothing to add or convert (no copy of the caller's values)
            values = params
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        get = values.get
        if compiled.positional:
            cursor.execute(compiled.sql, tuple(map(get, compiled.names)))
        else:
            cursor.execute(compiled.sql, {n: get(n) for n in compiled.names})
        return cursor, compiled

    def rowcount(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run it; the number of rows it changed."""
        cursor, _ = self._cursor(conn, params)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def new_id(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run an INSERT made with `returning_id`; the new row's id."""
        cursor, _ = self._cursor(conn, params)
        try:
            if conn.dialect.name == "sqlite":
                return int(cursor.lastrowid)
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def first(self, conn: Connection, params: Mapping[str, Any]) -> Any:
        """Run it; its first row (attributes by column name, like SQLAlchemy's), or None."""
        cursor, compiled = self._cursor(conn, params)
        try:
            raw = cursor.fetchone()
        finally:
            cursor.close()
        return None if raw is None else _row(compiled, raw)

    def all(self, conn: Connection, params: Mapping[str, Any]) -> list[Any]:
        """Run it; every row."""
        cursor, compiled = self._cursor(conn, params)
        try:
            found = cursor.fetchall()
        finally:
            cursor.close()
        return [_row(compiled, raw) for raw in found]

    def scalar(self, conn: Connection, params: Mapping[str, Any]) -> Any:
        """Run it; the first column of its first row, or None."""
        row = self.first(conn, params)
        return None if row is None else row[0]


def _row_class(keys: list[str]) -> Any:
    """A named tuple over `keys` that also answers `_mapping`, as SQLAlchemy's rows do."""
    base: Any = namedtuple("HotRow", keys, rename=True)  # type: ignore[misc]
    return type("HotRow", (base,), {"__slots__": (), "_mapping": property(base._asdict)})


def _row(compiled: _Compiled, raw: Sequence[Any]) -> Any:
    if not compiled.results:
        return compiled.row._make(raw)
    values = list(raw)
    for i, fn in compiled.results:  # only the columns whose type converts
        values[i] = fn(values[i])
    return compiled.row._make(values)


def _bind_processors(compiled: Any) -> dict[str, Processor | None]:
    """Each bind parameter's conversion as SQLAlchemy would apply it (by bind name)."""
    out: dict[str, Processor | None] = {}
    for bind, name in compiled.bind_names.items():
        out[name] = bind.type._cached_bind_processor(compiled.dialect)
    return out
