"""A user's middleware in the style of Dramatiq's stock ``Retries``: it re-enqueues the message proxy it was handed.

Loaded only by the campaign's ``user-retries`` worker group
(``CONVEYOR_IMPORTS=…,tests.faults.user_retries``): a blueprint that brings
only middleware. When a ``fault.poll`` body asks for another run, it counts
the run in the message's options and passes the very proxy it got to
``broker.enqueue(message, delay=…)``, as the stock ``Retries`` does with a
failed message (issue 18, finding 9: that call raised inside a hook Dramatiq
swallows, so the run was lost on Redis and looped on Postgres).
"""

from __future__ import annotations

import random
from typing import Any

from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy

from conveyor.blueprints import Jobs
from tests.faults.jobs_extra import AGAIN, POLLS

#: Milliseconds before the next run (the stock Retries' backoff, short).
DELAY_MS = (100, 400)


class PollAgain(Middleware):
    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if exception is not None or not message.options.pop(AGAIN, False):
            return
        message.options[POLLS] = message.options.get(POLLS, 0) + 1
        broker.enqueue(message, delay=random.randint(*DELAY_MS))


jobs = Jobs()
jobs.add_middleware(PollAgain)
