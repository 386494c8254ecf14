"""URL helpers shared by the backends."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact(url: str) -> str:
    """The URL without password or query, for error messages."""
    try:
        parts = urlsplit(url)
        host = f"{parts.hostname or ''}" + (f":{parts.port}" if parts.port is not None else "")
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit((parts.scheme, user + host, parts.path, "", ""))
    except ValueError:
        return "<unparsable URL>"
