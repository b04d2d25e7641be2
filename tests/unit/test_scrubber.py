"""The scrubber that keeps secrets out of logs and records, on its own."""

from __future__ import annotations

from cryptography.fernet import Fernet


def test_the_scrubber_catches_each_key_and_url_password_and_never_mangles_its_own_marker():
    from conveyor.platform.settings import PlatformSettings
    from conveyor.redaction import Scrubber
    from conveyor.settings import Settings

    key_a, key_b = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    # (An admin token must be long and varied now, so the short secret inside the marker is the OpenAI key.)
    settings = Settings(
        database_url="postgresql://app:db-pass-81x@db/conveyor",
        redis_url="redis://:r3dis-pw@r:6379/0",
        secret_key=f"{key_b},{key_a}",
        admin_token="Zq8-admin-token-scrub-4471",
    )
    # The platform's settings travel with its blueprint; their secrets are scrubbed all the same.
    platform = PlatformSettings(openai_api_key="dac")
    scrub = Scrubber.for_settings([settings, platform], ["env-value-42"])
    text = f"old key {key_a} new key {key_b} db-pass-81x r3dis-pw dac Zq8-admin-token-scrub-4471 env-value-42"
    assert scrub(text) == "old key [redacted] new key [redacted]" + " [redacted]" * 5
    # "dac" is also inside "[redacted]": one pass, so the marker stays whole.
    assert scrub("dac dac") == "[redacted] [redacted]"
    assert scrub("postgresql://app@db/conveyor") == "postgresql://app@db/conveyor"  # the rest of a URL is not secret
