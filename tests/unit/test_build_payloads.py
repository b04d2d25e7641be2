"""agent.build payloads: the tagged union round-trips, old rows load, secrets are encrypted and rotate."""

from __future__ import annotations

import json
import logging

import pytest
from cryptography.fernet import Fernet
from dramatiq import Message

from conveyor.errors import InvalidPayload, SecretKeyError
from conveyor.platform.builds.payloads import BUILD_KINDS, BuildPayload, Update
from conveyor.secrets import SecretBox, decrypt_env, encrypt_env
from conveyor.settings import Settings
from conveyor.tasks.jobqueue import validate_payload

KEY_OLD, KEY_NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def samples(settings: Settings) -> list[dict]:
    env = encrypt_env(settings, {"API_KEY": "sk-test-123456"})
    common = {"owner_id": "user-1", "env": env}
    return [
        {
            "kind": "upload",
            "build_id": "b-up",
            "agent_id": "a1",
            "archive_path": "/data/up/a1.zip",
            "version": "v7",
            **common,
        },
        {
            "kind": "update",
            "build_id": "b-upd",
            "agent_id": "a1",
            "source_dir": "/src/a1",
            "new_version": "2.0",
            "changelog": "faster",
            **common,
        },
        {
            "kind": "rollback",
            "build_id": "b-rb",
            "agent_id": "a1",
            "target_version": "v7",
            "reason": "bad deploy",
            **common,
        },
        {
            "kind": "standalone_build",
            "build_id": "b-sb",
            "agent_id": "a1",
            "git_url": "file:///srv/repo.git",
            "ref": "release",
            "version_tag": "rc1",
            **common,
        },
        {
            "kind": "github_clone",
            "build_id": "b-gh",
            "agent_id": "a1",
            "repo_url": "/srv/repo",
            "branch": "dev",
            "version_override": None,
            **common,
        },
        {
            "kind": "mcp_upload",
            "build_id": "b-mcp",
            "connector_id": "c1",
            "source": {"type": "git", "url": "/srv/mcp", "ref": "v1"},
            **common,
        },
        {
            "kind": "mcp_upload",
            "build_id": "b-mcp2",
            "connector_id": "c1",
            "source": {"type": "archive", "path": "/data/mcp.tgz"},
            "version": "1.0.0",
            **common,
        },
    ]


def test_every_build_variant_round_trips_through_json():
    settings = Settings(secret_key=KEY_NEW)
    seen = set()
    for data in samples(settings):
        payload = validate_payload("agent.build", BuildPayload, data)
        # As the JobQueue sends it and a worker reads it back.
        message = Message(
            queue_name="build", actor_name="agent.build", args=(payload.model_dump(mode="json"),), kwargs={}, options={}
        )
        back = BuildPayload.load(Message.decode(message.encode()).args[0])
        assert back == payload and type(back.root) is type(payload.root)
        assert json.loads(back.model_dump_json())["kind"] == data["kind"]
        seen.add(data["kind"])
    assert seen == set(BUILD_KINDS)
    assert BuildPayload.secret_fields == {"env"}


def test_a_payload_stored_before_a_field_existed_still_loads():
    # An update enqueued before `changelog` was added, read by today's worker:
    old = {"kind": "update", "build_id": "b1", "owner_id": "u1", "agent_id": "a1", "source_dir": "/src"}
    loaded = BuildPayload.load(old).root
    assert isinstance(loaded, Update) and loaded.changelog == "" and loaded.env == {}
    # A newer producer's extra fields (top level and nested) are ignored at run time ...
    newer = {
        "kind": "mcp_upload",
        "build_id": "b2",
        "owner_id": "u1",
        "connector_id": "c1",
        "priority": 3,
        "source": {"type": "git", "url": "/srv/mcp", "depth": 1},
    }
    assert BuildPayload.load(newer).root.source.url == "/srv/mcp"
    # ... but refused at enqueue, where they are a typo.
    with pytest.raises(InvalidPayload, match="priority"):
        validate_payload("agent.build", BuildPayload, newer)


def test_plain_env_values_and_bad_variants_are_refused_naming_fields_not_values():
    data = {
        "kind": "upload",
        "build_id": "b1",
        "owner_id": "u1",
        "agent_id": "a1",
        "archive_path": "relative/a.zip",
        "env": {"DB_PASSWORD": "hunter2-plain"},
    }
    with pytest.raises(InvalidPayload) as caught:
        validate_payload("agent.build", BuildPayload, data)
    text = str(caught.value)
    assert "DB_PASSWORD" in text and "absolute path" in text and "hunter2-plain" not in text
    with pytest.raises(InvalidPayload, match="does not match any of the expected tags"):
        validate_payload("agent.build", BuildPayload, {**data, "kind": "docker_push"})
    with pytest.raises(InvalidPayload, match="exactly one of git_url and source_dir"):
        validate_payload(
            "agent.build", BuildPayload, {"kind": "standalone_build", "build_id": "b", "owner_id": "u", "agent_id": "a"}
        )


def test_keys_rotate_and_a_value_that_no_longer_decrypts_is_dropped_with_a_warning(caplog):
    old_env = encrypt_env(Settings(secret_key=KEY_OLD), {"OLD_TOKEN": "old-secret-value"})
    rotating = Settings(secret_key=f"{KEY_NEW},{KEY_OLD}")
    new_env = encrypt_env(rotating, {"NEW_TOKEN": "new-secret-value"})
    ids = dict(queue="build", job="agent.build", job_id="j1", attempt=1)
    # During rotation both decrypt; new values are encrypted with the first key.
    assert decrypt_env(rotating, {**old_env, **new_env}, **ids) == {
        "OLD_TOKEN": "old-secret-value",
        "NEW_TOKEN": "new-secret-value",
    }
    assert SecretBox([KEY_NEW]).decrypt(new_env["NEW_TOKEN"]) == "new-secret-value"
    # After the old key is removed, its values are dropped -- named, never shown.
    with caplog.at_level(logging.WARNING, logger="conveyor.events"):
        plain = decrypt_env(Settings(secret_key=KEY_NEW), {**old_env, **new_env}, **ids)
    assert plain == {"NEW_TOKEN": "new-secret-value"}
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "conveyor.events"]
    assert line["event"] == "secret_dropped" and line["variable"] == "OLD_TOKEN"
    assert "old-secret-value" not in caplog.text and old_env["OLD_TOKEN"] not in caplog.text
    with pytest.raises(SecretKeyError, match="must be set"):
        encrypt_env(Settings(), {"X": "y"})
    with pytest.raises(SecretKeyError, match="entry 2 is not a Fernet key") as caught:
        SecretBox.from_settings(Settings(secret_key=f"{KEY_NEW},not-a-key-zzz"))
    assert "not-a-key-zzz" not in str(caught.value)


def test_variables_that_steer_the_loader_or_libc_are_refused_by_name_never_by_value():
    token = Fernet(Fernet.generate_key()).encrypt(b"/tmp/build/src/evil.so").decode()
    fields = {"kind": "rollback", "build_id": "b1", "owner_id": "u", "agent_id": "a", "target_version": "v1"}
    unsafe = ["LD_PRELOAD", "LD_AUDIT", "ld_library_path", "GCONV_PATH", "LOCPATH", "MALLOC_CHECK_", "HOSTALIASES"]
    unsafe += ["NLSPATH", "RESOLV_HOST_CONF", "GLIBC_TUNABLES", "TMPDIR", "TZDIR"]
    for name in unsafe:
        with pytest.raises(InvalidPayload) as refused:
            validate_payload("agent.build", BuildPayload, {**fields, "env": {name: token, "FINE": token}})
        assert name in str(refused.value) and "FINE" not in str(refused.value) and token not in str(refused.value)
    ok = validate_payload("agent.build", BuildPayload, {**fields, "env": {"API_KEY": token, "OLD_LD": token}})
    assert set(ok.root.env) == {"API_KEY", "OLD_LD"}
