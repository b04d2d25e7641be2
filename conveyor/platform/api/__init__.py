"""The platform's HTTP routes (tasks and runs, resources, schedules, builds), included by conveyor.api.app."""
