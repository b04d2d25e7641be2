"""The broker's Lua, read once at import and registered on each client (EVALSHA, reloaded after a restart)."""

from __future__ import annotations

from pathlib import Path

#: Every command that changes queue and job record together (see its header).
JOBS = (Path(__file__).with_name("jobs.lua")).read_text()
