"""The access log without secrets: query strings never reach a log line.

uvicorn's access log prints the request line with its query string, so
``GET /v1/stats?api_key=...`` would write a key to the log even though the server
refuses it (keys belong in headers). :class:`RedactQueryFilter` rewrites every access
record's path to keep the path and drop the query (``/v1/stats?[redacted]``): any
parameter name or value could be a secret, so none is kept.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

__all__ = ["ACCESS_LOGGER", "RedactQueryFilter", "install", "log_config"]

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "[redacted]"


def redact(path: str) -> str:
    """``path`` with its query string replaced by ``[redacted]``."""
    head, sep, _ = path.partition("?")
    return f"{head}?{REDACTED}" if sep else head


class RedactQueryFilter(logging.Filter):
    """A logging filter for uvicorn's access records: the query string is replaced, the record kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn logs (client_addr, method, full_path, http_version, status_code).
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact(args[2]), *args[3:])
        # Anything else that looks like a request line is scrubbed too (other formats, other servers).
        elif isinstance(record.msg, str) and "?" in record.msg and not args:
            record.msg = " ".join(redact(part) if "?" in part else part for part in record.msg.split(" "))
        return True


def install(logger_name: str = ACCESS_LOGGER) -> None:
    """Attach the filter to the access logger (idempotent; for apps run by any uvicorn)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactQueryFilter) for f in logger.filters):
        logger.addFilter(RedactQueryFilter())


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with the filter on its access logger and handler."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_query"] = {"()": f"{__name__}.RedactQueryFilter"}
    config["handlers"]["access"].setdefault("filters", []).append("redact_query")
    config["loggers"][ACCESS_LOGGER].setdefault("filters", []).append("redact_query")
    return config
