"""The platform's ``conveyor`` subcommands (demo, build, schedules), added by its blueprint (``jobs.add_commands``)."""
