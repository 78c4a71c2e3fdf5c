"""A tiny model that really calls tools: tiny-qwen2 overfit on reference tool_use trajectories.

A random tiny model never emits a tool call, so multi-turn rollouts against it would end after
one turn. These helpers build reference dialogues from the tool_use gym (its scenarios carry a
correct solution; tool results come from really stepping the environment), optionally with a
malformed first call answered by the exact error message the rollout gives, and train the model
on their assistant tokens until greedy decoding replays them. Tests then drive real vLLM rollouts
with it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from k2post.toolsets.checks import Scenario
from k2post.chat.parse import parse_assistant
from k2post.chat.template import render_assistant_body, render_continuation_ids, render_ids
from k2post.chat.tokens import TOOL_CALL_ARG_BEGIN, TOOL_CALL_BEGIN, TOOL_CALL_END, TOOL_CALLS_BEGIN, TOOL_CALLS_END
from k2post.chat.types import Message, ToolCall, format_call_id
from k2post.envs.base import Task
from k2post.rollout.agentic import parse_error_messages


@dataclass
class Trajectory:
    task: Task
    ids: list[int]
    mask: list[int]
    turns: list[Message]  # assistant turns after the prompt (raw malformed text kept as content)
    prompt_len: int | None = None  # tokens of the task prompt (the first assistant header starts there); None: 3
    # tokens before the first trained one (`<|im_assistant|>`, `assistant`, `<|im_middle|>` in the instruct format)


MALFORMED = "zzmalformedzz"
"""Stands in for the malformed turn while rendering (its ids are put in afterwards: `_with_malformed_ids`)."""


def _malformed_turn(call: ToolCall) -> str:
    """A K2 tool call whose arguments are broken JSON."""
    args = render_assistant_body(Message(role="assistant", tool_calls=[call])).split(TOOL_CALL_ARG_BEGIN)[1]
    broken = args.split(TOOL_CALL_END)[0].rstrip("}")  # drop the closing brace
    return f"{TOOL_CALLS_BEGIN}{TOOL_CALL_BEGIN}{call.id}{TOOL_CALL_ARG_BEGIN}{broken}{TOOL_CALL_END}{TOOL_CALLS_END}"


def reference_trajectory(env, task: Task, tokenizer, malformed_first: bool = False) -> Trajectory:
    """Prompt + reference solution (tool results from the real env) as ids and assistant mask."""
    scenario = Scenario.model_validate(task.answer)
    tools = env.tools_for(task)
    prompt = render_ids(tokenizer, task.messages, tools=tools, add_generation_prompt=False)
    state, index, rest = env.reset(task), 0, []
    for turn_calls in scenario.reference_turns:
        calls = [
            ToolCall(id=format_call_id(c.name, index + i), name=c.name, arguments=c.arguments)
            for i, c in enumerate(turn_calls)
        ]
        if malformed_first and index == 0:
            raw = _malformed_turn(calls[0])
            errors = parse_assistant(raw, start_index=0, known_tools=[t.name for t in tools]).errors
            rest += [Message(role="assistant", content=MALFORMED), *parse_error_messages(errors, 0)]
            index += len(errors)
            calls = [c.model_copy(update={"id": format_call_id(c.name, index + i)}) for i, c in enumerate(calls)]
        message = Message(role="assistant", tool_calls=calls)
        result = env.step(state, message)
        rest += [message, *result.observations]
        index += len(calls)
    rest.append(Message(role="assistant", content=scenario.reference_answer))
    env.step(state, rest[-1])
    cont = render_continuation_ids(tokenizer, rest, add_generation_prompt=False)
    cont_ids, cont_mask = cont.input_ids, cont.assistant_mask
    turns = [m for m in rest if m.role == "assistant"]
    if malformed_first:
        cont_ids, cont_mask = _with_malformed_ids(tokenizer, cont_ids, cont_mask, raw)
        turns = [m.model_copy(update={"content": raw}) if m.content == MALFORMED else m for m in turns]
    ids, mask = prompt.input_ids + cont_ids, prompt.assistant_mask + cont_mask
    return Trajectory(task, ids, mask, turns, len(prompt.input_ids))


def _with_malformed_ids(tokenizer, ids: list[int], mask: list[int], raw: str) -> tuple[list[int], list[int]]:
    """The placeholder turn's ids replaced by the malformed call as the model emits it: its K2 tool-call tokens as
    special ids (the renderer keeps special-token strings in content as text, so the turn cannot be rendered)."""
    placeholder = tokenizer(MALFORMED, add_special_tokens=False)["input_ids"]
    raw_ids = tokenizer(raw, add_special_tokens=False)["input_ids"]  # special-token strings parse as specials here
    at = next(i for i in range(len(ids)) if ids[i : i + len(placeholder)] == placeholder)
    bit = mask[at]
    return ids[:at] + raw_ids + ids[at + len(placeholder) :], mask[:at] + [bit] * len(raw_ids) + mask[
        at + len(placeholder) :
    ]


def _split(traj: Trajectory) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt ids [1, P], rest ids [1, R], rest mask [1, R]); the prompt is read without grad."""
    cut = traj.mask.index(1) - 3 if traj.prompt_len is None else traj.prompt_len  # before the first assistant header
    return torch.tensor([traj.ids[:cut]]), torch.tensor([traj.ids[cut:]]), torch.tensor([traj.mask[cut:]])


def _loss(model, prompt: torch.Tensor, rest: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the masked tokens of `rest`; the prompt's KV is computed without grad
    (3x cheaper than a full backward; memorization converges all the same)."""
    with torch.no_grad():
        # only the cache is needed: no [prompt, vocab] logits (a quarter of the step on tiny-qwen2)
        cache = model(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
    logits = model(input_ids=rest, past_key_values=cache, use_cache=True).logits[0, :-1]
    keep = mask[0, 1:] == 1
    return torch.nn.functional.cross_entropy(logits[keep], rest[0, 1:][keep])


def train_on(
    model_dir: Path,
    out_dir: Path,
    trajectories: list[Trajectory],
    max_steps: int = 300,
    lr: float = 3e-3,
    stop_below: float = 0.003,
) -> float:
    """Overfit the model on the trajectories' assistant tokens (full batch); saves to out_dir the
    weights with the lowest worst-trajectory loss seen (full-batch AdamW spikes now and then, and a
    spike on the last step must not decide the test); stops once it is below `stop_below`. Returns that worst
    trajectory's loss."""
    from k2post.models.loading import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm(model_dir)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = [_split(traj) for traj in trajectories]
    best, best_state = float("inf"), None
    for _ in range(max_steps):
        opt.zero_grad()
        losses = []
        for prompt, rest, mask in data:
            loss = _loss(model, prompt, rest, mask)
            loss.backward()
            losses.append(loss.item())
        if max(losses) < best:  # the losses belong to the weights before this step
            best, best_state = max(losses), {k: v.detach().clone() for k, v in model.state_dict().items()}
        if best < stop_below:
            break
        opt.step()
    model.load_state_dict(best_state)
    shutil.copytree(model_dir, out_dir)
    model.save_pretrained(out_dir)
    return best
