"""The platform's seven queues, values like a user's own (the platform's blueprint registers them).

Each queue gets its own worker group, so slow work on one never starves
another. Every field can be overridden from the environment
(``CONVEYOR_QUEUES__LLM__CONCURRENCY=4``).
"""

from __future__ import annotations

from conveyor.blueprints import Queue

# Agent runs mostly wait on the model provider: they are async jobs, so the queue's 16 slots run on a
# few threads (conveyor.tasks.releasing); a sync job here would take back a thread per slot.
# 30 min limit: a round that chains model calls may take minutes; none should take half an hour.
AGENT = Queue("agent", 16, 3, 2.0, 60.0, 30 * 60, "long runs must not starve the rest")
# Builds run a sandboxed script for up to half an hour, blocking their thread, each using up to a core
# and 2 GiB (CONVEYOR_BUILD_CPUS, CONVEYOR_BUILD_MEMORY_BYTES): two per process, off the agent queue's
# event-loop workers, on hosts that allow the sandbox. agent.build sets its own time limit.
BUILD = Queue("build", 2, 3, 2.0, 60.0, 30 * 60, "sandboxed builds block a thread for minutes")
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
QUEUES: dict[str, Queue] = {q.name: q for q in (AGENT, BUILD, CRITICAL, LLM, INDEXING, SCHEDULING, NUDGE)}
