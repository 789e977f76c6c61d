"""`ledger simulate` (SPEC section 17): replay a trace or scenario in virtual time, two policies."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TypeVar

import click
from pydantic import BaseModel

from ledger.catalog import Catalog, load_catalog
from ledger.cli.main import AppContext, emit_json, run
from ledger.clock import parse_duration_ms
from ledger.config import Policy, load_policy
from ledger.errors import ConfigError, UsageError
from ledger.simulate.limits import MAX_SPAN_DAYS, MAX_SPAN_MS
from ledger.simulate.report import render_text
from ledger.simulate.scenario import scenario_schema
from ledger.simulate.simulation import Simulation
from ledger.simulate.simulation import simulate as run_simulation
from ledger.simulate.timeline import render_svg
from ledger.simulate.trace import trace_schema
from ledger.validation import parse_document

M = TypeVar("M", bound=BaseModel)
_FILE = click.Path(dir_okay=False, path_type=Path)


@click.group("simulate", invoke_without_command=True)
@click.option("--trace", "trace", metavar="FILE", type=_FILE,
              help="A trace (`ledger trace export`) or a scenario file.")
@click.option("--policy", "policy", metavar="FILE", type=_FILE,
              help="The candidate recovery.json to compare with the current one.")
@click.option("--catalog", "catalog", metavar="FILE", type=_FILE,
              help="The catalog to simulate with (default: the state directory's).")
@click.option("--seed", default=0, type=click.IntRange(0, 2**63 - 1), show_default=True,
              help="Seed of every random draw (same inputs and seed: same output).")
@click.option("--replay", type=click.Choice(["time", "sequence"]), default="time",
              show_default=True,
              help="A trace answers by the outcome nearest in time, or the n-th call on a model "
              "by the n-th recorded outcome.")
@click.option("--drain-for", "drain_for", metavar="DURATION", default="24h", show_default=True,
              help="How long after the input's end the queue may keep draining ('0s': stop at "
              "the end).")
@click.option("--timeline", "timeline", metavar="OUT.svg", type=_FILE,
              help="Write the timeline picture (SVG) to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def simulate(
    ctx: click.Context,
    trace: Path | None,
    policy: Path | None,
    catalog: Path | None,
    seed: int,
    replay: str,
    drain_for: str,
    timeline: Path | None,
    as_json: bool,
) -> None:
    """Replay a trace or scenario through the real code in virtual time; compare two policies."""
    if ctx.invoked_subcommand is not None:
        return
    if trace is None:
        raise click.UsageError("--trace FILE is required (a trace or a scenario file)")
    app = ctx.find_object(AppContext)
    assert app is not None
    def prepare() -> tuple[Policy, Catalog, Policy | None, int]:
        current = load_policy(app.state.path)
        cat = load_catalog(app.state.path) if catalog is None else _required(catalog, Catalog)
        candidate = None if policy is None else _required(policy, Policy)
        window = 0 if drain_for in ("0", "0s") else parse_duration_ms(drain_for)
        if window > MAX_SPAN_MS:
            raise UsageError(f"--drain-for: must be at most {MAX_SPAN_DAYS}d (R-SIM-4)")
        return current, cat, candidate, window

    current, cat, candidate, window = run(as_json, prepare)

    def simulation() -> Simulation:
        with _terminate_as_exception():  # inside `run`: an error after a signal is not shown
            return run_simulation(
                trace, current, cat, candidate=candidate, seed=seed,
                replay="sequence" if replay == "sequence" else "time", drain_for_ms=window,
            )  # fmt: skip

    try:
        result = run(as_json, simulation)
    except Terminated as stop:  # the throw-away ledger is gone: its `with` blocks unwound
        click.echo("ledger: terminated", err=True)
        sys.exit(128 + stop.signum)
    if timeline is not None:
        timeline.write_text(render_svg(result.comparison))
    if as_json:
        emit_json(result.document)
    else:
        click.echo(render_text(result.document))
        if timeline is not None:
            click.echo(f"timeline: {timeline}")


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C so every `with` and `finally` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) arrived: the CLI's `ledger: interrupted`, exit 130, wherever it lands.

    Its own class because CPython ends the process by SIGINT at exit (status -2, not 130) once a
    plain KeyboardInterrupt has passed out of code run by `exec` of a string, even if it was
    caught: the methods a dataclass or namedtuple gets at a lazy import mid-run, SQLAlchemy's
    generated wrappers. A subclass is not counted."""


@contextmanager
def _terminate_as_exception() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP (from `timeout`, systemd, CI limits, a closed terminal)
    raise `Terminated` instead of ending the process on the spot, and SIGINT raises
    `Interrupted`, so the throw-away ledger is removed on every way out with the exit status
    documented for it (R-SIM-4). A second signal during the unwinding is ignored: it must not
    cut the removal short.

    The signal decides how the run ends, whatever the unwinding raised after it: raised inside a
    database statement, it leaves that statement's connection holding its lock until the
    exception is gone, so the worker's lease release on the way out waited the busy timeout and
    ended the run `database busy` (exit 4)."""
    received: list[int] = []

    def stop(signum: int) -> BaseException:
        return Interrupted() if signum == signal.SIGINT else Terminated(signum)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)
        raise stop(signum)

    # a signal this process was started ignoring (`nohup`, a script's `cmd &`) stays ignored
    handled = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(s) is not signal.SIG_IGN]  # fmt: skip
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    try:
        yield
    except (Interrupted, Terminated):
        raise
    except BaseException as error:
        if received:
            raise stop(received[0]) from error
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _required(path: Path, model: type[M]) -> M:
    """A file that must exist, validated like recovery.json and catalog.json (fails closed)."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), "(file)", "cannot be read") from exc
    return parse_document(model, text, str(path))


@simulate.command("schema")
@click.option("--of", "of", type=click.Choice(["scenario", "trace"]), default="scenario",
              show_default=True, help="Which file's schema.")
def schema(of: str) -> None:
    """Print the JSON Schema of scenario (or trace) files."""
    click.echo(json.dumps(scenario_schema() if of == "scenario" else trace_schema(), indent=2))

