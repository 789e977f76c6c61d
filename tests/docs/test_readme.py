"""The README and the site's pages are checked against the code: the policy table, the API example,
the Quickstart, the first session's exit codes, the curl cron job (wherever each lives now)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ledger.policy_table import markdown_table
from tests.docs.pages import README, all_text, fenced, section, user_pages
from tests.support.shell import _shell_env


def test_r_pol_1_readme_table_is_generated_from_the_code() -> None:
    """The site's error policy table is the code's (rule ids left to docs/design.md)."""
    rows = [line for line in markdown_table().splitlines() if line.startswith("| `")]
    assert len(rows) == 11
    for row in rows:
        plain = re.sub(r"\s*\((?:R-[A-Z]+-\d+[a-z]?)\)|,? R-[A-Z]+-\d+[a-z]?", "", row)
        assert plain in all_text(), row


def test_quickstart_starts_with_the_two_commands() -> None:
    text = README.read_text()
    block = text.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    assert lines[0] == "python -m pip install -c constraints.txt -e . && ledger demo"
    assert lines[1] == "python -m pip install -c constraints.txt -e '.[dev]' && python -m pytest"


def test_library_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(fenced(section("Using it from Python"), "python")[0])
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "rate_limit" in result.stdout


# --- issue 25: every shell example of the Quickstart and the Command line section runs -------

EXIT_COMMENT = re.compile(r"^(?P<command>.*?)\s+#\s*exit (?P<code>\d+)\b")


def _section(name: str) -> str:
    return section(name)


def _sh_blocks(text: str) -> list[str]:
    return fenced(text, "sh")


def _stated_session(block: str) -> list[tuple[str, int]]:
    """Each line of an example session with the exit code its trailing comment states."""
    session = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = EXIT_COMMENT.match(line)
        assert match is not None, f"no `# exit N` comment on README line: {line}"
        session.append((match["command"], int(match["code"])))
    return session


def _run_session(session: list[tuple[str, int]], env: dict[str, str], codes: Path) -> str:
    """Run the lines in order in one bash (so `export` carries) and compare each exit code."""
    script = "".join(f'{command}\nprintf "%s\\n" "$?" >> "{codes}"\n' for command, _ in session)
    result = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )
    got = [int(code) for code in codes.read_text().split()] if codes.exists() else []
    seen = [(command, code) for (command, _), code in zip(session, got, strict=False)]
    assert seen == session, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def test_issue25_command_line_examples_exit_as_stated(tmp_path: Path) -> None:
    blocks = _sh_blocks(_section("A first session"))
    assert blocks, "the section A first session has no ```sh example"
    for number, block in enumerate(blocks):
        root = tmp_path / f"block{number}"
        root.mkdir()
        _run_session(_stated_session(block), _shell_env(root), root / "codes")


def test_issue25_quickstart_demo_runs_and_its_follow_up_commands_work(tmp_path: Path) -> None:
    section = _section("Quickstart")
    (block, *_) = _sh_blocks(section)
    install, run = block.splitlines()[0].split(" && ")
    assert install == "python -m pip install -c constraints.txt -e ."  # CI installs it
    env = _shell_env(tmp_path)
    output = _run_session([(run, 0)], env, tmp_path / "codes-demo")
    kept = re.search(r"^\[demo\] state kept in (\S+); look around with:$", output, re.M)
    assert kept is not None, output
    home = Path(kept[1])
    assert home.parent == Path(env["TMPDIR"])
    # the README shows these commands for its example directory: the demo prints the same ones
    shown = re.search(r"state kept in (\S+); look around with:\n(.*?)```", section, re.S)
    assert shown is not None
    readme_commands = [line.strip() for line in shown[2].splitlines()]
    printed = output.split(kept[0], 1)[1].strip().splitlines()
    readme_port = re.search(r"ledger standin --port (\d+)", section)
    assert readme_port is not None

    def as_in_readme(line: str) -> str:  # the example's directory and stand-in port
        line = line.strip().replace(str(home), shown[1])
        return re.sub(r"--port \d+", f"--port {readme_port[1]}", line)

    assert [as_in_readme(line) for line in printed] == readme_commands
    # issue 33 (tests/docs/test_readme_outputs.py): the summary lines above the status the README
    # elides with `…` (block "quickstart-demo") are what the demo prints; only the measured
    # seconds of its HTTP requests and its directory differ per run
    shown_summary = re.search(
        r"<!-- readme-check: quickstart-demo -->\n```text\n(.*?)\n\n", section, re.S
    )
    assert shown_summary is not None

    def timeless(line: str) -> str:
        return re.sub(r" in \d+\.\d s;", " in N s;", as_in_readme(line))

    summary = [timeless(line) for line in output.split("\n\n", 1)[0].splitlines()]
    assert summary == [timeless(line) for line in shown_summary[1].splitlines()]
    follow_ups = [  # `serve` and `standin` run until stopped (tests/test_service*.py and
        (line.strip(), 0)  # test_demo.py start them for real)
        for line in printed
        if line.strip().startswith("ledger ")
        and not line.strip().endswith(" serve")
        and not line.strip().startswith("ledger standin")
    ]
    assert follow_ups
    _run_session(follow_ups, env, tmp_path / "codes-follow-ups")


# --- issue 25 item 1: the README stands on its own; rule ids resolve in docs/design.md ------

DESIGN = README.parent / "docs" / "design.md"
RULE_ID = re.compile(r"\bR-[A-Z]+-\d+[a-z]?\b")


def _design_rule_ids() -> set[str]:
    return set(re.findall(r"^\| (R-[A-Z]+-\d+[a-z]?) \|", DESIGN.read_text(), re.M))


def test_issue25_item1_readme_cites_no_spec_outside_the_repository() -> None:
    for page in user_pages():
        assert "SPEC" not in page.read_text(), page
    assert "(docs/design.md)" in README.read_text()  # the developers' map, where rule ids are


def test_issue25_item1_every_rule_id_in_readme_code_and_test_names_is_a_design_rule() -> None:
    rules = _design_rule_ids()
    cited = set(RULE_ID.findall(all_text()))
    for path in (README.parent / "ledger").rglob("*.py"):
        cited |= set(RULE_ID.findall(path.read_text()))
    for path in (README.parent / "tests").rglob("test_*.py"):
        for name in re.findall(r"def test_r_([a-z]+_\d+[a-z]?)_", path.read_text()):
            kind, number = name.split("_")
            cited.add(f"R-{kind.upper()}-{number}")
    assert cited - rules == set()


def _cron_script() -> str:
    return fenced(section("From a shell cron job"), "sh")[0]


def test_issue33_curl_cron_example_tells_a_refusal_from_an_error(tmp_path: Path) -> None:
    """The curl cron example used a model missing from the example catalog and `-sf … || exit 0`
    took every error for a refusal. Run as written against a real `ledger serve` with the
    example catalog: a reservation is settled, a refusal exits 0, an error exits 1 and says so."""
    import json
    import shutil

    from ledger.catalog import example_catalog
    from tests.support.serving import running

    if shutil.which("curl") is None:
        import pytest

        pytest.skip("curl is not installed")
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    catalog = example_catalog()
    (home / "catalog.json").write_text(json.dumps(catalog.to_json()))
    script = _cron_script()
    model = re.search(r'"model": "([^"]+)"', script)
    assert model is not None
    assert model[1] in {m.key for m in catalog.models}  # a model the example catalog has
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-not-a-key"}
    with running(home, env=env) as served:
        def cron(text: str, sock: Path) -> subprocess.CompletedProcess[str]:
            body = "run_my_job() { true; }\n" + re.sub(r"^SOCK=.*$", f"SOCK={sock}", text,
                                                       flags=re.M)  # fmt: skip
            return subprocess.run(["sh", "-c", body], capture_output=True, text=True,
                                  timeout=60, check=False)  # fmt: skip

        first = cron(script, served.socket)
        assert first.returncode == 0, first.stderr
        with served.client() as http:
            shown = http.get("/v1/sources/nightly-42").json()
        assert shown["state"] == "done"
        assert [a["status"] for a in shown["attempts"]] == ["succeeded"]
        again = cron(script, served.socket)  # done: a 409 refusal, the run ends quietly
        assert (again.returncode, again.stderr) == (0, "")
        unknown = cron(script.replace(model[1], "openai/not-in-the-catalog"), served.socket)
        assert unknown.returncode == 1
        assert "reserve answered HTTP 400" in unknown.stderr
        nowhere = cron(script, tmp_path / "no.sock")
        assert nowhere.returncode == 1
        assert "HTTP 000" in nowhere.stderr
