"""The stand-in's opt-in keep-alive (bench realism: a real provider's connections are reused):
fault-free replies, streaming or not, keep the connection for the next request; a fault closes
it; the default stand-in closes every connection, as the fault tests expect."""

from __future__ import annotations

import contextlib
import json

import httpx

from ledger.standin.server import Scripted, StandIn

BODY = {"model": "a1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def _stream_text(client: httpx.Client, url: str) -> str:
    text = []
    with client.stream("POST", url, json={**BODY, "stream": True}) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def test_keep_alive_reuses_one_connection_for_fault_free_replies() -> None:
    with StandIn(default=Scripted(text="a b c", stream_pieces=3), keep_alive=True) as standin:
        url = standin.base_url_openai + "/chat/completions"
        with httpx.Client(timeout=10) as client:
            for _ in range(3):
                assert client.post(url, json=BODY).json()["choices"][0]["message"]["content"]
                assert _stream_text(client, url) == "a b c"
        assert standin.connections == 1
        assert len(standin.requests) == 6


def test_keep_alive_closes_after_a_fault_and_the_default_closes_every_reply() -> None:
    cut = Scripted(text="a b c", stream_pieces=3, cut_after=1)
    with StandIn({"a1": [cut]}, keep_alive=True) as standin:
        url = standin.base_url_openai + "/chat/completions"
        with httpx.Client(timeout=10) as client:
            with contextlib.suppress(httpx.RemoteProtocolError):  # the cut: the body ends early
                _stream_text(client, url)
            assert client.post(url, json=BODY).status_code == 200
        assert standin.connections == 2
    with StandIn() as standin:
        url = standin.base_url_openai + "/chat/completions"
        with httpx.Client(timeout=10) as client:
            for _ in range(2):
                client.post(url, json=BODY)
        assert standin.connections == 2
