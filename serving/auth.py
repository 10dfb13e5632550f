"""API keys: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` on prediction routes.

Keys come from ``SERVING_API_KEYS`` (comma list) and/or ``SERVING_API_KEYS_FILE`` (one per
line, ``#`` comments). A presented key is compared with every configured key in constant
time (``hmac.compare_digest``), so neither the key nor which key matched leaks through
timing. Keys never appear in logs, responses or the settings' repr (``SecretStr``).
Which routes are open without a key is declared by the protocols' operations
(``security=False``) and collected by ``serving.app.create_app``; ``/healthz`` is open but
shows its detail (model names, each failed worker's load error) only with a key.
"""

from __future__ import annotations

import hmac
from typing import Protocol

from serving.errors import SettingsError, Unauthorized
from serving.model.artifacts import UnsafePath, trusted_path
from serving.settings import Settings

__all__ = ["check_api_key", "has_api_key", "load_api_keys"]


def load_api_keys(settings: Settings) -> tuple[bytes, ...]:
    """Every configured key, as bytes; empty when authentication is off.

    :raises SettingsError: when the keys file cannot be read, a user other than root and
        the server's may replace it (it, a directory above it or a symlink on the way:
        ``serving.model.artifacts.trusted_path``, naming the entry, its mode or owner and
        the fix), or a key is shorter than 16 characters (too easy to guess).
    """
    keys: list[str] = []
    if settings.api_keys is not None:
        keys += settings.api_keys.get_secret_value().split(",")
    if settings.api_keys_file is not None:
        try:
            real, _ = trusted_path(settings.api_keys_file)  # whoever may write it, gets in
            lines = real.read_text().splitlines()
        except UnsafePath as exc:
            raise SettingsError("SERVING_API_KEYS_FILE", str(exc)) from None
        except OSError as exc:
            raise SettingsError(
                "SERVING_API_KEYS_FILE", f"cannot read it: {exc.strerror}"
            ) from None
        keys += [line for line in lines if not line.lstrip().startswith("#")]
    keys = [key.strip() for key in keys if key.strip()]
    for key in keys:
        if len(key) < 16:
            raise SettingsError("SERVING_API_KEYS", "every key must be at least 16 characters")
    return tuple(key.encode() for key in keys)


class Headers(Protocol):
    def get(self, key: str, default: str) -> str: ...


def check_api_key(headers: Headers, keys: tuple[bytes, ...]) -> None:
    """Accept the request if it presents one of ``keys``.

    :raises Unauthorized: (401) when no key or a wrong key is presented.
    """
    presented = _presented(headers)
    if not presented:
        raise Unauthorized("an API key is required: Authorization: Bearer <key> or X-API-Key")
    if not _matches(presented, keys):
        raise Unauthorized("the API key is not valid")


def has_api_key(headers: Headers, keys: tuple[bytes, ...]) -> bool:
    """Whether the request presents one of ``keys`` (compared as ``check_api_key`` does),
    for an open route that shows more to a caller with a key (``/healthz``)."""
    presented = _presented(headers)
    return bool(presented) and _matches(presented, keys)


def _presented(headers: Headers) -> str:
    presented = headers.get("X-API-Key", "")
    authorization = headers.get("Authorization", "")
    if not presented and authorization[:7].lower() == "bearer ":
        presented = authorization[7:].strip()
    return presented


def _matches(presented: str, keys: tuple[bytes, ...]) -> bool:
    candidate = presented.encode()
    matched = False
    for key in keys:  # no early exit: the time taken does not depend on which key matched
        matched |= hmac.compare_digest(candidate, key)
    return matched
