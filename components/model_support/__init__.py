"""ModelSupportCheck: on the head, before any Ray container, prove the image loads the checkpoint and fits.

create(), over SSH on the head:
1. With a checkpoint declared: read the snapshot's size and layer count on the head
   (`node_programs/model_facts.py`) and run the memory-fit preflight (`memory_fit.py`), so a
   model that cannot fit stops here, before any container starts.
2. With a pinned reference (`…@sha256:`): the head's image must carry that repo digest.
3. With `cluster` set (the deployment sets it for every strategy): the cluster layer
   (`patches/prove_cluster.py`) in a throwaway container of the image: Ray imports beside vLLM at
   the stack's `image.ray_version` (and within vLLM's own Ray pin), a one-node Ray cluster starts
   and stops, vLLM's Ray executor imports. An image without Ray is refused here, naming Ray, instead
   of crash-looping its Ray containers under the readiness gate. Under `cluster.executor: mp` the
   deployment sets `cluster={"executor": "mp"}`: no Ray runs, the proof is not run, and the output
   `cluster_layer` says so (`verdict: not-run`), so an image without Ray is accepted.
4. With `serve_argv` set: the argument proof (`patches/prove_args.py`, `serve_args.py`):
   the image's vLLM parses the server's exact command line, and under executor mp each headless
   rank's (`rank_argvs`), each on its own in one run, its multi-node layout built by vLLM.
5. The proof program (`patches/prove_model.py` and its `proof_configs/`) in a short-lived
   container of the image, by image ID: `docker run --rm`, no network, `HF_HUB_OFFLINE=1`, the
   checkpoint's Hugging Face repo folder mounted read-only (its snapshot's `../../blobs` links
   resolve inside it). The program arrives on stdin, packed into `node_programs/proof_bootstrap.py`,
   so the image needs nothing but python3. Its last stdout line is one JSON report.
A failed proof stops `pulumi up` naming the stage, the error, the image and its vLLM (mode
`enforce`), or is recorded in the outputs (mode `report`: stand-in images, the lab).

It is a proof, not live state: diff asks for a new run only when the image ID, the checkpoint digest,
the memory inputs, the server's argv or the cluster input change; diff and check do no I/O; read
returns what was recorded.

Files, by job:
    facts.py     what the head's programs report, parsed into values (the checkpoint snapshot's
                 facts, the image's repo digests, the proofs' reports); pure
    programs.py  the proofs' payloads and `docker run` argv (behaviour, cluster, serve args), and the
                 head's reads as argv
    plan.py      the pure decisions: validate, which steps run, plan_change -> Change, the memory
                 fit, the pin, a refusal -> message and next step
    execute.py   ensure: create carried out over the SSH transport (the only I/O)
    errors.py    ModelSupportError, MemoryFitError, ServeArgsError
    provider.py  ModelSupportCheckProvider (check/diff/update/read: no I/O)
    resource.py  the ModelSupportCheck resource (type qwen35:ModelSupportCheck)
    memory_fit.py, serve_args.py  the memory-fit preflight and the argument proof's pieces
Code run on the head: components/node_programs/ (model_facts.py, proof_bootstrap.py) and, in the
containers, patches/ (prove_model.py + proof_configs/, prove_cluster.py, prove_args.py).

Keep `ModelSupportCheckProvider` importable here under this name, with no import-time side effects:
stacks pickle it by reference to this module.
"""

from components.model_support.errors import MemoryFitError, ModelSupportError, ServeArgsError
from components.model_support.execute import (
    FACTS_TIMEOUT_S,
    TRANSPORT_SLACK_S,
    check_cluster_layer,
    checkpoint_facts,
    image_repo_digests,
    prove_model,
    prove_serve_args,
    verify_pin,
)
from components.model_support.facts import (
    STAGE_HINTS,
    ProofExit,
    image_label,
    parse_checkpoint_facts,
    parse_cluster,
    parse_proof,
    parse_repo_digests,
)
from components.model_support.plan import (
    CHECKPOINT_AT_FAULT,
    CLUSTER_FIELDS,
    CLUSTER_HINT,
    DEFAULT_DEADLINE_S,
    HOST_PATH,
    IMAGE_ID,
    NATIVE_VLLM,
    OUTPUT_KEYS,
    PREBUILT,
    QWEN35_ARCHITECTURES,
    REPORT_FIELDS,
    RERUN_KEYS,
    SOFT_KEYS,
    Change,
    Steps,
    check_fit,
    check_id,
    cluster_failure,
    cluster_not_run,
    create_problems,
    enforced,
    failure_message,
    next_step,
    pin_mismatch,
    plan_change,
    plan_steps,
    recorded_outputs,
    recorded_refusal,
    serve_memory,
    validate,
)
from components.model_support.programs import (
    CLUSTER_PROGRAM,
    CONTAINER_REPO,
    PATCH_DIR,
    PROOF_CONFIGS,
    PROOF_PROGRAM,
    checkpoint_mount,
    cluster_argv,
    proof_argv,
    proof_payload,
    proof_source,
    serve_args_argv,
    throwaway_run,
)
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ModelSupportCheck": ".resource",
        "ModelSupportCheckProvider": ".provider",
    },
)

__all__ = [
    "CHECKPOINT_AT_FAULT",
    "CLUSTER_FIELDS",
    "CLUSTER_HINT",
    "CLUSTER_PROGRAM",
    "CONTAINER_REPO",
    "DEFAULT_DEADLINE_S",
    "FACTS_TIMEOUT_S",
    "HOST_PATH",
    "IMAGE_ID",
    "NATIVE_VLLM",
    "OUTPUT_KEYS",
    "PATCH_DIR",
    "PREBUILT",
    "PROOF_CONFIGS",
    "PROOF_PROGRAM",
    "QWEN35_ARCHITECTURES",
    "REPORT_FIELDS",
    "RERUN_KEYS",
    "SOFT_KEYS",
    "STAGE_HINTS",
    "TRANSPORT_SLACK_S",
    "Change",
    "MemoryFitError",
    "ModelSupportCheck",
    "ModelSupportCheckProvider",
    "ModelSupportError",
    "ProofExit",
    "Steps",
    "check_cluster_layer",
    "check_fit",
    "check_id",
    "checkpoint_facts",
    "checkpoint_mount",
    "cluster_argv",
    "cluster_failure",
    "cluster_not_run",
    "create_problems",
    "enforced",
    "failure_message",
    "image_label",
    "image_repo_digests",
    "next_step",
    "parse_checkpoint_facts",
    "parse_cluster",
    "parse_proof",
    "parse_repo_digests",
    "pin_mismatch",
    "plan_change",
    "plan_steps",
    "proof_argv",
    "proof_payload",
    "proof_source",
    "prove_model",
    "prove_serve_args",
    "recorded_outputs",
    "recorded_refusal",
    "ServeArgsError",
    "serve_args_argv",
    "serve_memory",
    "throwaway_run",
    "validate",
    "verify_pin",
]
