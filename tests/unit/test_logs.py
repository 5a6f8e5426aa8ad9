"""JSON log lines keep a traceback as structured fields (issue 9: it used to be `exc_info: true`)."""

from __future__ import annotations

import json

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
