"""One row type per concept (issue 19): a job's stored record is JobRecord; the read layer's JobView is that
record redacted; the admin API's schemas are generated from the read layer's dataclasses. So a field added
to the record shows in app.jobs.get, `conveyor jobs` and the API with nothing else to edit."""

from __future__ import annotations

from dataclasses import dataclass, fields

from conveyor import App
from conveyor.api.admin import Attempt, Job, Worker, schema_of
from conveyor.brokers.base import JobRecord
from conveyor.brokers.fleet import AttemptInfo, WorkerInfo
from conveyor.inspector import AttemptView, Inspector, JobView, WorkerView
from conveyor.settings import Settings


def names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def test_each_view_is_its_stored_row_plus_what_the_read_layer_adds():
    assert issubclass(JobView, JobRecord)
    assert names(JobView) == [*names(JobRecord), "max_attempts", "history"]
    assert issubclass(WorkerView, WorkerInfo)
    assert names(WorkerView) == [*names(WorkerInfo), "heartbeat_age", "state"]
    assert issubclass(AttemptView, AttemptInfo) and names(AttemptView) == names(AttemptInfo)


def test_the_api_schemas_are_the_read_layers_fields_in_order_plus_their_computed_times():
    assert list(Job.model_fields) == [*names(JobView), "wait_seconds", "run_seconds"]
    assert list(Attempt.model_fields) == [*names(AttemptView), "run_seconds"]
    kept = [n for n in names(WorkerView) if n not in ("done", "failed")]
    assert list(Worker.model_fields) == [*kept, "attempts_completed", "attempts_failed"]
    assert Job.model_fields["history"].annotation == list[Attempt]


def test_a_field_added_to_a_record_is_in_its_generated_schema():
    @dataclass
    class TaggedView(JobView):
        tenant: str | None = None

    schema = schema_of(TaggedView, "a job with a tenant")
    assert "tenant" in schema.model_fields and schema.model_fields["tenant"].annotation == str | None
    assert schema.__name__ == "Tagged"


def test_the_inspector_copies_every_field_of_the_record_redacting_only_payload_and_error():
    app = App(Settings(broker="inline", database_url="postgresql://unused/db"))
    try:
        record = JobRecord(
            id="j1",
            queue="default",
            job="nobody.knows",
            state="awaiting",
            attempts=2,
            key="k",
            payload={"a": 1},
            error="boom",
            enqueued_at=1.0,
            started_at=2.0,
            finished_at=None,
            eta=5.0,
            event="approved",
            priority=7,
            group="tenant-9",
        )
        app.broker.records[record.id] = record
        view = Inspector(app).job(record.id)
        for name in names(JobRecord):
            if name not in ("payload", "error"):
                assert getattr(view, name) == getattr(record, name), name
        assert view.payload == {"a": "[redacted]"}  # a job type this process does not know: every field hidden
        assert view.max_attempts is None  # a job type this process does not know
        body = Job.model_validate(view).model_dump(by_alias=True)
        assert body["group"] == "tenant-9" and body["priority"] == 7 and body["event"] == "approved"
        assert body["waitSeconds"] == 1.0 and body["history"] == []
    finally:
        app.close()
