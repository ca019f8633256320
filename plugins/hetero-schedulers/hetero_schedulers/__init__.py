"""Scheduler policies for hetero-infer: ``fcfs`` and ``priority``."""

from hetero_schedulers.policies import FcfsPolicy, PriorityPolicy

__all__ = ["FcfsPolicy", "PriorityPolicy"]
