"""API tokens: who may call ``/v1`` and with which scope.

Scopes: ``read`` (browse failed records, read one, read job progress and the circuit
breaker), ``replay`` (everything ``read`` can do, plus replaying a record and starting or
cancelling jobs) and ``circuit`` (everything ``read`` can do, plus ordering the group's circuit
breaker open, closed or to probe; not replays). ``replay`` does not include ``circuit``:
stopping a whole group is a different power from replaying records, given to other people.

Where tokens come from (all of them are valid at once, which is how a token is rotated: add
the new one, move clients over, remove the old one, restarting the sidecar each time):

- ``api_tokens`` / ``RETRYD_API_TOKENS``: entries ``name:scope:token`` with scope ``read``,
  ``replay`` or ``circuit`` (comma list in the environment); ``name`` is the token's id in
  audit lines and error messages.
- ``api_tokens_file``: the same entries, one per line (blank lines and ``#`` comments
  skipped), e.g. a Kubernetes Secret mounted as a file.
- ``api_token`` / ``RETRYD_API_TOKEN`` and ``api_token_file`` (the file holds only the token;
  a trailing newline is dropped): one ``replay`` token, as before scopes existed. Its id is a
  fingerprint, ``sha256:`` and the first 8 hex digits of the token's SHA-256.

Every token must be at least ``MIN_TOKEN_BYTES`` bytes of visible ASCII. Problems are reported
as ConfigError lines naming the setting (and the entry's name), never the token. Only SHA-256
digests are kept in memory; a presented token is hashed once and compared with every digest in
constant time, all of them, so neither timing nor an early exit tells which one matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from retryd.config import Settings
from retryd.errors import ConfigError

READ = "read"
REPLAY = "replay"
CIRCUIT = "circuit"
SCOPES = (READ, REPLAY, CIRCUIT)
MIN_TOKEN_BYTES = 32
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class ApiToken:
    """A configured token: its id (name or fingerprint), scope and SHA-256 digest."""

    id: str
    scope: str
    digest: bytes = field(repr=False)

    def allows(self, needed: str) -> bool:
        """Every scope includes ``read``; ``replay`` and ``circuit`` include nothing else."""
        return needed == READ or needed == self.scope


class Credentials:
    """The tokens the sidecar accepts (empty: ``/v1`` is disabled)."""

    def __init__(self, tokens: Sequence[ApiToken] = ()) -> None:
        self.tokens = tuple(tokens)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def identify(self, given: bytes) -> ApiToken | None:
        digest = hashlib.sha256(given).digest()
        found = None
        for token in self.tokens:  # no early exit: the time does not depend on which matched
            if hmac.compare_digest(digest, token.digest):
                found = token
        return found

    def authenticate(self, header: bytes | None) -> tuple[ApiToken | None, str]:
        """``(token, "")`` for a valid ``Authorization: Bearer``, else ``(None, reason)`` with
        reason ``missing_token`` or ``invalid_token``."""
        if not header:
            return None, "missing_token"
        given = bearer_token(header)
        if given is None:
            return None, "missing_token"
        token = self.identify(given)
        return (token, "") if token is not None else (None, "invalid_token")


def bearer_token(header: bytes) -> bytes | None:
    """The token of ``Bearer <token>`` (scheme case-insensitive), or None."""
    scheme, _, given = header.partition(b" ")
    given = given.strip()
    if scheme.lower() != b"bearer" or not given:
        return None
    return given


def fingerprint(token: str) -> str:
    """A short id for a token that has no name: not reversible, stable across restarts."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:8]


def _token_problem(token: str) -> str | None:
    size = len(token.encode("utf-8"))
    if size < MIN_TOKEN_BYTES:
        return f"the token is {size} bytes; at least {MIN_TOKEN_BYTES} are required"
    if not all("!" <= c <= "~" for c in token):
        return "the token must be visible ASCII characters only (no spaces)"
    return None


def parse_entry(entry: str, where: str) -> tuple[tuple[str, str, str] | None, list[str]]:
    """``name:scope:token`` -> ``((name, scope, token), [])`` or ``(None, [problems])``."""
    parts = entry.strip().split(":", 2)
    if len(parts) != 3:
        return None, [f"{where}: expected name:scope:token (scope read, replay or circuit)"]
    name, scope, token = parts
    problems = []
    if not _NAME.fullmatch(name):
        problems.append(f"{where}: the name must be 1-64 letters, digits, '_', '.' or '-'")
    if scope not in SCOPES:
        problems.append(f"{where} ({name}): the scope must be read, replay or circuit")
    token_problem = _token_problem(token)
    if token_problem is not None:
        problems.append(f"{where} ({name}): {token_problem}")
    return ((name, scope, token) if not problems else None), problems


def _read_file(path: Path, setting: str) -> tuple[str | None, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, [f"{setting}: {path} does not exist"]
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "unreadable"
        return None, [f"{setting}: cannot read {path} ({reason})"]
    return text, []


def _entries(settings: Settings) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Every configured ``(name, scope, token)`` with the problems found on the way."""
    found: list[tuple[str, str, str]] = []
    problems: list[str] = []

    def add_entries(entries: Iterable[tuple[str, str]]) -> None:
        for where, text in entries:
            parsed, lines = parse_entry(text, where)
            problems.extend(lines)
            if parsed is not None:
                found.append(parsed)

    add_entries(
        (f"api_tokens[{i}]", secret.get_secret_value())
        for i, secret in enumerate(settings.api_tokens)
    )
    if settings.api_tokens_file is not None:
        text, lines = _read_file(settings.api_tokens_file, "api_tokens_file")
        problems.extend(lines)
        rows = (text or "").splitlines()
        add_entries(
            (f"api_tokens_file line {n}", row.strip())
            for n, row in enumerate(rows, 1)
            if row.strip() and not row.lstrip().startswith("#")
        )
    single: list[tuple[str, str]] = []
    if settings.api_token is not None:
        single.append(("api_token", settings.api_token.get_secret_value()))
    if settings.api_token_file is not None:
        text, lines = _read_file(settings.api_token_file, "api_token_file")
        problems.extend(lines)
        if text is not None:
            single.append(("api_token_file", text.rstrip("\r\n")))
    for where, token in single:
        token_problem = _token_problem(token)
        if token_problem is not None:
            problems.append(f"{where}: {token_problem}")
        else:
            found.append((fingerprint(token), REPLAY, token))
    return found, problems


def load_credentials(settings: Settings) -> Credentials:
    """The sidecar's tokens from every source; ConfigError (one line per problem, no token in
    any line) if one is unreadable, malformed, too short, or configured twice."""
    entries, problems = _entries(settings)
    tokens: list[ApiToken] = []
    seen_ids: set[str] = set()
    seen_digests: dict[bytes, str] = {}
    for name, scope, token in entries:
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        if digest in seen_digests:
            first = seen_digests[digest]
            if first != name:
                problems.append(f"the tokens named {first} and {name} are the same token")
            continue  # the same token given twice (e.g. env and file): accept it once
        if name in seen_ids:
            problems.append(f"two different tokens are named {name}: names must be unique")
            continue
        seen_ids.add(name)
        seen_digests[digest] = name
        tokens.append(ApiToken(name, scope, digest))
    if problems:
        raise ConfigError(problems)
    return Credentials(tokens)
