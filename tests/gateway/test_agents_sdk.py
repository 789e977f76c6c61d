"""The OpenAI Agents SDK (`openai-agents`, pinned in constraints.txt) through a real `ledger serve`
and the stand-in (R-FMT-2, R-FMT-5): `Runner.run_sync` on an `Agent` completes a turn with the
SDK's default model, the Responses API, on a native Responses route and translated to a chat route
(`ModelSettings(store=False)`: a translated route keeps nothing, R-FMT-2). Without the SDK the test
skips with one line naming why; under CI=true or LEDGER_REQUIRE_CLIENTS=1 it fails."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ledger.standin.server import Scripted, StandIn
from tests.support.responses_setup import responses_gateway


def _agents() -> Any:
    try:
        import agents  # lazy: an optional client; its absence is a skip, not an import error
    except ImportError:
        missing = "openai-agents is not installed: pip install -c constraints.txt -e '.[dev]'"
        if os.environ.get("CI") == "true" or os.environ.get("LEDGER_REQUIRE_CLIENTS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    return agents


@pytest.fixture
def fresh_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """`Runner.run_sync` runs on the thread's default loop and shuts its async generators down
    after each run, so a second run on that loop warns; each test gets its own loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.parametrize("model", ["rapid/r1", "acme/a1"])
def test_r_fmt_5_agents_sdk_runs_a_turn_through_the_gateway(
    tmp_path: Path, model: str, fresh_loop: asyncio.AbstractEventLoop
) -> None:
    agents = _agents()
    reply = Scripted(text="agent hello", input_tokens=9, output_tokens=2)
    with StandIn(default=reply) as standin, responses_gateway(tmp_path, standin) as gw:
        client = openai.AsyncOpenAI(base_url=gw.url + "/openai/v1", api_key=gw.token,
                                    max_retries=0)  # fmt: skip
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_default_openai_api("responses")
        agents.set_tracing_disabled(True)
        agent = agents.Agent(
            name="helper", instructions="Answer briefly.", model=model,
            model_settings=agents.ModelSettings(store=False),
        )  # fmt: skip
        # `acme/a1` is the gateway's model key: its `acme/` is no Agents SDK provider prefix
        run = agents.RunConfig(model_provider=agents.MultiProvider(unknown_prefix_mode="model_id"))
        try:
            result = agents.Runner.run_sync(agent, "hello", run_config=run)
        finally:
            fresh_loop.run_until_complete(client.close())
        asked = [(r.path, r.model) for r in standin.requests]
        (sent,) = standin.bodies
    assert result.final_output == "agent hello"
    (response,) = result.raw_responses
    assert response.usage.input_tokens == 9
    assert response.usage.output_tokens == 2
    upstream_path = "/v1/responses" if model.startswith("rapid/") else "/v1/chat/completions"
    assert asked == [(upstream_path, model.split("/")[1])]
    if model.startswith("rapid/"):  # native: the SDK's Responses body, not translated
        assert (sent["instructions"], sent["input"][0]["content"]) == ("Answer briefly.", "hello")
        assert sent["store"] is False
    else:  # translated to chat: instructions become the system message (R-FMT-2)
        assert sent["messages"] == [{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": "hello"}]  # fmt: skip
