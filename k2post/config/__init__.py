"""Config system: strict pydantic components, YAML files, dotted overrides.

from k2post.config import load_run_config
cfg = load_run_config("configs/demo.yaml", overrides=["sampling.temperature=0.7"])
"""

from k2post.config.base import ConfigDefinitionError, K2Config

__all__ = ["ConfigDefinitionError", "K2Config"]
