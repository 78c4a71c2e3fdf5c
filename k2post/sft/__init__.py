"""Supervised fine-tuning on (synthesized) agentic chat data, K2-style.

Chat rows -> K2 template tokens with a loss mask on assistant tokens (`data`), packed into
fixed-size rows with block-causal attention (`packing`, `batching`), trained with MuonClip on
the DeepSpeed engine at a configurable ZeRO stage (`trainer`), checkpointed in HF format with
resumable engine state (`k2post.train.checkpoint`, shared with RL). See docs/SFT.md.

    k2post sft configs/sft_tool_use.yaml [key.path=value ...]
    python -m k2post_pipelines.sft configs/sft_tool_use.yaml            # what `ray job submit` runs

This package's `__init__` stays light (no torch import) so that `k2post config show` is fast.
"""
