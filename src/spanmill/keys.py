"""Who may call: client API keys by id (the gateway, the collector's receiver), and the
gateway's admin credential.

Client keys live in a file (on Kubernetes, a Secret mounted as one), one per line::

    <key id> sha256:<hex digest of the key>

Only the digest is kept: the key itself is shown once, when it is made
(``spanmill gateway-key``). Keys are long random tokens, so one SHA-256 stands
where a slow password hash would for a password. A presented key is hashed and
compared with every digest in constant time (no early exit, no lookup that could
time differently), and the id of the key that matched is who called: recorded on
the call's LLM span and on feedback. The file is re-read when it changes, so a key
is revoked by deleting its line, with no restart; a file that cannot be read keeps
the last good keys (and says so in the log).

The admin routes (``/admin``) take a credential of their own
(``SPANMILL_GATEWAY_ADMIN_API_KEY``): a client key never opens them.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from pathlib import Path

from pydantic import SecretStr

from spanmill.errors import ConfigError

log = logging.getLogger(__name__)
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})\s+sha256:([0-9a-f]{64})$")
# The id a single shared key (SPANMILL_GATEWAY_API_KEY) is known by.
SHARED_KEY_ID = "default"
ADMIN = "admin"
ANONYMOUS = "anonymous"


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def new_key() -> str:
    """A fresh client key: 256 random bits."""
    return f"sk-spanmill-{secrets.token_urlsafe(32)}"


def key_line(key_id: str, key: str) -> str:
    """The keys-file line for ``key``; raises ConfigError for an id the file cannot hold."""
    line = f"{key_id} sha256:{digest(key).hex()}"
    if not _LINE.match(line):
        raise ConfigError(
            f"key id {key_id!r} must be 1-64 letters, digits, '_', '.' or '-', starting with "
            "a letter or digit"
        )
    return line


def parse_keys(text: str, source: str) -> dict[str, bytes]:
    """Key id -> digest from a keys file's text; ConfigError names the first bad line."""
    found: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        matched = _LINE.match(line)
        if matched is None:
            raise ConfigError(
                f"{source} line {number} is not '<key id> sha256:<64 hex digits>' "
                "(make lines with `spanmill gateway-key`)"
            )
        key_id, hexdigest = matched.groups()
        if key_id in found:
            raise ConfigError(f"{source} line {number}: key id {key_id!r} appears twice")
        found[key_id] = bytes.fromhex(hexdigest)
    return found


class KeyRing:
    """The client keys and the admin credential of one gateway."""

    def __init__(
        self,
        keys_file: Path | None = None,
        shared_key: SecretStr | None = None,
        admin_key: SecretStr | None = None,
    ) -> None:
        self.keys_file = keys_file
        self._shared = {SHARED_KEY_ID: digest(shared_key.get_secret_value())} if shared_key else {}
        self._admin = digest(admin_key.get_secret_value()) if admin_key else None
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, bytes] = {}
        if keys_file is not None:
            # A gateway must not start open, or with no keys, because its file is bad.
            self._keys = parse_keys(self._read(keys_file), str(keys_file))
            self._stamp = self._stat(keys_file)

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the gateway's keys file {path}: {exc}") from None

    @staticmethod
    def _stat(path: Path) -> tuple[int, int] | None:
        try:
            stat = path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    @property
    def required(self) -> bool:
        """Whether clients must present a key (some key is configured)."""
        return self.keys_file is not None or bool(self._shared)

    @property
    def admin_configured(self) -> bool:
        return self._admin is not None

    def _current(self) -> dict[str, bytes]:
        if self.keys_file is not None:
            stamp = self._stat(self.keys_file)
            if stamp != self._stamp:
                try:
                    self._keys = parse_keys(self._read(self.keys_file), str(self.keys_file))
                except ConfigError as exc:
                    log.error("keeping the %d keys read before: %s", len(self._keys), exc)
                self._stamp = stamp
        return {**self._shared, **self._keys}

    def identify(self, presented: bytes) -> str | None:
        """The id of the client key ``presented`` is, or None."""
        given = digest(presented)
        found = None
        for key_id, expected in self._current().items():
            # Every key is compared, whichever matches: the time taken says nothing.
            if hmac.compare_digest(given, expected):
                found = key_id
        return found

    def is_admin(self, presented: bytes) -> bool:
        return self._admin is not None and hmac.compare_digest(digest(presented), self._admin)


def bearer(header: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if header is None:
        return None
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()
