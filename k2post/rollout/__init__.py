"""Rollout side: the policy's generation engine (vLLM in-process) and its configs."""
