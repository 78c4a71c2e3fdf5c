"""Plain transformers generation: the reference that vLLM output is checked against."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


@torch.no_grad()
def hf_greedy(
    model: PreTrainedModel, prompts_ids: list[list[int]], max_new_tokens: int, stop_ids: set[int]
) -> list[list[int]]:
    """Greedy-decode each prompt one at a time (no padding effects); stops after a stop id."""
    model.eval()
    outputs = []
    for prompt in prompts_ids:
        input_ids = torch.tensor([prompt], dtype=torch.long)  # [1, T]
        generated = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(stop_ids),
            pad_token_id=sorted(stop_ids)[0],
        )
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs
