"""ServeBench: a dynamic resource that measures the served speed once the readiness gate passed.

The provider ships `components/node_programs/serve_bench.py` to the head over SSH (`python3 -`,
program on stdin, the API key in its environment) and runs it there: a warm-up, one stream of
`bench.output_tokens` (decode tokens/s, time to first token), one prompt of about
`bench.prompt_tokens` (prefill tokens/s), `bench.concurrency` streams at once (aggregate tokens/s).
Dynamic providers' create never runs during preview, and diff does no I/O. It measures again only
when what it measures changes (every node's image ID, the server's argv, the node set, what each
node's serving containers give NCCL, the bench settings); new floors or mode judge the recorded
figures again; `read` (pulumi refresh) gives back the recorded figures and runs nothing.

Files, by job:
    facts.py     the bench's report parsed; its figures as one line
    programs.py  the bench program as the head runs it (its argv, its source with the API key) and
                 what its exit status means
    plan.py      the pure decisions: `plan_change`, which changes measure again, the floors'
                 verdict and a miss's likely causes
    execute.py   the bench carried out over SSH (the only I/O): ensure (create, update)
    errors.py    BenchFailed (could not measure), BelowFloor (enforce: a figure missed its floor)
    provider.py  the dynamic provider (diff: no I/O)
    resource.py  the ServeBench resource (type qwen35:ServeBench)
Code run on the head: components/node_programs/serve_bench.py.

Keep `ServeBenchProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.provider_kit.lazy import lazy_exports
from components.serve_bench.errors import BelowFloor, BenchFailed
from components.serve_bench.execute import ensure
from components.serve_bench.facts import figures_line, parse_report
from components.serve_bench.plan import (
    MEASURE_KEYS,
    judged,
    likely_causes,
    measures_again,
    plan_change,
    shortfalls,
)
from components.serve_bench.programs import bench_argv, bench_program

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ServeBench": ".resource",
        "ServeBenchProvider": ".provider",
    },
)

__all__ = [
    "MEASURE_KEYS",
    "BelowFloor",
    "BenchFailed",
    "ServeBench",
    "ServeBenchProvider",
    "bench_argv",
    "bench_program",
    "ensure",
    "figures_line",
    "judged",
    "likely_causes",
    "measures_again",
    "parse_report",
    "plan_change",
    "shortfalls",
]
