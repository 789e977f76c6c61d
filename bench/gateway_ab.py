"""`python -m bench.gateway_ab [--base REV] [--pairs N]`: the gateway's time to first byte, one
code tree against another, side by side in one run.

A change to the gateway's request path moves the first byte by tenths of a millisecond, while the
same figure moves by a millisecond between runs as a shared machine's pace changes. So this runs
two `ledger serve` processes at once: A on the code of REV (a git worktree, removed afterwards),
B on the working tree; each step sends one stream to each (the order alternating), each followed
by the same stream straight to the stand-in, and keeps the pair's difference B - A. The paired
median and the medians of each half say whether a change moved the figure beyond the noise; run it
with `--base HEAD` first (A/A: the same code on both sides) to see that noise. Also printed: the
event-loop thread's CPU per request of each service (from /proc), and each side's first byte beyond
an in-process reserve timed between the pairs, as the `gateway` figure has it.

Invariant: both services are real `ledger serve` subprocesses over TCP against one stand-in that
keeps its connections alive, each on its own state directory; nothing is written outside the
temporary directory, and the worktree is removed even when the run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.common import bench_policy
from bench.gateway import BODY, _direct_body, _InProcess, _timed_stream
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import gateway_catalog
from tests.support.serving import running

ROOT = Path(__file__).resolve().parent.parent
STREAM = {**BODY, "stream": True}


@contextlib.contextmanager
def worktree(rev: str, parent: Path) -> Iterator[Path]:
    """A detached git worktree of `rev` under `parent`, removed afterwards."""
    where = parent / "base"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(where), rev],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(where)], capture_output=True)


def code_env(code: Path) -> dict[str, str]:
    """The environment that makes a Python process run the `ledger` of the tree at `code`.
    PYTHONSAFEPATH: `python -m ledger` would otherwise put the current directory first on the
    path, ahead of PYTHONPATH, and run the working tree's code on both sides."""
    return {"PYTHONPATH": str(code), "PYTHONSAFEPATH": "1"}


def _home(parent: Path, name: str, standin: StandIn) -> Path:
    home = parent / name
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(gateway_catalog(standin)))
    (home / "recovery.json").write_text(json.dumps(bench_policy().to_json()))
    return home


def _loop_cpu_s(pid: int) -> float:
    """User + system CPU of a process's main (event loop) thread, in seconds."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(base: str, pairs: int, warm: int = 10) -> dict[str, float]:
    """The figures of one A/B run (milliseconds)."""
    answer = Scripted(text="a short answer", stream_pieces=4)
    with (
        tempfile.TemporaryDirectory(prefix="ledger-ab-") as scratch,
        StandIn(default=answer, keep_alive=True) as standin,
        worktree(base, Path(scratch)) as code_a,
    ):
        parent = Path(scratch)
        inproc = _InProcess(parent)
        env_a, env_b = code_env(code_a), code_env(ROOT)
        direct = standin.base_url_openai + "/chat/completions"
        with (
            contextlib.closing(inproc),
            running(_home(parent, "a", standin), "--listen", "127.0.0.1:0", env=env_a) as a,
            running(_home(parent, "b", standin), "--listen", "127.0.0.1:0", env=env_b) as b,
            httpx.Client(headers={"authorization": f"Bearer {a.token}"}, timeout=60) as ca,
            httpx.Client(headers={"authorization": f"Bearer {b.token}"}, timeout=60) as cb,
        ):
            assert a.url is not None
            assert b.url is not None
            ua = a.url + "/openai/v1/chat/completions"
            ub = b.url + "/openai/v1/chat/completions"
            for _ in range(warm):
                _timed_stream(ca, ua, STREAM)
                _timed_stream(cb, ub, STREAM)
            cpu_a, cpu_b = _loop_cpu_s(a.proc.pid), _loop_cpu_s(b.proc.pid)
            ta: list[float] = []
            tb: list[float] = []
            sides = [(ca, ua, ta), (cb, ub, tb)]
            for i in range(pairs):
                for client, url, out in sides if i % 2 == 0 else sides[::-1]:
                    gateway = _timed_stream(client, url, STREAM).first_byte
                    straight = _timed_stream(client, direct, _direct_body(True)).first_byte
                    out.append(gateway - straight)
                inproc.reserve()
            cpu_a = (_loop_cpu_s(a.proc.pid) - cpu_a) / pairs
            cpu_b = (_loop_cpu_s(b.proc.pid) - cpu_b) / pairs
    diffs = [y - x for x, y in zip(ta, tb, strict=True)]
    half = max(1, len(diffs) // 2)
    reserve = statistics.median(inproc.reserves)
    return {
        "paired_median_ms": statistics.median(diffs) * 1000,
        "first_half_ms": statistics.median(diffs[:half]) * 1000,
        "second_half_ms": statistics.median(diffs[half:] or diffs) * 1000,
        "a_beyond_reserve_ms": (statistics.median(ta) - reserve) * 1000,
        "b_beyond_reserve_ms": (statistics.median(tb) - reserve) * 1000,
        "reserve_ms": reserve * 1000,
        "a_loop_cpu_ms": cpu_a * 1000,
        "b_loop_cpu_ms": cpu_b * 1000,
    }


def report(base: str, pairs: int, figures: dict[str, float]) -> str:
    """The run as text."""
    f = figures
    return "\n".join((
        f"A = {base} (worktree), B = the working tree; {pairs} pairs, one stream each",
        f"first byte, B - A, paired median: {f['paired_median_ms']:+.3f} ms "
        f"(halves {f['first_half_ms']:+.3f}, {f['second_half_ms']:+.3f})",
        f"first byte beyond an in-process reserve ({f['reserve_ms']:.3f} ms): "
        f"A {f['a_beyond_reserve_ms']:.3f} ms, B {f['b_beyond_reserve_ms']:.3f} ms",
        f"event-loop CPU per request: A {f['a_loop_cpu_ms']:.3f} ms, "
        f"B {f['b_loop_cpu_ms']:.3f} ms (10 ms ticks)",
    ))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_ab", description=__doc__)
    parser.add_argument("--base", default="HEAD", help="git revision for side A (default HEAD)")
    parser.add_argument("--pairs", type=int, default=400, help="pairs of streams (default 400)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    print(report(args.base, args.pairs, run(args.base, args.pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
