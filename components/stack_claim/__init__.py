"""StackClaim: a dynamic resource per node saying "this stack's containers and host ports live here".

Created before the node's volume and containers, dropped after them. Its create refuses, naming the
other stack and what collides, when another stack of any project already claims the same container
name prefix or one of the same host ports on the node (`components/node_programs/stack_claim.py`
keeps the records on the node). Without it a second stack on the same nodes adopts the first one's
Ray volume and only then fails on a container name; its destroy then waits on that volume.

Files, by job:
    facts.py     the claim program's report parsed (pure)
    programs.py  the claim program's argv for take, held and drop
    plan.py      the pure decisions: the refusal's text, `plan_change` (the ports it claims, its
                 inputs from config: components/layout.py)
    execute.py   the claim carried out over SSH (the only I/O): ensure, observe, release
    errors.py    ClaimRefused: another stack holds this node's names or ports
    provider.py  StackClaimProvider (diff: no I/O)
    resource.py  the StackClaim resource (type qwen35:StackClaim)
Code run on the node: components/node_programs/stack_claim.py.

Keep `StackClaimProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.provider_kit.lazy import lazy_exports
from components.stack_claim.errors import ClaimRefused
from components.stack_claim.execute import SSH_TIMEOUT_S, ensure, observe, release
from components.stack_claim.facts import claim_report, held_as_claimed
from components.stack_claim.plan import CLAIM_KEYS, plan_change, refusal
from components.stack_claim.programs import claim_argv, claim_spec

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "StackClaim": ".resource",
        "StackClaimProvider": ".provider",
    },
)

__all__ = [
    "CLAIM_KEYS",
    "SSH_TIMEOUT_S",
    "ClaimRefused",
    "StackClaim",
    "StackClaimProvider",
    "claim_argv",
    "claim_spec",
    "claim_report",
    "ensure",
    "held_as_claimed",
    "observe",
    "plan_change",
    "refusal",
    "release",
]
