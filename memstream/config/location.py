"""Where a persona's memory lives, and how it is shown: a SQLite file's path or a PostgreSQL URL (told apart by
the scheme), with every secret a connection string can hold masked for every output (messages, logs, pages)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

__all__ = ["MASK", "is_database_url", "redact", "redact_text", "show_database", "url_problem"]

_URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: str | Path) -> bool:
    """Whether a database setting names a PostgreSQL server (a URL), not a SQLite file (a path)."""
    return isinstance(location, str) and location.startswith(_URL_SCHEMES)


MASK = "***"
# Connection parameters whose values are secrets wherever they appear (libpq's password and sslpassword,
# options, which can carry any server setting; an HTTP URL's keys and tokens). A passfile is a path: shown.
_SECRET_PARAMS = frozenset({"password", "sslpassword", "options", "passwd", "pwd", "api_key", "apikey", "key",
                            "token", "access_token", "secret"})
# A secret query value runs to the next `&name=` (an unencoded & inside it is still masked).
_QUERY_VALUE = re.compile(r"([^&=]*)=(.*?)(?=&[^&=]*=|$)", re.DOTALL)
# libpq's key=value connection strings: a value is a single-quoted string or runs to the next blank.
_KEYWORD_VALUE = re.compile(r"\b([A-Za-z_]+)(\s*=\s*)('(?:\\.|[^'\\])*'?|\S*)")
_CONNINFO = re.compile(r"(?:^|\s)(?:host|hostaddr|port|dbname|user|password|sslmode|service|passfile)\s*=")
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S+")


def _userinfo_end(rest: str) -> int:
    """Where the user:password@ part of a URL (after ://) ends: the last @ before the query, so an unencoded @
    or / in a password stays inside it; failing that (a ? in the password) the first @ with no / before it."""
    query = rest.find("?")
    at = rest.rfind("@", 0, len(rest) if query < 0 else query)
    if at < 0:
        at = rest.find("@")
        if at >= 0 and "/" in rest[:at]:
            return -1
    return at


def _masked_query(query: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = unquote(match.group(1)).strip().lower()
        return f"{match.group(1)}={MASK}" if name in _SECRET_PARAMS else match.group(0)
    return _QUERY_VALUE.sub(one, query)


def redact(location: str) -> str:
    """A connection string as every message, log line, report and page shows it: each password masked.

    The one masking of database (and model server) locations: a URL's user:password@ (the password however
    encoded, of a single host or of libpq's several, h1:1,h2:2), its secret query parameters (?password=,
    ?sslpassword=, ?options=, percent-encoded names too) and libpq's key=value form (password=...). Anything
    else, a file path included, is returned as it is. Never raises."""
    scheme, sep, rest = location.partition("://")
    if not sep:
        return _KEYWORD_VALUE.sub(
            lambda m: f"{m.group(1)}{m.group(2)}{MASK}" if m.group(1).lower() in _SECRET_PARAMS else m.group(0),
            location)
    at = _userinfo_end(rest)
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        rest = f"{user}{colon}{MASK if colon else ''}{rest[at:]}"
    query = rest.find("?")  # a ? in the password is masked by now
    if query >= 0:
        rest = rest[:query + 1] + _masked_query(rest[query + 1:])
    return f"{scheme}{sep}{rest}"


def redact_text(text: str) -> str:
    """Text (a log line, an error) with every URL in it shown as `redact` shows it."""
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text) if "://" in text else text


def show_database(location: str | Path) -> str:
    """A database as stats, the dashboard and the doctor name it: a PostgreSQL URL masked (`redact`), a SQLite
    file by its absolute path (":memory:" as it is)."""
    if is_database_url(location):
        return redact(str(location))
    text = str(location)
    return text if text == ":memory:" else os.path.abspath(text)


def url_problem(url: str) -> str | None:
    """Why libpq would read a PostgreSQL URL otherwise than memstream shows it (an unencoded @ or / in its
    password, a query part with no =), said without the password; None when it is fine. libpq's own messages
    for such a URL quote pieces of the password, so it is refused before a connection is tried. libpq's
    key=value form is refused too (it would otherwise name a SQLite file, shown with its password)."""
    if not is_database_url(url):
        if _CONNINFO.search(url):
            return ("libpq's key=value connection strings are not read here: give a postgresql:// URL "
                    f"(postgresql://user:password@host:port/dbname): {redact(url)}")
        return None
    rest = url.partition("://")[2]
    at = _userinfo_end(rest)
    query = rest.find("?", max(at, 0))
    userinfo = rest[:at] if at >= 0 else ""
    if "@" in userinfo or "/" in userinfo:
        return (f"the URL's user name or password holds an unencoded @ or /: percent-encode them (@ as %40, / as "
                f"%2F): {redact(url)}")
    hosts = re.sub(r":\d*(?=,|$)", "", rest[at + 1:query if query >= 0 else len(rest)].partition("/")[0])
    if not hosts.strip(",") and "host=" not in (rest[query:] if query >= 0 else ""):
        return f"the URL names no server host: {redact(url)}"
    if query >= 0 and any(part and "=" not in part for part in rest[query + 1:].split("&")):
        return (f"a query parameter of the URL has no value, or a value holds an unencoded &: percent-encode it "
                f"(& as %26): {redact(url)}")
    return None
