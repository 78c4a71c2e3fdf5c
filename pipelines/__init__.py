"""The `k2post` commands, one module each: `k2post <command> ARGS` is `pipelines.<command>.main(ARGS)`.

model, config, demo, envs, serve, synth, sft, rl, eval, recipe, critic. Each owns its argparse parser
(prog `k2post <command>`) and runs under `k2post.command.run_command` (one-line errors, status 2);
`python -m pipelines.<command> ARGS` is the same command (what `ray job submit`, torchrun and `make demo` run).
The table that dispatches to them is k2post/cli.py.
"""
