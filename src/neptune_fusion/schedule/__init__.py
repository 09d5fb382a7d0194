"""Schedules as plain frozen data, the search space and the cost model."""

from __future__ import annotations

from .schedule import Schedule, default_schedule, make_schedule

__all__ = ["Schedule", "default_schedule", "make_schedule"]
