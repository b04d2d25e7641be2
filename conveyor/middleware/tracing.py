"""OpenTelemetry traces of jobs: an enqueue starts or joins a trace, each run, retry and final failure is a span in it.

On only with ``CONVEYOR_OTEL=true`` or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the App adds :class:`Tracing`
then, and only then is this module, or the SDK, imported). The context travels in the message as W3C
trace-context options (``traceparent``, ``tracestate``), so a job's attempts, its retries and the jobs it
enqueues stay in the trace of whatever enqueued it: an HTTP request (the API's ``TraceRequests``), another
job, a schedule. Spans carry names and ids, never a payload; an error's text is scrubbed of every secret
value (the settings' and the payload's secret fields), as the dashboard's and the webhook's are.

The SDK is configured from the standard ``OTEL_*`` variables (service name, resource attributes, sampler,
exporter endpoint and headers); spans are exported over OTLP/HTTP in batches. A process that has set its
own tracer provider (a test's in-memory exporter, an embedding application) keeps it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dramatiq import Broker, Message
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conveyor import logs
from conveyor.brokers.base import AnyMessage, ConveyorBroker
from conveyor.errors import ConfigurationError, describe_error
from conveyor.middleware.base import ConveyorMiddleware
from conveyor.middleware.webhook import PayloadModelOf
from conveyor.redaction import payload_secrets, scrub, settings_secrets

if TYPE_CHECKING:
    from conveyor.settings import Settings

#: The message options that carry a job's trace context (W3C trace context, whatever OTEL_PROPAGATORS says:
#: a message outlives the process that wrote it, so its format is fixed).
CONTEXT_OPTIONS = ("traceparent", "tracestate")
TRACER = "conveyor"
_W3C = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()


def setup_tracing() -> None:
    """Install the SDK's tracer provider (OTLP/HTTP, batched) unless the process has one; log lines get ids."""
    with _setup_lock:
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                from opentelemetry.sdk.resources import Resource
                from opentelemetry.sdk.trace import TracerProvider
                from opentelemetry.sdk.trace.export import BatchSpanProcessor
            except ImportError:
                raise ConfigurationError(
                    "OpenTelemetry is on (CONVEYOR_OTEL or OTEL_EXPORTER_OTLP_ENDPOINT) but its SDK is not "
                    "installed: pip install 'conveyor[otel]'"
                ) from None
            named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
                "OTEL_RESOURCE_ATTRIBUTES", ""
            )
            provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "conveyor"}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            trace.set_tracer_provider(provider)
        logs.trace_fields = current_trace_fields


def current_trace_fields() -> dict[str, str]:
    """The current span's trace and span ids as log fields (none outside a span)."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    return {"trace_id": format(span_context.trace_id, "032x"), "span_id": format(span_context.span_id, "016x")}


def message_context(message: AnyMessage) -> context.Context:
    """The trace context a message carries (an empty one when it carries none)."""
    carrier = {key: str(message.options[key]) for key in CONTEXT_OPTIONS if key in message.options}
    return _W3C.extract(carrier)


def job_attributes(message: AnyMessage) -> dict[str, Any]:
    """What a job's spans say of it: queue (its worker group's), job type, id and, once started, the attempt."""
    queue = q_name(message.queue_name)
    attributes: dict[str, Any] = {
        "messaging.system": "conveyor",
        "messaging.destination.name": queue,
        "messaging.message.id": message.message_id,
        "conveyor.queue": queue,
        "conveyor.group": queue,
        "conveyor.job": message.actor_name,
        "conveyor.job_id": message.message_id,
    }
    attempt = message.options.get("attempt")
    if attempt:
        attributes["conveyor.attempt"] = attempt
    return attributes


@dataclass
class _Run:
    """A run: its message, its span, and the context token to restore after (None once its thread let it go)."""

    message_id: str
    span: Span
    token: object | None


class Tracing(ConveyorMiddleware):
    """Spans for enqueues, runs, retries and final failures; first in the App's list, so a run's span
    encloses every other middleware's hooks (the attempt Retries counts, its retry and its final failure)."""

    def __init__(
        self, settings: Settings, job_types: Mapping[str, PayloadModelOf], *, secrets: Sequence[str] | None = None
    ) -> None:
        setup_tracing()
        self.settings = settings
        #: Secret values of every settings object of the App (a blueprint's too); default: ``settings``' own.
        self.secrets = list(settings_secrets(settings) if secrets is None else secrets)
        self.job_types = job_types
        #: The run each worker thread is in (its context is attached there).
        self._local = threading.local()
        #: Message id -> its run, until its after-hook: an async job's ends in another thread (a finisher).
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def _error(self, message: AnyMessage, error: str) -> str:
        """``error`` as a span may carry it: scrubbed of every secret value, at most 500 characters."""
        job_type = self.job_types.get(message.actor_name)
        payload = message.args[0] if message.args else None
        secrets = [*self.secrets, *payload_secrets(payload, job_type.payload if job_type else None)]
        return (scrub(error, secrets) or "")[:500]

    def _run(self, message: AnyMessage) -> _Run | None:
        with self._lock:
            return self._runs.get(message.message_id)

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        tracer = trace.get_tracer(TRACER)
        run = self._run(message)
        if run is not None:
            # Retries' next attempt of the running job: a span under the failed run; the job keeps its trace.
            attributes = job_attributes(message) | {"conveyor.delay_ms": int(delay or 0)}
            tracer.start_span(
                f"retry {message.actor_name}", context=trace.set_span_in_context(run.span), attributes=attributes
            ).end()
            return
        if any(key in message.options for key in CONTEXT_OPTIONS):
            return  # already in a trace: a delayed job come due, a failed job retried by hand
        span = tracer.start_span(
            f"enqueue {message.actor_name}", kind=SpanKind.PRODUCER, attributes=job_attributes(message)
        )
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(span))
        message.options.update(carrier)
        span.end()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        previous: _Run | None = getattr(self._local, "run", None)
        if previous is not None:  # a run whose after-hook never came: close it, never leak its context
            self._end(previous)
        parent = message_context(message)
        span = trace.get_tracer(TRACER).start_span(
            f"run {message.actor_name}", context=parent, kind=SpanKind.CONSUMER, attributes=job_attributes(message)
        )
        token = context.attach(trace.set_span_in_context(span, parent))
        run = _Run(message.message_id, span, token)
        self._local.run = run
        with self._lock:
            self._runs[message.message_id] = run

    def after_release_message(self, broker: Broker, message: MessageProxy, run: Any) -> None:
        """An async job let go by its worker thread (conveyor.tasks.releasing): its context leaves the thread;
        its span stays open until its after-hook, in the finisher that ends it."""
        mine: _Run | None = getattr(self._local, "run", None)
        if mine is None or mine.message_id != message.message_id:
            return
        self._local.run = None
        token, mine.token = mine.token, None
        context.detach(token)  # type: ignore[arg-type]  # the token attach() returned

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        run = self._run(message)
        if run is None:
            return
        if exception is not None:
            run.span.set_attribute("error.type", type(exception).__name__)
            run.span.set_status(StatusCode.ERROR, self._error(message, describe_error(exception)))
        self._end(run, message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        run = self._run(message)
        if run is not None:
            run.span.set_attribute("conveyor.skipped", True)
            self._end(run, message)

    def after_job_dead(self, broker: ConveyorBroker, message: AnyMessage, error: str) -> None:
        run = self._run(message)
        parent = trace.set_span_in_context(run.span) if run is not None else message_context(message)
        span = trace.get_tracer(TRACER).start_span(
            f"failed {message.actor_name}", context=parent, attributes=job_attributes(message)
        )
        span.set_status(StatusCode.ERROR, self._error(message, error))
        span.end()

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if flush is not None:
            flush()

    def _end(self, run: _Run, message: AnyMessage | None = None) -> None:
        if getattr(self._local, "run", None) is run:
            self._local.run = None
        with self._lock:
            if self._runs.get(run.message_id) is run:
                del self._runs[run.message_id]
        try:
            if message is not None and message.options.get("attempt"):
                run.span.set_attribute("conveyor.attempt", message.options["attempt"])
            run.span.end()
        finally:
            if run.token is not None:
                context.detach(run.token)  # type: ignore[arg-type]  # the token attach() returned
