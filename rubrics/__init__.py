"""Self-critique rubric critic (K2): the policy ranks its own K responses by pairwise
comparisons under rubrics, and the ranks become RL rewards in [0, 1].

    from k2post_rubrics import Critic, CriticConfig, task_rubrics

    critic = Critic(client, CriticConfig())            # client: any LLMClient (chat(...) -> str)
    result = critic.score(task.messages, responses, task_rubrics(task))
    result.scores                                      # one reward per response, in [0, 1]

Pieces, each usable alone: `schema` (Rubric, the shipped YAML rubric files, task rubrics),
`prompts` (the pairwise judge prompt), `verdict` (robust `[[A]]`/`[[B]]`/`[[TIE]]` parsing),
`aggregate` (win rates, Bradley–Terry), `detectors` (deterministic prescriptive checks and
penalties), `critic` (the whole loop).
"""

from k2post_rubrics.aggregate import bradley_terry, bradley_terry_log_strengths, scores_from, win_rates
from k2post_rubrics.critic import Critic, CriticConfig, CriticResult
from k2post_rubrics.detectors import PrescriptiveConfig, initial_praise, prescriptive_penalty, self_justification
from k2post.judging.prompts import judge_messages
from k2post_rubrics.schema import Rubric, RubricFileError, builtin_rubrics, load_rubric_file, task_rubrics
from k2post.judging.verdict import PairVerdict, parse_verdict

__all__ = [
    "Critic",
    "CriticConfig",
    "CriticResult",
    "PrescriptiveConfig",
    "Rubric",
    "RubricFileError",
    "PairVerdict",
    "bradley_terry",
    "bradley_terry_log_strengths",
    "builtin_rubrics",
    "initial_praise",
    "judge_messages",
    "load_rubric_file",
    "parse_verdict",
    "prescriptive_penalty",
    "scores_from",
    "self_justification",
    "task_rubrics",
    "win_rates",
]
