"""RL (Kimi K1.5 / K2 recipe): losses, reward shaping, schedules and prompt sampling as free functions."""
