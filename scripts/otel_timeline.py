"""Render an example trace as a picture (issue 48, R-OTEL-1): one gateway request through a real
`ledger serve` whose primary fails twice and whose backup answers, exported over OTLP/HTTP to the
test receiver (tests/support/otlp_receiver.py), decoded, and drawn as an SVG timeline.

    python scripts/otel_timeline.py [--out docs/otel-trace.svg]

Each bar is a span (its start and end from the export), indented under its parent; its label
is the span's name and the attributes a reader looks for first (role, error.type, tokens).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ledger.standin.server import Scripted, StandIn  # noqa: E402
from tests.support.gateway_setup import gateway_catalog  # noqa: E402
from tests.support.otlp_receiver import Received, Receiver  # noqa: E402
from tests.support.serving import running  # noqa: E402

WIDTH, ROW, LEFT, LABEL = 1000, 46, 20, 430


def trace() -> list[Received]:
    """The spans of one request: the primary fails twice (503), the backup answers."""
    script = {"a1": [Scripted(status=503)] * 5}
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="otel-tl-") as scratch, Receiver() as receiver, \
            StandIn(script) as standin:  # fmt: skip
        home = Path(scratch) / "state"
        home.mkdir(mode=0o700)
        (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with running(home, "--listen", "127.0.0.1:0", env=env) as served, \
                served.client(tcp=True) as client:  # fmt: skip
            client.post(
                "/openai/v1/chat/completions",
                json={"model": "acme/a1", "messages": [{"role": "user", "content": "hello"}]},
                headers={"x-ledger-source": "job-42",
                         "traceparent": f"00-{caller_trace}-{caller_span}-01"},
            ).raise_for_status()  # fmt: skip
            receiver.wait_for(lambda r: len(r.spans) >= 4)
        return list(receiver.spans)


def _label(span: Received) -> str:
    a = span.attributes
    parts = [span.name]
    if "ledger.attempt.role" in a:
        parts.append(str(a["ledger.attempt.role"]))
    if "error.type" in a:
        parts.append(f"error.type={a['error.type']}")
    if "gen_ai.usage.output_tokens" in a:
        tokens = f"{a.get('gen_ai.usage.input_tokens')}/{a['gen_ai.usage.output_tokens']}"
        parts.append(f"tokens {tokens}")
    if "ledger.reservation.id" in a:
        parts.append(f"reservation {a['ledger.reservation.id']}")
    if "http.response.status_code" in a:
        parts.append(f"{a['http.response.status_code']}  source={a.get('ledger.source')}")
    return "  ".join(parts)


def render(spans: list[Received]) -> str:
    """The spans as an SVG timeline (parents above their children, by start time)."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Received]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        parent = span.parent_id if span.parent_id in ids else ""
        children.setdefault(parent, []).append(span)
    ordered: list[tuple[int, Received]] = []

    def walk(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            ordered.append((depth, span))
            walk(span.span_id, depth + 1)

    walk("", 0)
    t0 = min(s.start_ns for s in spans)
    t1 = max(s.end_ns for s in spans)
    scale = (WIDTH - LABEL - 2 * LEFT) / max(1, t1 - t0)
    height = ROW * len(ordered) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           'font-family="monospace" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">one gateway request: the primary fails twice, '
           f'the backup answers ({(t1 - t0) / 1e6:.1f} ms)</text>']  # fmt: skip
    for row, (depth, span) in enumerate(ordered):
        y = 40 + row * ROW
        x = LABEL + LEFT + (span.start_ns - t0) * scale
        w = max(2.0, (span.end_ns - span.start_ns) * scale)
        colour = "#d9534f" if "error.type" in span.attributes else (
            "#5b8def" if span.kind == 2 else "#5cb85c")  # fmt: skip
        out.append(f'<text x="{LEFT + 14 * depth}" y="{y + 14}">{escape(_label(span)[:60])}</text>')
        out.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="18" fill="{colour}"/>')
        out.append(f'<text x="{LEFT + 14 * depth}" y="{y + 30}" fill="#666">'
                   f'{escape(_label(span)[60:120])} {(span.end_ns - span.start_ns) / 1e6:.1f} ms'
                   '</text>')  # fmt: skip
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/otel_timeline.py")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "otel-trace.svg")
    args = parser.parse_args(argv)
    args.out.write_text(render(trace()))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
