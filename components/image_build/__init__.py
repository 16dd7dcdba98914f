"""ImageBuild: the hybrid or graft image built on the head's own Docker over SSH (a dynamic resource).

create() reads where the tag points on the head, then builds: `docker build … -` there, the build
context (this machine's `patches/`) streamed as a tar on ssh's stdin, every line of the build
relayed to the operator, the image tagged under a temporary name and given its real tag only once
the build (and every proof in it) passed. A content tag already on the head is that image (the tag
is a hash of the inputs) and is kept without a build, if its labels say it was built from the source
images (base, donor) the head holds now. read() (`pulumi refresh`) reads the tag back: gone or moved
is drift, which `up` restores by a re-tag when the image is still there, else a build; and it reads
the source images' IDs: a base rebuilt under its reference is drift, which `up` builds again.
diff() and check() touch no node. delete() leaves the head alone. Nothing is pushed.

Files, by job:
    facts.py     what the head's Docker says (the tag's image and the source images it was built
                 from, a recorded ID's presence, each source's ID now, the build log's last step and
                 refusing proof), parsed into values
    programs.py  the commands run on the head (docker build / image inspect / tag / image rm) and the
                 build's stdin (the context tar)
    plan.py      the pure decisions: validate, plan_change -> Change, keep / re-tag / build
    execute.py   ensure (create, update) and observe (read) over the SSH transport: the only I/O
    errors.py    ImageBuildError (node, stage, output tail, next step) and FactsError
    provider.py  the dynamic provider (check/diff: no I/O)
    resource.py  the ImageBuild resource (type qwen35:ImageBuild)
    component.py BuiltImage, the hybrid or graft image the deployment declares (type
                 qwen35:index:HybridImage): its Dockerfile, build args and content tag, and its
                 ImageBuild child

Keep `ImageBuildProvider` importable here under this name, with no import-time side effects: stacks
pickle it by reference to this module.
"""

from components.image_build.errors import FactsError, ImageBuildError
from components.image_build.execute import (
    BUILD_TIMEOUT_S,
    build,
    ensure,
    head_image,
    observe,
)
from components.image_build.facts import (
    BuildLog,
    HeadImage,
    parse_build_log,
    parse_head_image,
    parse_image_id,
    source_label,
)
from components.image_build.plan import (
    OUTPUT_KEYS,
    REPLACE_KEYS,
    UPDATE_KEYS,
    Build,
    Keep,
    Retag,
    build_id,
    drifted,
    moved_sources,
    plan_change,
    plan_create,
    plan_restore,
    validate,
)
from components.image_build.programs import (
    BUILD_TAG_PREFIX,
    build_argv,
    build_ref,
    context_digest,
    context_files,
    ignore_rules,
    ignored,
    inspect_argv,
    source_refs,
    tag_argv,
    untag_argv,
    write_context,
)
from components.provider_kit.lazy import lazy_exports

# Loaded on first use: these modules import Pulumi (components/provider_kit/lazy.py).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ImageBuild": ".resource",
        "ImageBuildProvider": ".provider",
    },
)

__all__ = [
    "BUILD_TAG_PREFIX",
    "BUILD_TIMEOUT_S",
    "OUTPUT_KEYS",
    "REPLACE_KEYS",
    "UPDATE_KEYS",
    "Build",
    "BuildLog",
    "FactsError",
    "HeadImage",
    "ImageBuild",
    "ImageBuildError",
    "ImageBuildProvider",
    "Keep",
    "Retag",
    "build",
    "build_argv",
    "build_id",
    "build_ref",
    "context_digest",
    "context_files",
    "drifted",
    "moved_sources",
    "ensure",
    "head_image",
    "ignore_rules",
    "ignored",
    "inspect_argv",
    "source_refs",
    "observe",
    "parse_build_log",
    "parse_head_image",
    "parse_image_id",
    "source_label",
    "plan_change",
    "plan_create",
    "plan_restore",
    "tag_argv",
    "untag_argv",
    "validate",
    "write_context",
]
