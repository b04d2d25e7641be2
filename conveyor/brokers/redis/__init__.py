"""The Redis broker: ``broker`` (Dramatiq adapter and job interface), ``consumer`` (fetch and outcomes),
``keys`` (every key name), ``scripts`` (the Lua, loaded once), ``jobs.lua`` (every state change, atomic)."""

from conveyor.brokers.redis.broker import RedisBroker

__all__ = ["RedisBroker"]
