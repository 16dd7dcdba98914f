"""The graph: Qwen35Deployment, the whole cluster as one component (providers, images, Ray, vLLM,
readiness), one module per stage it registers.

Order, enforced by dependencies (and reversed by `pulumi destroy`):
docker provider per node → FabricCheck per node (the head's first: its MTU is every worker's
reference; none under `fabric.check: off`) → the image on the head (strategy `prebuilt`: already
there, nothing built; `hybrid` or `graft`: BuiltImage builds it) → NodeImage per node →
model-support check on the head, and the node proof on every node (after every NodeImage and
FabricCheck; none under `fabric.node_proof: off`) → Ray head → Ray workers → vLLM server on the
head → readiness gate (every container after every node's FabricCheck and the node proof) → answer
check on the head (none under `answers.mode: off`) → serve bench on the head (none under
`bench.mode: off`) and health (none under `health.mode: off`): the
watchdog's state volume on the head, an agent on every worker, then the watchdog on the head. Under
`cluster.executor: mp` no Ray runs: the headless vLLM ranks (one per worker) → the serving rank on
the head → readiness gate (see components/mp_executor.py). Every container runs the `sha256:` image
ID its node's NodeImage reports and the NCCL settings its node's FabricCheck decided, so a rebuilt
image or a changed GID index replaces exactly the containers it concerns (under mp: every rank, as
the ranks are one world).

- `component`: Qwen35Deployment (the stages in order, and what they share: a container on a node);
- `nodes` (providers, stack claims, the stack's secrets, FabricCheck), `image` (the build and its
  copies), `checkpoint`, `proofs` (model support, the node proof), `serving` (compile caches, Ray or
  the mp ranks, the server, the readiness gate), `checks` (answers, bench), `health`: the stages;
- `docker_args` (a ContainerSpec as docker arguments), `served` (layout's server argv and what the
  gate records, pinned to the checkpoint's commit), `mp_world` (the mp ranks' shared digest),
  `outputs` (the stack outputs): values, no resource.

Every resource's inputs from config come from `components/layout.py`; a stage reads config only to
decide whether a resource exists, and wires the outputs of one resource into the next
(`tests/unit/test_layout_inputs.py`).
"""
