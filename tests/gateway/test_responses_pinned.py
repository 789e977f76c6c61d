"""Stored responses and `previous_response_id` (R-FMT-2) through a real `ledger serve`: a stored
answer's id is recorded with the provider and model that answered it; a request continuing it is
served only by a native route of that provider (never a backup elsewhere), refused with the
reason while that provider is cooling, and a 400 naming why when no native route of it exists."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.responses_setup import responses_gateway

CHAINS = {"chains": {"rapid/r1": ["rover/r2", "acme/a1"], "acme/a1": ["bolt/b1"]}}


def _stored(home: Path) -> list[tuple[object, ...]]:
    with Ledger.open(home).db.engine.connect() as conn:
        sql = "SELECT response_id, provider, model FROM stored_responses"
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


def test_stored_response_recorded_and_continued_r_fmt_2(tmp_path: Path) -> None:
    with StandIn() as standin, responses_gateway(tmp_path, standin, **CHAINS) as gw:
        client = gw.openai()
        first = client.responses.create(model="rapid/r1", input="remember 7")  # store omitted
        with client.responses.stream(model="rapid/r1", input="again") as stream:
            streamed = stream.get_final_response()
        stateless = client.responses.create(model="rapid/r1", input="x", store=False)
        second = client.responses.create(model="rapid/r1", input="what number?",
                                         previous_response_id=first.id)  # fmt: skip
        sent = standin.bodies[-1]
    assert second.model == "rapid/r1"
    assert sent["previous_response_id"] == first.id
    assert sorted(_stored(tmp_path)) == sorted(
        (answer.id, "rapid", "rapid/r1") for answer in (first, streamed, second)
    )
    assert stateless.id not in {row[0] for row in _stored(tmp_path)}


def test_pinned_request_never_falls_back_and_is_refused_while_cooling_r_fmt_2(
    tmp_path: Path,
) -> None:
    with StandIn() as standin, responses_gateway(tmp_path, standin, **CHAINS) as gw:
        client = gw.openai()
        first = client.responses.create(model="rapid/r1", input="hi")
        standin.set_script("r1", [Scripted(status=429)] * 4)
        with pytest.raises(openai.RateLimitError):  # r1 once (a 429 without a wait), no backup
            client.responses.create(model="rapid/r1", input="more",
                                    previous_response_id=first.id)  # fmt: skip
        asked = [r.model for r in standin.requests]
        with pytest.raises(openai.RateLimitError) as cooling:
            client.responses.create(model="rapid/r1", input="more",
                                    previous_response_id=first.id)  # fmt: skip
        with pytest.raises(openai.RateLimitError) as cooling_stream, \
                client.responses.stream(model="rapid/r1", input="more",
                                        previous_response_id=first.id) as stream:  # fmt: skip
            list(stream)
        # a stateless request on the same model falls back as usual
        other = client.responses.create(model="rapid/r1", input="x", store=False)
        after = [r.model for r in standin.requests]
    assert asked == ["r1", "r1"]  # the first answer, then the pinned one's one try
    assert str(cooling.value.code).endswith("cooldown")
    assert cooling_stream.value.code == cooling.value.code
    assert after == [*asked, "r2"]  # nothing more reached r1, and r2 only for the stateless one
    assert other.model == "rover/r2"


def test_unknown_previous_id_pinned_to_the_routes_own_provider_r_fmt_2(tmp_path: Path) -> None:
    with StandIn({"r1": [Scripted(status=503)] * 4}) as standin, \
            responses_gateway(tmp_path, standin, **CHAINS) as gw:  # fmt: skip
        with pytest.raises(openai.APIStatusError) as failed:
            gw.openai().responses.create(model="rapid/r1", input="x",
                                         previous_response_id="resp_unknown")  # fmt: skip
        asked = [r.model for r in standin.requests]
    assert failed.value.status_code == 502
    assert asked == ["r1", "r1"]


def test_pinned_without_a_native_route_is_400_naming_why_r_fmt_2(tmp_path: Path) -> None:
    with StandIn() as standin, responses_gateway(tmp_path, standin, **CHAINS) as gw:
        client = gw.openai()
        first = client.responses.create(model="rapid/r1", input="hi")
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="acme/a1", input="more",
                                    previous_response_id=first.id)  # fmt: skip
        assert len(standin.requests) == 1
    assert refused.value.code == "previous_response_id_pinned"
    assert "provider rapid" in str(refused.value)
