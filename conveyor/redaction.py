"""Keeping secret values out of everything people see: dashboard, API, alerts.

Two sources of secrets: a payload model's ``secret_fields`` (its values are
replaced by :data:`REDACTED`), and every ``SecretStr`` the settings hold. Any
text shown (a job's last error, say) is scrubbed of both, in case a
processor put one into an exception message.

:class:`Scrubber` is the one implementation: builds scrub their log, their
error and their events with one (every settings secret plus the build's own
env values) before anything is stored or logged.
"""

from __future__ import annotations

import re
from typing import Any, Iterable
from urllib.parse import urlsplit

from pydantic import SecretStr

#: What a secret value is shown as.
REDACTED = "[redacted]"


def redact_payload(payload: Any, model: type | None) -> dict[str, Any]:
    """The payload with its model's secret fields redacted.

    A payload whose job type is unknown here (registered by a module this
    process did not import) shows its field names only: nothing says which
    of its values are secret.
    """
    if not isinstance(payload, dict):
        return {}
    if model is None:
        return {name: REDACTED for name in payload}
    secret: frozenset[str] = getattr(model, "secret_fields", frozenset())
    return {name: REDACTED if name in secret else value for name, value in payload.items()}


def payload_secrets(payload: Any, model: type | None) -> list[str]:
    """The secret values of a payload, as text, for :func:`scrub`."""
    if not isinstance(payload, dict):
        return []
    if model is None:
        return [str(v) for v in payload.values() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    secret: frozenset[str] = getattr(model, "secret_fields", frozenset())
    return [str(payload[name]) for name in secret if payload.get(name) not in (None, "")]


def settings_secrets(*settings_objects: Any) -> list[str]:
    """Every secret value the settings objects hold (admin token, webhook URL, secret keys, and a
    blueprint's own: the platform's provider key).

    A comma-separated value (``CONVEYOR_SECRET_KEY`` holds several Fernet keys)
    also gives each of its parts, so one key quoted alone is caught too; a
    service URL gives its password.
    """
    values = []
    for settings, name in ((s, name) for s in settings_objects for name in type(s).model_fields):
        value = getattr(settings, name, None)
        if isinstance(value, str) and "://" in value:
            # DATABASE_URL and REDIS_URL are not secret, but the password in them is.
            try:
                password = urlsplit(value).password
            except ValueError:
                password = None
            if password:
                values.append(password)
        if isinstance(value, SecretStr) and value.get_secret_value():
            whole = value.get_secret_value()
            values.append(whole)
            if "," in whole:
                values += [part.strip() for part in whole.split(",") if part.strip()]
    return values


class Scrubber:
    """Replaces every occurrence of a fixed set of secret values with :data:`REDACTED`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # One pass, longest first: a secret that contains another is replaced whole, and a short secret
        # is never matched inside the marker an earlier replacement wrote.
        ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    def for_settings(cls, settings: Any, extra: Iterable[str] = ()) -> "Scrubber":
        """Every secret of ``settings`` (one settings object or a list: ``app.all_settings``), plus ``extra``
        (a build's decrypted env values, say)."""
        objects = settings if isinstance(settings, (list, tuple)) else [settings]
        return cls([*settings_secrets(*objects), *extra])

    def __call__(self, text: str | None) -> str | None:
        if not text or self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)


def scrub(text: str | None, secrets: Iterable[str]) -> str | None:
    """``text`` with every occurrence of each secret replaced by :data:`REDACTED`."""
    return Scrubber(secrets)(text)
