"""A node's `api_key` at rest: Fernet-encrypted under a key derived from the server's admin key.

Registering a node needs the admin key anyway, and every replica and worker is configured with the same one,
so each of them can open what another sealed, while the database alone (a dump, a backup) reveals nothing.
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

# Binds the derived key to this one use of the admin key.
PURPOSE = b"tokenrelay registered node api_key v1"


def derive_fernet(admin_key: str) -> Fernet:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE)
    return Fernet(base64.urlsafe_b64encode(hkdf.derive(admin_key.encode())))


class NoSealingKey(RuntimeError):
    """A node key was to be stored, but no admin key is configured to encrypt it with."""


class KeySeal:
    """Seals and opens node api keys; without a configured admin key it can do neither."""

    def __init__(self, admin_key: SecretStr | None) -> None:
        self._fernet = derive_fernet(admin_key.get_secret_value()) if admin_key is not None else None

    @property
    def available(self) -> bool:
        return self._fernet is not None

    def seal(self, secret: SecretStr) -> str:
        if self._fernet is None:
            raise NoSealingKey("no admin key is configured to encrypt a node's api_key with")
        return self._fernet.encrypt(secret.get_secret_value().encode()).decode()

    def open(self, token: str) -> SecretStr | None:
        """The key, or None when it was sealed under another admin key (or none is configured now)."""
        if self._fernet is None:
            return None
        try:
            return SecretStr(self._fernet.decrypt(token.encode()).decode())
        except InvalidToken:
            return None
