"""Runnable entry points (what `ray job submit` and `make demo` run): demo, and later rl, sft, synth, eval."""
