"""Schedules as plain frozen data, and the loop partition's interval analysis."""

from __future__ import annotations

from .schedule import Schedule, default_schedule, make_schedule

__all__ = ["Schedule", "default_schedule", "make_schedule"]
