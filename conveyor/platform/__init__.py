"""The agent platform: tasks, runs, streams, credits, schedules and builds, built on conveyor's queue library.

It is loaded like any user's job module (``CONVEYOR_IMPORTS``): the App imports
:mod:`conveyor.platform.jobs` unless ``CONVEYOR_PLATFORM=false``, and its job
modules register their jobs and declare their queues through the public API
(``from conveyor import job, Queue``). The library never imports this package;
``conveyor.app.PLATFORM_PACKAGES`` names where its modules live.
"""
