"""Structured logging: JSON lines on stderr (a console renderer when stderr is a TTY).

Every event is a name with fields (``log.info("link.state", server="a", state="ready")``), never
an interpolated sentence. Secrets never reach a log: fields named like a secret are redacted
by :func:`_redact_secrets` before rendering, as a second line of defence behind not logging them.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog
import structlog.tracebacks

_SECRET_FIELD_WORDS = ("token", "secret", "password", "authorization", "apikey", "api_key")
_json_encoder = msgspec.json.Encoder()


def _redact_secrets(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event:
        lowered = key.lower()
        if any(word in lowered for word in _SECRET_FIELD_WORDS):
            event[key] = "[redacted]"
    return event


def _render_json(_logger: Any, _method: str, event: dict[str, Any]) -> str:
    return _json_encoder.encode(event).decode()


def _default(obj: Any) -> Any:
    return str(obj)


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog once for the process.

    Args:
        level: the lowest level written (``debug``, ``info``, ``warning``, ``error``).
        json: force JSON lines (True) or the console renderer (False); default: JSON unless
            stderr is a TTY.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    if json is None:
        json = not sys.stderr.isatty()
    global _json_encoder
    _json_encoder = msgspec.json.Encoder(enc_hook=_default)
    renderer: Any = _render_json if json else structlog.dev.ConsoleRenderer(colors=False)
    # JSON lines carry a traceback as structured fields ("exception": frames, types, values);
    # without this step a JSON line says only "exc_info": true and the traceback is lost.
    # No locals: a frame's locals may hold a token.
    tracebacks: list[Any] = (
        [structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))]
        if json
        else []
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_secrets,
            *tracebacks,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: Any) -> Any:
    """A structlog logger with ``bound`` fields on every line (``server=``, ``agent=``, …)."""
    return structlog.get_logger().bind(**bound)
