"""Cron for any job: schedules declared in code (``jobs.schedule(...)``), those managed at run time
(``app.cron``: managed.py, kept in store/ beside the broker's data), and the loop that fires both.

``conveyor scheduler`` runs :class:`~conveyor.scheduling.firing.CronFirer`; the agent
platform's schedules (rows managed from the CLI and API) use the same cron parser.
"""
