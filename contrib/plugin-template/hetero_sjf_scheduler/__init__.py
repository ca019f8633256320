"""Shortest-prompt-first scheduling for hetero-infer, with aging so long prompts are never starved."""

from hetero_sjf_scheduler.policy import ShortestPromptFirst

__all__ = ["ShortestPromptFirst"]
