"""The command line as a person meets it: its help, its arguments, and what it says when the
daemon can't be asked."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mcpl_router.cli import COMMANDS, main
from mcpl_router.logs import configure_logging

REPO = Path(__file__).resolve().parents[2]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["run", "demo"])
def test_log_level_takes_only_real_levels(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([command, "--log-level", "loud", *(["--config", "x.toml"] if command == "run" else [])], capsys)
    assert code == 2
    assert "invalid choice: 'loud'" in err and "'debug', 'info', 'warning', 'error'" in err


def test_configure_logging_refuses_a_level_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="'loud' is not a log level"):
        configure_logging("loud", json=True)
    configure_logging("debug", json=True)  # as tests/conftest.py left it


def test_top_level_help_lists_every_command_in_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    assert "{" not in out and "``" not in out
    lines = out.splitlines()
    for command in COMMANDS:
        assert any(line.split()[:1] == [command.name] and command.summary in line for line in lines), command.name
    assert {command.name for command in COMMANDS} == {
        "run", "demo", "check-config", "status", "channels", "reload", "health", "journal", "explain"
    }


@pytest.mark.parametrize("command", [command.name for command in COMMANDS])
def test_each_commands_help_says_what_it_does(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    first_paragraph = out.split("\n\n")[1]
    assert len(first_paragraph.split()) >= 15, first_paragraph
    assert "exit codes:" in out


@pytest.mark.parametrize("command", [command.name for command in COMMANDS if command.name != "demo"])
def test_every_command_that_reads_a_config_takes_dash_dash_config(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0 and "--config FILE" in out


def test_check_config_takes_the_file_either_way(capsys: pytest.CaptureFixture[str]) -> None:
    fixtures = str(REPO / "config" / "fixtures.toml")
    for argv in (["check-config", fixtures], ["check-config", "--config", fixtures]):
        code, out, _ = run_cli(argv, capsys)
        assert code == 0 and out.startswith("OK: 2 servers"), argv
    code, _, err = run_cli(["check-config", fixtures, "--config", str(REPO / "config" / "example.toml")], capsys)
    assert code == 2 and "two config files given" in err
    code, _, err = run_cli(["check-config"], capsys)
    assert code == 2 and "check-config needs a config file: mcpl-router check-config --config FILE." in err


def test_health_against_a_closed_port_says_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Bound, never listening: nothing accepts on it while the command runs.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        code, _, err = run_cli(["health", "--url", f"http://127.0.0.1:{port}"], capsys)
    assert code == 1
    assert "Connection refused" in err and "not an HTTP answer" not in err


def test_status_on_a_path_that_is_not_a_socket_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = run_cli(["status", "--socket", str(tmp_path / "notes.txt")], capsys)
    assert code == 2
    assert f"{tmp_path / 'notes.txt'} is a regular file, not a socket" in err
    code, _, err = run_cli(["channels", "--socket", str(tmp_path)], capsys)
    assert code == 2 and "is a directory, not a socket" in err
