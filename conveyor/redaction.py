"""Keeping secret values out of everything people see: dashboard, API, alerts.

Two sources of secrets: a payload model's ``secret_fields`` (its values are
replaced by :data:`REDACTED`), and every ``SecretStr`` the settings hold. Any
text shown (a job's last error, say) is scrubbed of both, in case a
processor put one into an exception message.
"""

from __future__ import annotations

from typing import Any, Iterable

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
    secret = getattr(model, "secret_fields", frozenset())
    return {name: REDACTED if name in secret else value for name, value in payload.items()}


def payload_secrets(payload: Any, model: type | None) -> list[str]:
    """The secret values of a payload, as text, for :func:`scrub`."""
    if not isinstance(payload, dict):
        return []
    if model is None:
        return [str(v) for v in payload.values() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    secret = getattr(model, "secret_fields", frozenset())
    return [str(payload[name]) for name in secret if payload.get(name) not in (None, "")]


def settings_secrets(settings: Any) -> list[str]:
    """Every secret value the settings hold (admin token, webhook URL, secret keys)."""
    values = []
    for name in type(settings).model_fields:
        value = getattr(settings, name, None)
        if isinstance(value, SecretStr) and value.get_secret_value():
            values.append(value.get_secret_value())
    return values


def scrub(text: str | None, secrets: Iterable[str]) -> str | None:
    """``text`` with every occurrence of each secret replaced by :data:`REDACTED`."""
    if not text:
        return text
    # Longest first, so a secret that contains another is replaced whole.
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
