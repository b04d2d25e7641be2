"""Cron for any job: schedules declared in code (``jobs.schedule(...)``) and the loop that fires them.

``conveyor scheduler`` runs :class:`~conveyor.scheduling.firing.CronFirer`; the agent
platform's schedules (rows managed from the CLI and API) use the same cron parser.
"""
