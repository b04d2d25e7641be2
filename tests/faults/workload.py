"""The mixed workload and the producer that enqueues it while a fault happens.

Jobs on several queues: quick ones, slow ones, delayed ones, ones that fail
once, ones that fail for good (their final-failure hook must run once),
charges through the real ledger (``credit.consume`` itself and fault jobs
that charge), keyed enqueues of which some are sent twice. The producer
keeps enqueuing through the fault; an enqueue that raised is "maybe"
(it may or may not have happened), one that returned is acknowledged.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from conveyor.errors import ConveyorError
from conveyor.ledger import credits
from tests.faults.jobs import WORK_QUEUES


@dataclass
class Planned:
    """One job the workload means to run, and what must come of it."""

    job: str
    payload: dict
    key: str | None = None
    delay: float | None = None
    #: "completed" or "failed" (a permanent failure, whose hook runs once).
    expect: str = "completed"
    #: (ledger reference, user, tokens) when the job charges.
    charge: tuple[str, str, int] | None = None
    #: Runs that write the run log (fault jobs; credit.consume does not).
    logged: bool = True
    #: True when this request repeats an earlier one's key (it must get the first job back).
    duplicate_of: "Planned | None" = None
    # -- filled in by the producer --
    ref_id: str | None = None
    deduplicated: bool | None = None
    acknowledged: bool = False
    maybe: bool = False
    sent_at: float | None = None
    done_at: float | None = None

    def request(self) -> dict:
        return {"job": self.job, "payload": self.payload, "key": self.key, "delay": self.delay}


def mixed(
    n: int, prefix: str, *, seed: int = 10, users: int = 5, slow: float = 1.0, bad_text: str | None = None
) -> list[Planned]:
    """``n`` jobs of every kind, plus a duplicate for about a third of the keyed ones."""
    rng = random.Random(f"{prefix}:{seed}")
    plan: list[Planned] = []
    for i in range(n):
        token = f"{prefix}-{i}"
        queue = WORK_QUEUES[i % len(WORK_QUEUES)]
        kind = rng.choices(
            ["quick", "slow", "fail_once", "permanent", "charge", "consume", "delayed"],
            weights=[30, 12, 14, 5, 16, 10, 13],
        )[0]
        payload: dict = {"token": token}
        item = Planned(f"fault.work.{queue}", payload)
        if kind == "quick":
            payload["sleep"] = round(rng.uniform(0.01, 0.1), 3)
        elif kind == "slow":
            payload["sleep"] = round(rng.uniform(slow / 2, slow), 3)
        elif kind == "fail_once":
            payload.update(fail_times=1, sleep=0.02)
            if bad_text:
                payload["bad_text"] = bad_text
        elif kind == "permanent":
            payload["permanent"] = True
            item.expect = "failed"
            if bad_text:
                payload["bad_text"] = bad_text
        elif kind == "delayed":
            payload["sleep"] = 0.02
            item.delay = round(rng.uniform(0.3, 2.0), 2)
        elif kind in ("charge", "consume"):
            user, task, message = f"{prefix}-u{i % users}", f"{prefix}-t{i}", f"m{i}"
            tokens = rng.randint(1, 5000)
            charge = {"user_id": user, "task_id": task, "message_id": message, "total_tokens": tokens}
            item.charge = (credits.consume_reference(task, message), user, tokens)
            item.key = f"credit:{task}:{message}"
            if kind == "consume":  # the real job type, as the platform enqueues it
                item.job, item.payload, item.logged = "credit.consume", charge, False
            else:
                item.job = "fault.work.critical"
                payload.update(charge, sleep=round(rng.uniform(0.01, 0.3), 3), fail_times=int(rng.random() < 0.3))
        if item.key is None and rng.random() < 0.3:
            item.key = f"job:{token}"
        plan.append(item)
    for item in list(plan):
        if item.key and rng.random() < 0.35:
            plan.append(
                Planned(
                    item.job,
                    dict(item.payload),
                    item.key,
                    item.delay,
                    item.expect,
                    item.charge,
                    item.logged,
                    duplicate_of=item,
                )
            )
    return plan


def holding_charges(n: int, prefix: str) -> list[Planned]:
    """Charges that write their effect, then wait to be killed before their ack (first attempt)."""
    out = []
    for i in range(n):
        task, message = f"{prefix}-t{i}", f"m{i}"
        tokens = 1000 + i
        payload = {
            "token": f"{prefix}-{i}",
            "hold": True,
            "user_id": f"{prefix}-u",
            "task_id": task,
            "message_id": message,
            "total_tokens": tokens,
        }
        out.append(
            Planned(
                "fault.work.critical",
                payload,
                key=f"credit:{task}:{message}",
                charge=(credits.consume_reference(task, message), f"{prefix}-u", tokens),
            )
        )
    return out


def holding_jobs(n: int, prefix: str, queue: str = "indexing") -> list[Planned]:
    """Jobs that write their effect, then wait to be killed before their ack (first attempt)."""
    return [Planned(f"fault.work.{queue}", {"token": f"{prefix}-{i}", "hold": True}) for i in range(n)]


def long_jobs(n: int, prefix: str, sleep: float, queue: str = "nudge") -> list[Planned]:
    return [Planned(f"fault.work.{queue}", {"token": f"{prefix}-{i}", "sleep": sleep}) for i in range(n)]


class Producer(threading.Thread):
    """Enqueues a plan in small batches over ``spread`` seconds, through whatever fault is going on."""

    def __init__(self, app, plan: list[Planned], *, spread: float = 3.0, batch: int = 8) -> None:
        super().__init__(name="fault-producer", daemon=True)
        self.app = app
        self.plan = plan
        self.spread = spread
        self.batch = batch
        self.errors: list[str] = []
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            batches = [self.plan[i : i + self.batch] for i in range(0, len(self.plan), self.batch)]
            pause = self.spread / max(len(batches), 1)
            for batch in batches:
                started = time.time()
                for item in batch:
                    item.sent_at = started
                try:
                    refs = self.app.jobs.enqueue_many([item.request() for item in batch])
                except ConveyorError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    for item in batch:
                        item.maybe = True
                else:
                    now = time.time()
                    for item, ref in zip(batch, refs):
                        item.ref_id, item.deduplicated, item.acknowledged, item.done_at = (
                            ref.id,
                            ref.deduplicated,
                            True,
                            now,
                        )
                time.sleep(pause)
        finally:
            self.finished.set()

    def wait(self, timeout: float = 120) -> None:
        if not self.finished.wait(timeout):
            raise AssertionError(f"the producer did not finish within {timeout:g}s")


def enqueue_now(app, plan: list[Planned]) -> list[Planned]:
    """Enqueue a plan in one call (no fault going on); every item is acknowledged or this raises."""
    refs = app.jobs.enqueue_many([item.request() for item in plan])
    now = time.time()
    for item, ref in zip(plan, refs):
        item.sent_at = item.done_at = now
        item.ref_id, item.deduplicated, item.acknowledged = ref.id, ref.deduplicated, True
    return plan
