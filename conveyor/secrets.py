"""Secrets in payloads: encrypted before enqueue, decrypted only inside the processor.

``CONVEYOR_SECRET_KEY`` holds one or more Fernet keys, comma-separated. The
first encrypts; every key decrypts (``MultiFernet``), so a key is rotated by
putting the new key first, letting old messages drain, then removing the old
one. A value that no longer decrypts (its key was removed, or it was tampered
with) is dropped with a warning naming the variable, never its value.

Make a key with::

    python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TYPE_CHECKING

from conveyor.errors import SecretKeyError
from conveyor.logs import log_event
from conveyor.settings import Settings

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

#: Every Fernet token starts with this version byte.
_FERNET_VERSION = 0x80


class SecretBox:
    """Encrypts with the first key, decrypts with any of them."""

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise SecretKeyError("CONVEYOR_SECRET_KEY is empty")
        # Imported here, when a key is used: cryptography (with cffi and OpenSSL's bindings) costs ~7 MiB
        # a worker process would otherwise hold though none of its jobs carries a secret.
        from cryptography.fernet import Fernet, MultiFernet

        fernets = []
        for n, key in enumerate(keys, 1):
            try:
                fernets.append(Fernet(key.encode()))
            except (ValueError, binascii.Error):
                # Never echo the key: it is the secret.
                raise SecretKeyError(
                    f"CONVEYOR_SECRET_KEY entry {n} is not a Fernet key (32 url-safe base64-encoded bytes)"
                ) from None
        self._fernet: MultiFernet = MultiFernet(fernets)

    @classmethod
    def from_settings(cls, settings: Settings) -> "SecretBox | None":
        """The box for ``CONVEYOR_SECRET_KEY``, or None when no key is configured."""
        if settings.secret_key is None:
            return None
        keys = [k.strip() for k in settings.secret_key.get_secret_value().split(",") if k.strip()]
        return cls(keys)

    def encrypt(self, value: str) -> str:
        return self._fernet.encrypt(value.encode()).decode()

    def decrypt(self, token: str) -> str:
        """The plain value; raises ``cryptography.fernet.InvalidToken`` when no key opens it."""
        return self._fernet.decrypt(token.encode()).decode()


def _invalid_token() -> type[Exception]:
    """cryptography's ``InvalidToken``, imported only once a box exists (so cryptography already is)."""
    from cryptography.fernet import InvalidToken

    return InvalidToken


def looks_encrypted(value: str) -> bool:
    """True when ``value`` has the shape of a Fernet token (it may still fail to decrypt)."""
    try:
        raw = base64.urlsafe_b64decode(value.encode())
    except (ValueError, binascii.Error):
        return False
    # version byte, 8-byte timestamp, 16-byte IV, >=16-byte ciphertext, 32-byte HMAC
    return len(raw) >= 73 and raw[0] == _FERNET_VERSION


def encrypt_env(settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """Encrypt every value of ``env`` for a payload. Needs ``CONVEYOR_SECRET_KEY`` when ``env`` is not empty."""
    if not env:
        return {}
    box = SecretBox.from_settings(settings)
    if box is None:
        raise SecretKeyError("CONVEYOR_SECRET_KEY must be set to enqueue secrets (env values are encrypted)")
    return {name: box.encrypt(value) for name, value in env.items()}


def decrypt_env(
    settings: Settings, env: Mapping[str, str], *, queue: str, job: str, job_id: str, attempt: int
) -> dict[str, str]:
    """Decrypt ``env``; a value that does not decrypt is dropped with a ``secret_dropped`` warning naming it."""
    if not env:
        return {}
    try:
        box = SecretBox.from_settings(settings)
    except SecretKeyError as exc:
        box, why = None, str(exc)
    else:
        why = "CONVEYOR_SECRET_KEY is not set on this worker"
    plain = {}
    for name, token in env.items():
        if box is not None:
            try:
                plain[name] = box.decrypt(token)
                continue
            except (_invalid_token(), UnicodeDecodeError):
                why = "no configured key decrypts it (rotated out or tampered with)"
        log_event(
            "secret_dropped",
            level="warning",
            queue=queue,
            job=job,
            job_id=job_id,
            attempt=attempt,
            variable=name,
            reason=why,
        )
    return plain
