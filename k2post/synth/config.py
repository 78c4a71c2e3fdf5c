"""Config of `k2post synth CONFIG` (YAML `kind: synth`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.config.registry import register_run_config
from k2post.llm.http_client import HTTPClientConfig
from k2post.synth.gym_tasks import GymTasksConfig
from k2post.synth.record_store import DomainBlueprint
from k2post.synth.tasks import PERSONAS

DEFAULT_DOMAINS = ["bank", "calendar", "filesystem", "inventory", "tickets", "recipes"]


DEFAULT_PROMPT_RUBRIC = "The assistant answers the user's last message correctly, completely and helpfully."


class PromptDatasetConfig(K2Config):
    """A chat dataset whose dialogues the LLM agent continues (your own prompts, rejection-sampled)."""

    path: str = Field(
        "", description="HF dataset saved on disk, JSONL file, or directory of JSONL files (OpenAI/TRL `messages`)."
    )
    columns: dict[str, str] = Field(
        default_factory=dict, description="Our column name -> the dataset's (e.g. {messages: conversations})."
    )
    limit: int | None = Field(None, gt=0, description="Use only the first `limit` rows (null: all).")
    label: str | None = Field(None, description="Domain name of the rows (null: the file or directory name).")
    rubric: str = Field(DEFAULT_PROMPT_RUBRIC, description="What the LLM judge checks the answer against.")

    @model_validator(mode="after")
    def _has_path(self) -> "PromptDatasetConfig":
        if not self.path:
            raise ValueError("path: give the dataset (HF dataset dir, JSONL file or directory of JSONL files)")
        return self

    @property
    def key(self) -> str:
        """The rows' domain: `label`, else the dataset's file or directory name."""
        from pathlib import Path

        return self.label or Path(self.path).stem


class LLMSamplingConfig(K2Config):
    """Sampling of every LLM role (agent, user and tool simulators, judge)."""

    temperature: float = Field(0.7, ge=0, description="Sampling temperature of the LLM roles.")
    max_tokens: int = Field(256, gt=0, description="Most tokens per LLM reply.")


@register_run_config
class SynthConfig(K2Config):
    """Agentic SFT data synthesis: tool specs -> agents -> tasks with rubrics -> trajectories -> judge."""

    renamed_fields = {"tool_specs_dir": "tool_specs (a list of spec files or directories)"}

    kind: Literal["synth"] = Field("synth", description="Run config kind; must be 'synth'.")
    out_dir: str = Field("runs/synth", description="Output directory (dataset/, rejected/, shards/, stats.json, ...).")
    tool_specs: list[str] = Field(
        default_factory=list,
        description="MCP tool spec files (`tools/list` JSON) or directories of them (empty: the shipped "
        "environments/data/tool_specs). A file named like a built-in domain rewords its tools; any other file is a "
        "new domain (list it in `domains`), simulated from its schemas (docs/SYNTH.md).",
    )
    domains: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DOMAINS),
        description="Tool-use domains to synthesize trajectories for (may be empty when gym_tasks is set).",
    )
    gym_tasks: list[GymTasksConfig] = Field(
        default_factory=list,
        description="Single-turn verifiable gyms (math, reasoning_gym) to write reference answers for, judged by the "
        "gym's own verifier.",
    )
    prompt_datasets: list[PromptDatasetConfig] = Field(
        default_factory=list,
        description="Your own chat datasets: each dialogue, up to its last user message, is continued by the LLM "
        "agent (tool calls answered by the LLM world model) and kept when the LLM judge accepts it (docs/SYNTH.md).",
    )
    synthetic_domains: list[DomainBlueprint] = Field(
        default_factory=list,
        description="Extra record-store domains (entity + fields) to synthesize tools and tasks for; "
        "list them in `domains` too.",
    )
    templates: list[str] = Field(
        default_factory=list,
        description="Only these task templates (e.g. inventory_look_up); empty: every template of the domains.",
    )
    tasks_per_domain: int = Field(
        40, gt=0, description="Training tasks per domain (one accepted trajectory each at most)."
    )
    heldout_tasks_per_domain: int = Field(
        10, ge=0, description="Held-out (test split) tasks per domain, written for evaluation only."
    )
    test_fraction: float = Field(
        0.1, gt=0, lt=1, description="Share of the task space that is test split (same rule as the tool_use gym)."
    )
    attempts_per_task: int = Field(
        2, gt=0, description="Trajectories tried per task until one is accepted (rejection sampling)."
    )
    max_turns: int = Field(
        8, gt=0, description="Assistant turns per trajectory before it is cut (and rejected as unfinished)."
    )
    seed: int = Field(0, description="Seed of tasks, personas, mistakes and simulator randomness.")
    personas: list[str] = Field(
        default_factory=lambda: list(PERSONAS), min_length=1, description="Personas of the simulated users."
    )
    agent: Literal["reference", "llm"] = Field(
        "reference", description="Who writes assistant turns: the built-in reference solver or the LLM."
    )
    mistake_rate: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Reference agent: share of trajectories with one injected mistake (the judge must reject them).",
    )
    direct_answer_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Reference agent: share of tool-use tasks answered at once from the reference answer, without a "
        "tool call (a teacher that does the work in its head); judged on the final answer alone (`AnswerJudge`). Data "
        "that under-uses the tools, as distilled data often does: RL on the tool_use gym, which rewards the "
        "computation done with the tool, has to learn to call it (the demo, docs/RL.md).",
    )
    direct_answer_templates: list[str] | None = Field(
        None,
        description="Task templates `direct_answer_rate` applies to (null: every template), e.g. [calc_multiply]: a "
        "teacher that trusts its mental arithmetic on products but adds with the calculator.",
    )
    reasoning: bool = Field(
        False,
        description="Assistant turns think before they act (K2 Thinking): the reference agent writes what the last "
        "tool results said and why it makes its next calls into `reasoning_content`; the LLM agent keeps the model's "
        "own reasoning (dropped when false). SFT of a thinking-format model then trains it (data.reasoning_history "
        "says how, docs/SFT.md); an instruct-format model's template renders no reasoning.",
    )
    user_simulator: Literal["rules", "llm"] = Field(
        "rules", description="Who plays the user: persona rules or the LLM."
    )
    tool_simulator: Literal["rules", "llm"] = Field(
        "rules", description="Who answers tool calls: the domain's stateful simulator or the LLM."
    )
    tool_failure_rate: float = Field(
        0.0, ge=0, le=1, description="Rules simulator: probability of a seeded transient tool failure per call."
    )
    judge: Literal["rubric", "llm", "rubric+llm"] = Field("rubric", description="Which judge keeps trajectories.")
    llm: HTTPClientConfig | None = Field(
        None, description="OpenAI-compatible endpoint for the LLM roles (e.g. `k2post serve`)."
    )
    llm_sampling: LLMSamplingConfig = Field(default_factory=LLMSamplingConfig, description="Sampling of the LLM roles.")
    resume: bool = Field(
        True, description="Continue an interrupted run in out_dir (tasks already decided are skipped)."
    )
    keep_rejected: bool = Field(
        True, description="Also write the rejected trajectories (out_dir/rejected) for inspection."
    )

    @model_validator(mode="after")
    def _llm_roles_need_endpoint(self) -> "SynthConfig":
        if not self.domains and not self.gym_tasks and not self.prompt_datasets:
            raise ValueError("nothing to synthesize: list tool-use `domains`, `gym_tasks` or `prompt_datasets`")
        self._check_prompt_datasets()
        gyms = [g.key for g in self.gym_tasks]
        if len(set(gyms)) != len(gyms):
            raise ValueError(
                f"gym_tasks must name each entry once, got {gyms}: "
                "give a second entry of an environment its own `label`"
            )
        roles = [
            name
            for name, value in (
                ("agent", self.agent),
                ("user_simulator", self.user_simulator),
                ("tool_simulator", self.tool_simulator),
                ("judge", self.judge),
            )
            if "llm" in value
        ]
        if roles and self.llm is None:
            raise ValueError(
                f"{', '.join(roles)} use the LLM: add an `llm:` section with base_url (e.g. a `k2post serve` endpoint)"
            )
        unknown = sorted(set(self.personas) - set(PERSONAS))
        if unknown:
            raise ValueError(f"unknown personas {unknown}; known: {sorted(PERSONAS)}")
        from k2post.synth.domains import known_domain_names

        known = known_domain_names(self.synthetic_domains, self.spec_domains())
        missing = [name for name in self.domains if name not in known]
        if missing:
            raise ValueError(
                f"unknown domains {missing}; known: {known} (add a tool spec file to `tool_specs` or a "
                "synthetic_domains entry to make a new one)"
            )
        if self.templates:
            offered = {name: d for d in self.build_domains().values() for name in d.templates}
            unknown_templates = sorted(set(self.templates) - set(offered))
            if unknown_templates:
                raise ValueError(
                    f"templates {unknown_templates} are not templates of {self.domains}; known: {sorted(offered)}"
                )
            idle = sorted(set(self.domains) - {offered[t].name for t in self.templates})
            if idle:
                raise ValueError(
                    f"domains {idle} have none of the listed templates: drop them from domains or add their templates"
                )
        self._check_direct_templates()
        return self

    def _check_prompt_datasets(self) -> None:
        if not self.prompt_datasets:
            return
        keys = [entry.key for entry in self.prompt_datasets]
        if len(set(keys)) != len(keys):
            raise ValueError(f"prompt_datasets must have distinct labels, got {keys}: set `label` on each")
        if self.agent != "llm" or "llm" not in self.judge:
            raise ValueError(
                "prompt_datasets need agent: llm (the reference agent only solves generated tasks) and a judge with "
                "llm (judge: llm or rubric+llm: these prompts have no rubric the offline judge can check)"
            )

    def spec_domains(self) -> list:
        """The DomainSpecs of `tool_specs` (the shipped files when empty); ValueError naming the bad file."""
        from k2post.synth.specs import SHIPPED_SPECS, load_tool_specs

        return load_tool_specs(list(self.tool_specs) or SHIPPED_SPECS)

    def build_domains(self) -> dict:
        """The configured domains (k2post.synth.domains.build_domains); ValueError if one cannot be built."""
        from k2post.synth.domains import build_domains

        return build_domains(self.domains, self.synthetic_domains, self.spec_domains())

    def _check_direct_templates(self) -> None:
        if not self.direct_answer_templates:
            return
        synthesized = set(self.templates) or {t for d in self.build_domains().values() for t in d.templates}
        unused = sorted(set(self.direct_answer_templates) - synthesized)
        if unused:
            raise ValueError(
                f"direct_answer_templates {unused} are not synthesized templates; known: {sorted(synthesized)}"
            )
