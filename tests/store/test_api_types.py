"""Issue 20 item 17 (SPEC 15 "bad input anywhere"): the Python API answers a wrong type with one
`UsageError` line, raised before any transaction opens — never a raw AttributeError or TypeError,
never a float stored where an integer belongs."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.api import Ledger
from ledger.classify import Classification
from ledger.errors import LedgerError, NotFoundError, UsageError
from ledger.kinds import AttemptRole, FailureKind
from ledger.policy_table import InteractivePace
from ledger.records import Cancelled, Failed, Success
from ledger.store import sqlite_driver
from tests.support.ledgers import LedgerFactory


class Spy:
    """Counts the transactions a ledger opens (wraps its database's write and read)."""

    def __init__(self, led: Ledger) -> None:
        self.opened = 0
        db = led.db
        write, read = db.write, db.read

        def counting(inner: Callable[[], Any]) -> Callable[[], Any]:
            @contextmanager
            def wrapped() -> Iterator[Any]:
                self.opened += 1
                with inner() as value:
                    yield value

            return wrapped

        db.write = counting(write)  # type: ignore[method-assign]
        db.read = counting(read)  # type: ignore[method-assign,assignment]


def rows(home: Path) -> tuple[int, ...]:
    with sqlite_driver.connect(home / "ledger.db") as raw:
        return tuple(
            raw.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("sources", "reservations", "cooldowns")
        )


AUTH = Classification(FailureKind.AUTH, "http_401")

# One row per wrong type the issue names, and the others of the same kind.
BAD_CALLS: list[tuple[str, Callable[[Ledger, int], object]]] = [
    ("text=bytes", lambda led, rid: led.reserve("s1", "alpha/small", text=b"..")),  # type: ignore[arg-type]
    ("request_id=int", lambda led, rid: led.reserve("s1", "alpha/small", request_id=5)),  # type: ignore[arg-type]
    ("input_bytes=float", lambda led, rid: led.reserve("s1", "alpha/small", input_bytes=0.4)),  # type: ignore[arg-type]
    ("input_bytes=str", lambda led, rid: led.reserve("s1", "alpha/small", input_bytes="5")),  # type: ignore[arg-type]
    ("override=str", lambda led, rid: led.reserve("s1", "alpha/small", override="yes")),  # type: ignore[arg-type]
    ("role=int", lambda led, rid: led.reserve("s1", "alpha/small", role=1)),  # type: ignore[arg-type]
    ("fallback_from=int", lambda led, rid: led.reserve("s1", "alpha/small", fallback_from=3)),  # type: ignore[arg-type]
    ("model=int", lambda led, rid: led.reserve("s1", 7)),  # type: ignore[arg-type]
    ("source=bytes", lambda led, rid: led.reserve(b"s1", "alpha/small")),  # type: ignore[arg-type]
    ("settle id=str", lambda led, rid: led.settle("1", Cancelled())),  # type: ignore[arg-type]
    ("settle id=float", lambda led, rid: led.settle(float(rid), Cancelled())),  # type: ignore[arg-type]
    ("settle outcome=str", lambda led, rid: led.settle(rid, "ok")),  # type: ignore[arg-type]
    ("settle outcome=class", lambda led, rid: led.settle(rid, Success)),  # type: ignore[arg-type]
    ("settle overran=str", lambda led, rid: led.settle(rid, Cancelled(), overran="no")),  # type: ignore[arg-type]
    ("evolve input_bytes", lambda led, rid: led.evolve("s1", "alpha/small", input_bytes=1.5)),  # type: ignore[arg-type]
    ("add_source payload_ref=int", lambda led, rid: led.add_source("s2", payload_ref=5)),  # type: ignore[arg-type]
    ("add_source enqueue=str", lambda led, rid: led.add_source("s2", enqueue="no")),  # type: ignore[arg-type]
    ("set_source_state action", lambda led, rid: led.set_source_state("s1", "delete")),
    ("set_source_state action=int", lambda led, rid: led.set_source_state("s1", 1)),  # type: ignore[arg-type]
    ("select tried=str", lambda led, rid: led.select("s1", tried="alpha/small")),
    ("select tried=[int]", lambda led, rid: led.select("s1", tried=[1])),  # type: ignore[list-item]
    ("select after_failure=int", lambda led, rid: led.select("s1", after_failure=3)),  # type: ignore[arg-type]
    ("select text=bytes", lambda led, rid: led.select("s1", text=b"x")),  # type: ignore[arg-type]
    ("select source=int", lambda led, rid: led.select(5)),  # type: ignore[arg-type]
    ("cooldown_target=int", lambda led, rid: led.cooldown_target(5)),  # type: ignore[arg-type]
    ("model key=None", lambda led, rid: led.model(None)),  # type: ignore[arg-type]
    ("Success finish=str", lambda led, rid: led.settle(rid, Success(finish="yes"))),  # type: ignore[arg-type]
    ("Failed classification=str", lambda led, rid: led.settle(rid, Failed("auth"))),  # type: ignore[arg-type]
    ("Failed side_effects=str", lambda led, rid: led.settle(rid, Failed(AUTH, "y"))),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call"), BAD_CALLS, ids=[n for n, _ in BAD_CALLS])
def test_issue20_item17_wrong_type_is_one_usage_error_before_any_transaction(
    make_ledger: LedgerFactory, home: Path, name: str, call: Callable[[Ledger, int], object]
) -> None:
    led = make_ledger()
    rid = led.reserve("s1", "alpha/small").id
    before = rows(home)
    spy = Spy(led)
    with pytest.raises(UsageError) as info:
        call(led, rid)
    assert "\n" not in info.value.message
    assert spy.opened == 0, name
    assert rows(home) == before


def test_issue20_item17_ids_beyond_64_bits_name_no_reservation(make_ledger: LedgerFactory) -> None:
    # found by the fuzz test below: a raw OverflowError from the driver before the fix
    led = make_ledger()
    with pytest.raises(NotFoundError):
        led.settle(2**63, Cancelled())
    with pytest.raises(UsageError, match="names no reservation"):
        led.reserve("s1", "alpha/small", after=2**63)


def test_issue20_item17_tried_accepts_any_collection_of_keys(make_ledger: LedgerFactory) -> None:
    led = make_ledger()
    as_list = led.select("s1", tried=["alpha/small"])
    as_set = led.select("s1", tried=frozenset({"alpha/small"}))
    assert as_list == as_set
    assert "alpha/small" not in as_list.routes


def test_issue20_item17_whole_float_input_bytes_is_still_refused(
    make_ledger: LedgerFactory, home: Path
) -> None:
    led = make_ledger()
    with pytest.raises(UsageError):
        led.reserve("s1", "alpha/small", input_bytes=4.0)  # type: ignore[arg-type]
    led.reserve("s1", "alpha/small", input_bytes=4)
    with sqlite_driver.connect(home / "ledger.db") as raw:
        assert raw.execute("SELECT typeof(input_bytes) FROM reservations").fetchall() == [
            ("integer",)
        ]


def test_issue20_item17_open_checks_its_arguments(tmp_path: Path) -> None:
    for kwargs in (
        {"home": 5},
        {"home": tmp_path, "db": 5},
        {"home": tmp_path, "policy": "callsPerHour"},
        {"home": tmp_path, "catalog": {}},
        {"home": tmp_path, "env": ["A=1"]},
        {"home": tmp_path, "clock": 5},
        {"home": tmp_path, "jitter": 0.5},
        {"home": tmp_path, "create": "no"},
    ):
        with pytest.raises(UsageError):
            Ledger.open(**kwargs)
    assert list(tmp_path.iterdir()) == []  # nothing created


# ----------------------------------------------------------------- every public method, fuzzed

WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.binary(max_size=8),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
    st.sampled_from([FailureKind.AUTH, AttemptRole.CORRECTION.value[:3], Cancelled(), Success]),
)

# For each public method: its name and a call with one argument replaced by a wrong value.
VALID: dict[str, dict[str, Any]] = {
    "model": {"key": "alpha/small"},
    "target": {"key": "alpha/small"},
    # the gateway's first attempt (R-GW-2): catalog and policy alone allow the model
    "callable_alone": {"key": "alpha/small", "input_bytes": 10},
    "reserve": {"source": "s9", "model": "alpha/small", "input_bytes": 10, "text": None,
                "request_id": None, "override": False, "role": AttemptRole.PRIMARY,
                "fallback_from": None, "after": None, "scopes": ()},
    "settle": {"reservation_id": None, "outcome": Cancelled(), "overran": False},
    # group commit (the service): the same checks, then the steps in one transaction
    "reserve_step": {"source": "s9", "model": "alpha/small", "input_bytes": 10, "text": None,
                     "request_id": None, "override": False, "role": AttemptRole.PRIMARY,
                     "fallback_from": None, "after": None, "scopes": (),
                     "gateway_key": None},  # R-SC-3a: the service's gateway only
    "settle_step": {
        "reservation_id": None, "outcome": Cancelled(), "overran": False, "pace": None,
    },
    "write_steps": {"steps": []},
    "evolve": {"source": "s9", "model": "alpha/small", "input_bytes": 0},
    "evolve_step": {"source": "s9", "model": "alpha/small", "input_bytes": 0},
    "select": {"source": "s9", "model": None, "input_bytes": None, "text": None,
               "after_failure": None, "failed_model": None, "tried": frozenset()},
    "add_source": {"source": "s9", "payload_ref": None, "enqueue": True, "scopes": ()},
    "set_source_state": {"source": "s1", "action": "pause"},
    "cooldown_target": {"target": "alpha"},
    "close": {},
    # the work queue's lease operations (what `worker run` and `LedgerClient` share)
    "claim": {"worker_id": "w1", "checked_before": None, "skip_scopes": ()},
    "token_windows": {},
    "renew": {"source": "s1", "worker_id": "w1", "cover_until_ms": 0, "unpaused": False},
    "finish": {"source": "s1", "worker_id": "w1"},
    "release": {"source": "s1", "worker_id": "w1"},
    "release_spent": {"source": "s1", "worker_id": "w1"},
    "defer_owed_fallback": {"source": "s1", "worker_id": "w1"},
    "commit_failed": {"source": "s1", "worker_id": "w1", "model": "alpha/small"},
    "queue_times": {},
    "ledger_now": {},
    "compact": {"batch": 10},
}


# The documented type of each argument: a value of this type may still be refused inside the
# transaction when only the ledger can judge it (an unknown id, a follow-up the ledger does not
# permit); a value of any other type must be refused before one opens.
TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "source": (str,), "model": (str,), "target": (str,), "action": (str,),
    "input_bytes": (int,), "text": (str,), "request_id": (str,), "fallback_from": (str,),
    "failed_model": (str,), "payload_ref": (str,), "after": (int,), "reservation_id": (int,),
    "override": (bool,), "overran": (bool,), "enqueue": (bool,),
    "role": (AttemptRole, str), "after_failure": (FailureKind, str),
    "outcome": (Success, Failed, Cancelled), "tried": (frozenset, set, list, tuple),
    "worker_id": (str,), "checked_before": (int,), "cover_until_ms": (int,),
    "unpaused": (bool,), "batch": (int,), "steps": (list, tuple),
    "scopes": (list, tuple, set, frozenset), "skip_scopes": (list, tuple, set, frozenset),
    "pace": (InteractivePace, type(None)),  # R-GW-4: the gateway's interactive pace
    "gateway_key": (str,),  # R-SC-3a: the name of the gateway key that sent the request
}


def well_typed(param: str, value: object) -> bool:
    if isinstance(value, bool) and bool not in TYPES[param]:
        return False
    return isinstance(value, TYPES[param])


def test_issue20_item17_every_public_method_is_fuzzed() -> None:
    public = {
        name
        for name, member in inspect.getmembers(Ledger)
        if not name.startswith("_") and callable(member) and name != "open"
    }
    assert public == set(VALID)  # open has its own test above
    assert {p for args in VALID.values() for p in args} == set(TYPES)
    for name, args in VALID.items():
        params = list(inspect.signature(getattr(Ledger, name)).parameters)[1:]
        assert params == list(args), name


FRESH = itertools.count()


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_issue20_item17_wrong_types_never_raise_raw_errors(
    make_ledger: LedgerFactory, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(n for n, a in VALID.items() if a)))
    args = dict(VALID[name])
    wrong = data.draw(st.sampled_from(sorted(args)))
    value = data.draw(WRONG)
    led = make_ledger(callsPerHour=1_000_000, sourceCalls=1_000_000, sourceModels=10)
    if name == "settle":
        args["reservation_id"] = led.reserve(f"fuzz-{next(FRESH)}", "alpha/small").id
    if name == "evolve":
        led.add_source("s9")  # an override is for a known source (else `unknown source`)
    args[wrong] = value
    spy = Spy(led)
    usage: UsageError | None = None
    try:
        getattr(led, name)(**args)
    except UsageError as error:
        usage = error
    except LedgerError:
        pass  # a refusal or a store answer to a well-typed value (e.g. an unknown id)
    led.close()
    if usage is not None:
        assert "\n" not in usage.message
        assert spy.opened == 0 or well_typed(wrong, value), (name, wrong, value)


def test_issue33_usage_and_not_found_errors_are_importable_from_ledger() -> None:
    """The README's examples raise and catch them as `ledger.UsageError` / `NotFoundError`."""
    import ledger
    from ledger import errors

    assert ledger.UsageError is errors.UsageError
    assert ledger.NotFoundError is errors.NotFoundError
    assert {"UsageError", "NotFoundError"} <= set(ledger.__all__)
