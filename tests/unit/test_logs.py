"""JSON log lines keep a traceback as structured fields (issue 9: it used to be `exc_info: true`)."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from mcpl_router.logs import configure_logging, get_logger


def test_a_traceback_survives_the_json_format_without_locals(capsys: pytest.CaptureFixture[str]) -> None:
    saved = structlog.get_config()
    configure_logging("info", json=True)
    try:
        token = "s3cret-in-a-local"  # noqa: F841 - a frame's locals must never reach a log
        try:
            raise ValueError("the cause")
        except ValueError as exc:
            get_logger(server="a").error("handler.crashed", exc_info=exc)
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        structlog.configure(**saved)
    entry = json.loads(line)
    [exception] = entry["exception"]
    assert (entry["event"], entry["server"]) == ("handler.crashed", "a")
    assert (exception["exc_type"], exception["exc_value"]) == ("ValueError", "the cause")
    assert exception["frames"] and exception["frames"][-1]["name"] == "test_a_traceback_survives_the_json_format_without_locals"
    assert "s3cret" not in line


def test_a_stdlib_record_comes_out_as_a_json_line_with_its_secrets_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    # Dependencies (trio-websocket, h11) log through the standard library: their records
    # must be the same JSON lines as ours, redacted the same way (issue 25 item 8).
    saved = structlog.get_config()
    configure_logging("info", json=True)
    try:
        logging.getLogger("some-dependency").warning("handshake with %s failed", "peer-1", extra={"auth_token": "s3cret-token", "attempt": 2})
        logging.getLogger("some-dependency").debug("below the level: never written")
        lines = capsys.readouterr().err.strip().splitlines()
    finally:
        configure_logging("debug", json=True)  # as tests/conftest.py left it
        structlog.configure(**saved)
    assert len(lines) == 1, lines
    entry = json.loads(lines[0])
    assert entry["event"] == "handshake with peer-1 failed"
    assert (entry["level"], entry["logger"], entry["attempt"]) == ("warning", "some-dependency", 2)
    assert entry["auth_token"] == "[redacted]"
    assert "timestamp" in entry
    assert "s3cret" not in lines[0]


def test_configuring_twice_writes_a_stdlib_record_once(capsys: pytest.CaptureFixture[str]) -> None:
    saved = structlog.get_config()
    configure_logging("info", json=True)
    configure_logging("info", json=True)
    try:
        logging.getLogger("some-dependency").error("once")
        lines = [line for line in capsys.readouterr().err.splitlines() if '"once"' in line]
    finally:
        configure_logging("debug", json=True)  # as tests/conftest.py left it
        structlog.configure(**saved)
    assert len(lines) == 1, lines
