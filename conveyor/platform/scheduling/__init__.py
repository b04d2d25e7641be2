"""Time: cron schedules and the scheduler that fires them, paused runs that resume, and nudges."""
