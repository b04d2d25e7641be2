"""The brokers tests run against, defined once, from the library's own table.

Every test that runs on several brokers parametrizes over one of these tuples
(as a parametrize list or a fixture's params), so a new broker in
:data:`conveyor.backends.BACKENDS` reaches every such test by itself.
"""

from __future__ import annotations

from conveyor.backends import BACKENDS

#: Every broker conveyor has, the in-process one included.
ALL_BROKERS: tuple[str, ...] = tuple(BACKENDS)

#: Brokers with a server of their own, whose workers are separate processes.
SERVER_BROKERS: tuple[str, ...] = tuple(
    name for name, backend in BACKENDS.items() if not backend.capabilities.in_process
)
