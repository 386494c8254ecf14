"""URL helpers shared by the backends."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError


def redact(url: str) -> str:
    """The URL without password or query, for error messages."""
    try:
        parts = urlsplit(url)
        host = f"{parts.hostname or ''}" + (f":{parts.port}" if parts.port is not None else "")
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit((parts.scheme, user + host, parts.path, "", ""))
    except ValueError:
        return "<unparsable URL>"


def check_hosts(url: str) -> None:
    """Refuse a network URL whose host list or ports cannot be read, naming the part at fault.

    Client libraries find out late and deep (redis-py raises a bare ValueError while building
    its pool), so a typo became a traceback and a crash loop. Each host of a comma-separated
    list (libpq takes several) is read on its own. Only the hosts are shown: never the password.
    """
    scheme = url.split(":", 1)[0]
    try:
        hosts = urlsplit(url).netloc.rpartition("@")[2]
    except ValueError as exc:
        raise ConfigError(f"store URL {scheme}://...: cannot be parsed ({exc})") from None
    for host in hosts.split(","):
        try:
            _ = urlsplit(f"//{host}").port  # raises ValueError for a port that is not 0..65535
        except ValueError as exc:
            raise ConfigError(
                f"store URL {scheme}://{hosts}: the port of {host!r} must be a number from 0 to 65535 ({exc})"
            ) from None


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite://`` URL, which must be absolute (``sqlite:///var/lib/x.db``) or ``:memory:``.

    A relative path would resolve against the working directory, which differs between a
    shell, a container and a service manager: two replicas could each open a file of their
    own and each win every slot. Refused rather than guessed.
    """
    path = url[len("sqlite://") :]
    if path == ":memory:" or path.startswith("/"):
        return path
    raise ConfigError(
        f"store URL {url!r}: the SQLite path must be absolute, as in sqlite:///var/lib/anarchon/anarchon.db"
        " (three slashes); a relative path would depend on the working directory, so two replicas could"
        " each use a file of their own and both run every slot"
    )
