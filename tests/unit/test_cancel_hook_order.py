"""The cancel hook runs only for a run the broker really ended cancelled (soak seeds 833632, 614412, 57528).

The Cancellation middleware decides a cancelled run's end with the broker first (``cancel_outcome``, fenced
like an ack), and runs the job type's ``on_cancel`` hook only when that write ended the job: a refused
outcome (a superseded delivery) or one that could not be written (Redis out of memory or away: the job stays
held and its next start ends it) runs no hook, since the job may yet end otherwise.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.broker import MessageProxy

from conveyor.brokers.base import CANCELLED
from conveyor.errors import BrokerRejected
from conveyor.middleware.cancel import Cancellation, Cancels


class _Owner:
    """The broker's side of a cancelled run: what its outcome write answers, and the order of the calls."""

    def __init__(self, outcome: bool | Exception, calls: list[str]) -> None:
        self.outcome, self.calls = outcome, calls

    def completed_in_own_transaction(self, message: Any) -> bool:
        return False

    def cancel_outcome(self, message: Any, error: str | None = None) -> bool:
        self.calls.append("outcome")
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def leave_unsettled(self, message: Any, why: str) -> None:
        self.calls.append("unsettled")


def _cancelled_run(outcome: bool | Exception) -> tuple[list[str], MessageProxy]:
    calls: list[str] = []
    app = types.SimpleNamespace(
        cancels=Cancels(),
        settings=types.SimpleNamespace(cancel_grace_seconds=60.0),
        cancel_hook=lambda message: calls.append("hook"),
    )
    middleware = Cancellation(app)  # type: ignore[arg-type]  # the attributes it reads
    owner = _Owner(outcome, calls)
    message = MessageProxy(Message(queue_name="q", actor_name="job", args=(), kwargs={}, options={"attempt": 1}))
    middleware.before_process_message(owner, message)  # type: ignore[arg-type]
    app.cancels.asked(message.message_id, 60.0)
    middleware.after_process_message(owner, message, exception=None)  # type: ignore[arg-type]
    return calls, message


def test_the_hook_runs_after_the_outcome_ended_the_job():
    calls, message = _cancelled_run(True)
    assert calls == ["outcome", "hook"]
    assert message.options[CANCELLED]


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (False, ["outcome"]),  # refused: a superseded delivery, whose current holder decides the end
        (BrokerRejected("OOM command not allowed"), ["outcome", "unsettled"]),  # not written: held, ends at its start
    ],
)
def test_no_hook_runs_when_the_outcome_did_not_end_the_job(outcome, expected):
    calls, message = _cancelled_run(outcome)
    assert calls == expected, "the cancel hook ran for a job that may yet end otherwise"
    assert message.options[CANCELLED], "neither retried nor failed: its next start ends it cancelled"
