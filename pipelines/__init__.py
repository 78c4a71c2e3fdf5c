"""Runnable entry points (what `ray job submit` and `make demo` run): demo, synth, sft; later rl, eval."""
