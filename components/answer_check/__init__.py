"""AnswerCheck: a dynamic resource that proves the deployed server answers right, after the
readiness gate passed.

The provider ships `components/node_programs/answer_check.py` to the head over SSH (`python3 -`,
program on stdin with the prompt set and the API key in its prelude) and runs it there: every prompt
of the versioned set (`prompts.py`) generated greedily, then teacher-forced (the continuation sent as
part of the prompt and read back through vLLM's `prompt_logprobs`). `judge.py` holds each position to
the reference (`answers.reference`), to the last accepted receipt when the server changed, and to the
run's own generation; a near-tie passes, a token scored far lower fails. Dynamic providers' create
never runs during preview, and diff does no I/O. It checks again only when what it judges changes
(every node's image ID, the server's argv, the node set, the fabric, the prompt set, the reference,
the settings); `read` (pulumi refresh) gives back the recorded answers and runs nothing.

Files, by job:
    facts.py     the program's report parsed; the verdict as one line
    programs.py  the program as the head runs it (its argv, its source with the prompt set and the
                 API key) and what its exit status means
    prompts.py   the prompt set, its version and its known answers (pure data)
    judge.py     the judgement by teacher forcing: drift, divergence, near-ties, known answers (pure)
    plan.py      the pure decisions: `plan_change`, which changes check again and against what,
                 the verdict on a report
    execute.py   the check carried out over SSH (the only I/O): ensure (create, update)
    errors.py    CheckFailed (could not record), WrongAnswers (enforce: an answer refused)
    provider.py  the dynamic provider (diff: no I/O)
    resource.py  the AnswerCheck resource (type qwen35:AnswerCheck)
Code run on the head: components/node_programs/answer_check.py.

Keep `AnswerCheckProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.answer_check.errors import CheckFailed, WrongAnswers
from components.answer_check.execute import ensure
from components.answer_check.facts import parse_report, summary_line
from components.answer_check.judge import Finding, Tolerances, judge_continuation, judge_position
from components.answer_check.plan import (
    CHECK_KEYS,
    SERVER_KEYS,
    against_receipt,
    checks_again,
    forced,
    judged,
    last_accepted,
    plan_change,
)
from components.answer_check.programs import answer_argv, answer_program, answer_spec
from components.answer_check.prompts import VERSION, known_answers, prompt_set, set_digest
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AnswerCheck": ".resource",
        "AnswerCheckProvider": ".provider",
    },
)

__all__ = [
    "CHECK_KEYS",
    "SERVER_KEYS",
    "VERSION",
    "AnswerCheck",
    "AnswerCheckProvider",
    "CheckFailed",
    "Finding",
    "Tolerances",
    "WrongAnswers",
    "against_receipt",
    "answer_argv",
    "answer_program",
    "answer_spec",
    "checks_again",
    "ensure",
    "forced",
    "judge_continuation",
    "judge_position",
    "judged",
    "known_answers",
    "last_accepted",
    "parse_report",
    "plan_change",
    "prompt_set",
    "set_digest",
    "summary_line",
]
