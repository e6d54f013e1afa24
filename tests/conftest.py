"""Test-wide settings: quiet logs (warnings and errors still show)."""

from scheduler_svc.app.logs import configure_logging

configure_logging("warning")
