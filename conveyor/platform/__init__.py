"""The agent platform: tasks, runs, streams, credits, schedules and builds, built on conveyor's queue library.

It is one blueprint (:data:`conveyor.platform.jobs.jobs`), loaded like a user's job module
(``CONVEYOR_IMPORTS``): the App imports :mod:`conveyor.platform.jobs` unless
``CONVEYOR_PLATFORM=false``, and its job modules register their jobs on it through the
public API (``jobs.job(...)``, ``Queue``). The library never imports this package.
"""
