"""Where the ledger lives: an SQLite file or a PostgreSQL database, as ``ledger:`` names it;
and the PostgreSQL database ``state:`` names (the same URL form).

Owns the URL forms and how a PostgreSQL URL is shown in messages (never with its
password); it must not connect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = frozenset({"postgresql", "postgres"})
# query parameters of a PostgreSQL URL that carry a secret
_SECRET_PARAMS = frozenset({"password"})


@dataclass(frozen=True, slots=True)
class PostgresLocation:
    """A PostgreSQL database (the ledger's, or the task state's): the URL asyncpg connects with
    (``postgresql://`` or ``postgres://``).

    ``str()`` and ``repr()`` show ``display``, so the password never reaches a log line.
    """

    url: str

    @property
    def display(self) -> str:
        """The URL without its password (in the user part or the query)."""
        parts = urlsplit(self.url)
        netloc = parts.netloc
        userinfo, at, hosts = netloc.rpartition("@")
        if at:
            netloc = f"{userinfo.partition(':')[0]}@{hosts}"
        params = parse_qsl(parts.query, keep_blank_values=True)
        query = urlencode([(k, v) for k, v in params if k not in _SECRET_PARAMS])
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))

    @property
    def secrets(self) -> list[str]:
        """The URL's password(s), to be taken out of a message that might quote them."""
        parts = urlsplit(self.url)
        found = [parts.password] if parts.password else []
        params = parse_qsl(parts.query, keep_blank_values=True)
        found += [v for k, v in params if k in _SECRET_PARAMS and v]
        return found

    def scrub(self, text: str) -> str:
        """``text`` with the URL's password(s) masked."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def __str__(self) -> str:
        return self.display

    def __repr__(self) -> str:
        return f"PostgresLocation({self.display!r})"


LedgerLocation = Path | PostgresLocation


def parse_ledger_url(url: str) -> LedgerLocation:
    """``sqlite:///PATH`` → the file; ``postgresql://…`` or ``postgres://…`` → the database.

    Anything else is a ValueError (the configuration's message).
    """
    if url.startswith(SQLITE_PREFIX):
        path = url.removeprefix(SQLITE_PREFIX)
        if not path:
            raise ValueError("sqlite:/// needs a file path after it")
        return Path(path)
    if is_postgres_url(url):
        return parse_postgres_url(url)
    raise ValueError(
        "must be a sqlite:///PATH or a postgresql://user@host:port/db URL (postgres:// also)"
    )


def is_postgres_url(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in POSTGRES_SCHEMES


def parse_postgres_url(url: str) -> PostgresLocation:
    """``postgresql://…`` or ``postgres://…`` → the database; anything else, or a port that
    is not a number, is a ValueError (the configuration's message, without the password)."""
    if not is_postgres_url(url):
        raise ValueError("must be a postgresql://user@host:port/db URL (postgres:// also)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 — a port that is not a number raises here
    except ValueError as exc:
        shown = PostgresLocation(url)
        raise ValueError(f"{shown.scrub(str(exc))} in {shown.display}") from None
    return PostgresLocation(url)


def describe(location: LedgerLocation) -> str:
    """The ledger as messages name it: the file's path, or the URL without its password."""
    return location.display if isinstance(location, PostgresLocation) else str(location)


def explain(location: LedgerLocation, exc: BaseException) -> str:
    """What went wrong with the ledger, for a message: the error's kind and text, never
    the URL's password (a driver may quote the URL it was given)."""
    text = f"{type(exc).__name__}: {exc}"
    return location.scrub(text) if isinstance(location, PostgresLocation) else text
