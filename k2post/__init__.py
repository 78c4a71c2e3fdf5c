"""k2post: Kimi K2-style LLM post-training (SFT + RL).

Subpackages:
  config  -- pydantic config base, YAML loading, dotted overrides, run configs
  models  -- tiny model flavors (tiny-qwen2, tiny-k2) and a locally trained tokenizer
  chat    -- K2 chat/tool-call template: render to text/ids/assistant mask, parse back
  cli     -- the `k2post` command
"""

__version__ = "0.1.0"
