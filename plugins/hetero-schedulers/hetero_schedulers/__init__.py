"""Scheduler policies for hetero-infer: ``fcfs``, ``priority`` and ``lpm``."""

from hetero_schedulers.policies import FcfsPolicy, LongestPrefixMatchPolicy, PriorityPolicy

__all__ = ["FcfsPolicy", "LongestPrefixMatchPolicy", "PriorityPolicy"]
