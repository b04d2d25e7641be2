"""conveyor: Celery-style distributed jobs for AI-agent platforms, on Dramatiq."""

__version__ = "0.1.0"
