"""The platform's six queues, values like a user's own (the platform's blueprint registers them).

Each queue gets its own worker group, so slow work on one never starves
another. Every field can be overridden from the environment
(``CONVEYOR_QUEUES__LLM__CONCURRENCY=4``).
"""

from __future__ import annotations

from conveyor.blueprints import Queue

# Agent runs mostly wait on the model provider: many threads are cheap.
# 30 min limit: the longest agent build observed takes ~15 min.
AGENT = Queue("agent", 16, 3, 2.0, 60.0, 30 * 60, "long runs must not starve the rest")
# Charges are tiny and must never wait behind LLM work; retried
# quickly and often because the ledger makes a repeat harmless.
CRITICAL = Queue("critical", 10, 10, 0.5, 30.0, 60, "charges are consumed fast")
# Provider rate limits and token cost: two at a time per process.
LLM = Queue("llm", 2, 5, 5.0, 300.0, 10 * 60, "provider rate limits and token cost")
INDEXING = Queue("indexing", 5, 5, 2.0, 120.0, 10 * 60, "CPU/DB bound, scaled on its own")
# Cron fires and resumptions only enqueue other work: few threads suffice.
SCHEDULING = Queue("scheduling", 4, 5, 1.0, 60.0, 60, "cron fires and resumptions")
NUDGE = Queue("nudge", 2, 5, 1.0, 60.0, 60, "time-triggered nudges")

#: The platform's queues by name, in the order workers and the dashboard list them.
QUEUES: dict[str, Queue] = {q.name: q for q in (AGENT, CRITICAL, LLM, INDEXING, SCHEDULING, NUDGE)}
