"""The Redis broker: ``broker`` (Dramatiq adapter and job interface), ``consumer`` (fetch and outcomes),
``deliveries`` (what a worker holds), ``jobs`` (every Redis command: owns ``jobs.lua``, every state change,
atomic), ``keys`` (every key name)."""

from conveyor.brokers.redis.broker import RedisBroker

__all__ = ["RedisBroker"]
