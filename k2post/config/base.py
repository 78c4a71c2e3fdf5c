"""Base class for every component config.

Every component of k2post has exactly one pydantic model deriving from `K2Config`:
unknown keys are rejected (`extra="forbid"`), every field must carry a description
(checked at class creation), and every field has a default so a YAML file only
names what it changes.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


class ConfigDefinitionError(TypeError):
    """A config class is declared wrongly (a developer error, raised at import time)."""


class K2Config(BaseModel):
    """Strict, documented config model. Subclass it for every component."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=False)

    # Subclasses that are run configs set this to the YAML `kind` they accept.
    run_kind: ClassVar[str | None] = None
    # Keys a subclass used to accept -> their new name: an old key is a one-line error naming the new one.
    renamed_fields: ClassVar[dict[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name, field in cls.model_fields.items():
            if not (field.description or "").strip():
                raise ConfigDefinitionError(f"{cls.__name__}.{name} has no description: add Field(description=...)")
            if field.is_required() and name != "kind":
                raise ConfigDefinitionError(f"{cls.__name__}.{name} has no default: give it a sane default")

    @model_validator(mode="before")
    @classmethod
    def _reject_renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in cls.renamed_fields.items():
                if old in data:
                    raise ValueError(f"`{old}` is now `{new}`: change the key")
        return data
