"""Key secrets: generated once, shown once, stored only as a hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "tr-"
SECRET_BYTES = 32  # 256 bits of randomness
DISPLAY_CHARS = 8  # characters after the prefix that `keys list` shows, enough to recognise a key


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def hash_secret(secret: str) -> str:
    # A plain (domain-separated) SHA-256 is enough here: the secrets are 256-bit random strings, so there
    # is no dictionary to try and a slow password hash would only add latency. A pepper would be one more
    # secret to hand every replica and CLI, without making a 256-bit preimage any harder to find.
    return hashlib.sha256(b"tokenrelay-api-key-v1:" + secret.encode()).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def display_prefix(secret: str) -> str:
    return secret[: len(KEY_PREFIX) + DISPLAY_CHARS]


def looks_like_key(token: str) -> bool:
    """A cheap shape check, so junk never reaches the database."""
    return token.startswith(KEY_PREFIX) and 16 <= len(token) <= 128 and token.isascii()
