"""Structured logging: JSON lines on stderr (a console renderer when stderr is a TTY).

Every event is a name with fields (``log.info("link.state", server="a", state="ready")``), never
an interpolated sentence. Secrets never reach a log: fields named like a secret are redacted
by :func:`_redact_secrets` before rendering, as a second line of defence behind not logging them.

Records from the standard library's :mod:`logging` (trio-websocket, h11, any dependency) go
through the same steps (level, timestamp, redaction, renderer) by structlog's
``ProcessorFormatter`` on one root handler, so stderr is one stream of one format: a record's
``extra`` fields become fields (redacted like ours), its logger's name becomes ``logger``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping

import msgspec
import structlog
import structlog.tracebacks
import structlog.typing
from structlog.typing import Processor

_SECRET_FIELD_WORDS = ("token", "secret", "password", "authorization", "apikey", "api_key")
_json_encoder = msgspec.json.Encoder()


def _redact_secrets(_logger: object, _method: str, event: MutableMapping[str, object]) -> MutableMapping[str, object]:
    for key in event:
        lowered = key.lower()
        if any(word in lowered for word in _SECRET_FIELD_WORDS):
            event[key] = "[redacted]"
    return event


def _render_json(_logger: object, _method: str, event: MutableMapping[str, object]) -> str:
    return _json_encoder.encode(event).decode()


def _default(obj: object) -> str:
    return str(obj)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at each record, as structlog's ``PrintLogger`` does
    not: both streams then land in the same place (a test's capture included)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _route_stdlib_logging(numeric: int, steps: list[Processor], tracebacks: list[Processor], renderer: Processor) -> None:
    """One root handler formats every stdlib record as our own lines are (replacing the one a
    previous call installed, so configuring twice never writes a record twice)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.stdlib.ExtraAdder(), *steps],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tracebacks, renderer],
        )
    )
    root.addHandler(handler)
    root.setLevel(numeric)


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog once for the process.

    Args:
        level: the lowest level written (``debug``, ``info``, ``warning``, ``error``).
        json: force JSON lines (True) or the console renderer (False); default: JSON unless
            stderr is a TTY.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        # Never a silent default: "loud" logging at info would hide that it was not understood.
        raise ValueError(f"{level!r} is not a log level: use debug, info, warning or error.")
    if json is None:
        json = not sys.stderr.isatty()
    global _json_encoder
    _json_encoder = msgspec.json.Encoder(enc_hook=_default)
    renderer: Processor = _render_json if json else structlog.dev.ConsoleRenderer(colors=False)
    # JSON lines carry a traceback as structured fields ("exception": frames, types, values);
    # without this step a JSON line says only "exc_info": true and the traceback is lost.
    # No locals: a frame's locals may hold a token.
    tracebacks: list[Processor] = (
        [structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))]
        if json
        else []
    )
    steps: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact_secrets,
    ]
    _route_stdlib_logging(numeric, steps, tracebacks, renderer)
    structlog.configure(
        processors=[*steps, *tracebacks, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


#: What :func:`get_logger` gives: structlog's level-filtering logger (``info``, ``warning``,
#: ``bind``…), as configured above and by default.
Logger = structlog.typing.FilteringBoundLogger


def get_logger(**bound: object) -> Logger:
    """A structlog logger with ``bound`` fields on every line (``server=``, ``agent=``, …)."""
    logger: Logger = structlog.get_logger().bind(**bound)
    return logger
