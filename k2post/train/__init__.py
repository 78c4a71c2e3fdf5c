"""The training runtime SFT and RL share (DeepSpeed + MuonClip ranks): process groups and ports
(`distributed`), the lr schedule (`schedule`), atomic checkpoints with publish / list / prune (`checkpoint`),
metrics.jsonl and the progress display (`metrics`), and memory readings (`memory`).

SFT (`k2post.sft`) and RL (`k2post.rl`) build on it; neither imports the other's runtime. The package's
`__init__` stays light (no torch import).
"""
