"""Stack config: a table of bad configs, each refused with the field named; good configs load."""

from __future__ import annotations

import pulumi
import pytest

from components.config import ConfigError, ImageStrategy, ModelCheckMode, Role, parse_stack_config
from tests.support.program import dev_raw, run_program, stack_config


def test_dev_stack_loads_with_the_seed_procedure_values():
    cfg = parse_stack_config(dev_raw())
    assert [n.name for n in cfg.nodes] == ["spark-1", "spark-2"]
    assert cfg.head.name == "spark-1" and cfg.head.fabric_ip == "192.168.200.12"
    assert cfg.head.host == "10.1.230.180"
    assert [w.name for w in cfg.workers] == ["spark-2"]
    assert cfg.workers[0].fabric_ip == "192.168.200.13"
    assert cfg.jump_spec(cfg.workers[0]) == "aurora@10.1.230.180:22"
    assert cfg.jump_spec(cfg.head) is None
    assert cfg.node_user(cfg.head) == "aurora"
    assert cfg.image.strategy is ImageStrategy.PREBUILT and cfg.image.prebuilt == "vllm-node:latest"
    assert cfg.image.model_check is ModelCheckMode.ENFORCE
    assert [n.memory_gb for n in cfg.nodes] == [128.0, 128.0]
    assert cfg.serve.model == "Qwen/Qwen3.5-122B-A10B-FP8" and cfg.serve.tensor_parallel_size == 2


def test_first_node_is_head_by_default():
    raw = dev_raw()
    for node in raw["nodes"]:
        node.pop("role")
    cfg = parse_stack_config(raw)
    assert cfg.head.name == "spark-1" and cfg.head.role is None


def test_config_is_frozen():
    cfg = parse_stack_config(dev_raw())
    with pytest.raises(Exception, match="frozen"):
        cfg.serve.port = 1  # type: ignore[misc]


def test_bare_transformers_version_becomes_an_exact_pin():
    raw = dev_raw()
    raw["image"] = {"strategy": "hybrid", "transformers": "5.3.0"}
    assert parse_stack_config(raw).image.transformers == "==5.3.0"


def _set(path: str, value):
    """A mutation of the dev config: set `value` at dotted `path` (list indexes as numbers)."""

    def mutate(raw):
        *parents, last = path.split(".")
        target = raw
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


def _delete(path: str):
    def mutate(raw):
        *parents, last = path.split(".")
        target = raw
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        del target[last]

    return mutate


def _both(*mutations):
    def mutate(raw):
        for m in mutations:
            m(raw)

    return mutate


BAD = [
    # (case, mutation, substrings the message must contain)
    ("missing head", _both(_set("nodes.0.role", "worker")), ["nodes:", "head"]),
    ("two heads", _set("nodes.1.role", "head"), ["nodes:", "exactly one head"]),
    ("duplicate names", _set("nodes.1.name", "spark-1"), ["nodes.1.name:", "nodes.0"]),
    ("duplicate hosts", _set("nodes.1.host", "10.1.230.180"), ["nodes.1.host:", "also used"]),
    ("duplicate fabric", _set("nodes.1.fabric_ip", "192.168.200.12"), ["nodes.1.fabric_ip:"]),
    ("bad fabric ip", _set("nodes.1.fabric_ip", "192.168.200.300"), ["nodes.1.fabric_ip:", "not an IP"]),
    ("bad host", _set("nodes.0.host", "spark 1;rm -rf /"), ["nodes.0.host:", "hostname"]),
    ("bad node name", _set("nodes.0.name", "Spark_1"), ["nodes.0.name:"]),
    ("negative port", _set("ssh.port", -22), ["ssh.port:"]),
    ("port too big", _set("serve.port", 70000), ["serve.port:"]),
    ("node port zero", _set("nodes.1.port", 0), ["nodes.1.port:"]),
    ("tp x pp mismatch", _set("serve.tensor_parallel_size", 4), ["serve.tensor_parallel_size:", "2 GPUs"]),
    ("pp mismatch", _set("serve.pipeline_parallel_size", 2), ["tensor_parallel_size × pipeline"]),
    ("unknown top key", lambda raw: raw.update(sever={"port": 1}), ["sever: unknown key", "'serve'"]),
    ("unknown nested key", _set("serve.tensor_paralel_size", 2), ["serve.tensor_paralel_size", "did you"]),
    ("unknown node key", _set("nodes.1.fabric_addr", "1.2.3.4"), ["nodes.1.fabric_addr", "'fabric_ip'"]),
    ("tag with shell chars", _set("image.tag", "v1;reboot"), ["image.tag:", "safe image tag"]),
    ("tag with backticks", _set("image.tag", "`id`"), ["image.tag:"]),
    ("uppercase image", _set("image.name", "VLLM-Node"), ["image.name:"]),
    ("image with space", _set("image.base", "vllm node"), ["image.base:", "whitespace"]),
    ("prebuilt injection", _set("image.prebuilt", "vllm-node:latest;reboot"), ["image.prebuilt:", "tag"]),
    ("prebuilt as an option", _set("image.prebuilt", "--privileged"), ["image.prebuilt:"]),
    ("prebuilt subshell", _set("image.prebuilt", "$(id)/x:1"), ["image.prebuilt:"]),
    (
        "prebuilt digest only",
        _set("image.prebuilt", "x@sha256:" + "a" * 64),
        ["image.prebuilt:", "name:tag@"],
    ),
    ("donor bad digest", _set("image.donor", "x@sha256:123"), ["image.donor:", "digest"]),
    ("name with a tag", _set("image.name", "vllm-node-qwen35:v1"), ["image.name:", "image.tag"]),
    ("tag twice", _both(_set("image.base", "vllm-node:1"), _set("image.base_tag", "2")), ["image.base_tag"]),
    ("unknown strategy", _set("image.strategy", "download"), ["image.strategy:"]),
    ("unknown check mode", _set("image.model_check", "skip"), ["image.model_check:"]),
    ("no memory", _set("nodes.1.memory_gb", 0), ["nodes.1.memory_gb:"]),
    (
        "tp x pp under",
        _set("serve.tensor_parallel_size", 1),
        ["serve.tensor_parallel_size:", "= 1", "2 GPUs"],
    ),
    ("bad transformers", _set("image.transformers", "latest"), ["image.transformers:"]),
    ("bad platform", _set("image.platform", "windows/arm64"), ["image.platform:"]),
    ("no known_hosts", _delete("ssh.known_hosts"), ["ssh.known_hosts:"]),
    ("no nodes", _delete("nodes"), ["nodes: missing"]),
    ("empty nodes", _set("nodes", []), ["nodes:"]),
    ("bad gpu memory", _set("serve.gpu_memory_utilization", 1.5), ["serve.gpu_memory_utilization:"]),
    ("extra arg newline", _set("serve.extra_args", ["--x", "a\nreboot"]), ["serve.extra_args:", "line"]),
    ("extra arg with a NUL", _set("serve.extra_args", ["--x\x00"]), ["serve.extra_args:", "NUL"]),
    (
        "typed flag as extra arg",
        _set("serve.extra_args", ["--kv-cache-dtype=fp8"]),
        ["serve.extra_args:", "serve.kv_cache_dtype"],
    ),
    (
        "speculative as extra arg",
        _set("serve.extra_args", ["--speculative-config", '{"method":"mtp"}']),
        ["serve.extra_args:", "serve.speculative"],
    ),
    (
        "revision as extra arg",
        _set("serve.extra_args", ["--revision", "main"]),
        ["serve.extra_args:", "model.revision"],
    ),
    ("bad kv cache dtype", _set("serve.kv_cache_dtype", "fp4"), ["serve.kv_cache_dtype:", "'fp8'"]),
    (
        "auto tool choice without a parser",
        _set("serve.tool_call_parser", None),
        ["serve.enable_auto_tool_choice:", "tool_call_parser"],
    ),
    (
        "unknown speculative key",
        _set("serve.speculative.num_spec_tokens", 2),
        ["serve.speculative.num_spec_tokens: unknown key", "'num_speculative_tokens'"],
    ),
    ("speculative tokens zero", _set("serve.speculative.num_speculative_tokens", 0), ["serve.speculative."]),
    ("bad speculative method", _set("serve.speculative.method", "MTP;x"), ["serve.speculative.method:"]),
    ("bad reasoning parser", _set("serve.reasoning_parser", "qwen 3"), ["serve.reasoning_parser:"]),
    ("unknown serve option", _set("serve.prefix_cache", True), ["serve.prefix_cache", "'prefix_caching'"]),
    (
        "seqs over tokens",
        _set("serve.max_num_batched_tokens", 2),
        ["serve.max_num_batched_tokens:", "max_num_seqs"],
    ),
    (
        "api key as extra arg",
        _set("serve.extra_args", ["--api-key=sk-123"]),
        ["serve.extra_args:", "--secret"],
    ),
    ("bad ifname", _set("fabric.socket_ifname", "eth0; ls"), ["fabric.socket_ifname:"]),
    ("bad hca", _set("fabric.ib_hca", ["mlx5 0"]), ["fabric.ib_hca:"]),
    ("unknown jump", _set("nodes.1.proxy_jump", "spark-9"), ["nodes.1.proxy_jump:"]),
    ("self jump", _set("nodes.0.proxy_jump", "spark-1"), ["nodes.0.proxy_jump:"]),
    ("bad role", _set("nodes.1.role", "master"), ["nodes.1.role:"]),
    ("negative gpus", _set("nodes.1.gpus", -1), ["nodes.1.gpus:"]),
    ("relative known_hosts", _set("ssh.known_hosts", "known hosts"), ["ssh.known_hosts:"]),
    (
        "compile cache not a bool",
        lambda raw: raw.update(containers={"compile_cache": "maybe"}),
        ["containers.compile_cache:"],
    ),
    (
        "compile cache misspelt",
        lambda raw: raw.update(containers={"compile_caches": False}),
        ["containers.compile_caches", "did you"],
    ),
]


@pytest.mark.parametrize(("case", "mutate", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_the_field(case, mutate, expected):
    raw = dev_raw()
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    message = str(info.value)
    for part in expected:
        assert part in message, f"{case}: {part!r} not in:\n{message}"
    assert "Traceback" not in message


def test_table_is_large_enough():
    assert len(BAD) >= 15


def test_every_problem_is_reported_at_once():
    raw = dev_raw()
    raw["nodes"][1]["fabric_ip"] = "nope"
    raw["serve"]["port"] = 0
    raw["image"]["tag"] = "a b"
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    paths = [p.split(":")[0] for p in info.value.problems]
    assert {"nodes.1.fabric_ip", "serve.port", "image.tag"} <= set(paths)


def test_bad_config_fails_the_program_before_any_resource():
    config = stack_config("dev")
    config["qwen35-spark:nodes"][1]["fabric_ip"] = "192.168.200.999"
    with pytest.raises(pulumi.RunError) as info:
        run_program(config)
    assert "nodes.1.fabric_ip:" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_bad_config_registers_no_resources():
    from tests.support import program

    recorded = []

    class Spy(program.RecordingMocks):
        def new_resource(self, args):
            recorded.append(args.name)
            return super().new_resource(args)

    config = stack_config("dev")
    config["qwen35-spark:serve"]["tensor_parallel_size"] = 3
    original = program.RecordingMocks
    program.RecordingMocks = Spy
    try:
        with pytest.raises(pulumi.RunError, match="tensor_parallel_size"):
            run_program(config)
    finally:
        program.RecordingMocks = original
    assert recorded == []


def test_role_enum_values():
    assert Role("head") is Role.HEAD and Role("worker") is Role.WORKER


def test_lab_stack_loads_and_keeps_lab_differences_in_config():
    raw = {k.split(":", 1)[1]: v for k, v in stack_config("lab").items()}
    cfg = parse_stack_config(raw)
    assert [n.name for n in cfg.nodes] == ["node-a", "node-b"]
    assert cfg.containers.gpu_runtime is False and cfg.containers.devices == []
    ports_a = cfg.nodes[0].ray_ports.model_dump().values()
    ports_b = cfg.nodes[1].ray_ports.model_dump().values()
    assert None not in ports_a and not set(ports_a) & set(ports_b)


def test_copy_tuning_is_typed_and_only_non_defaults_reach_node_image():
    raw = dev_raw()
    assert parse_stack_config(raw).copy_.tuning() == {}
    raw["copy"] = {"compression": "gzip", "stall_timeout_s": 60}
    assert parse_stack_config(raw).copy_.tuning() == {"compression": "gzip", "stall_timeout_s": 60.0}
    raw["copy"] = {"compresion": "gzip", "source_export": "rsync"}
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    message = str(info.value)
    assert "copy.compresion: unknown key (did you mean 'compression'?)" in message
    assert "copy.source_export:" in message


def test_extra_args_take_any_argv_element_json_included():
    raw = dev_raw()
    args = ["--mm-processor-kwargs", '{"video_kwargs": {"size": {"longest_edge": 4096}}}', "$(not a shell)"]
    raw["serve"]["extra_args"] = args
    assert parse_stack_config(raw).serve.extra_args == args


def test_secret_extra_args_are_refused_without_echoing_the_value():
    raw = dev_raw()
    raw["serve"]["extra_args"] = ["--api-key=sk-very-secret"]
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    assert "sk-very-secret" not in str(info.value)


ACCEPTED_IMAGES = [
    # (field, typed, base_ref/donor_ref/prebuilt as the program uses it)
    ("base", "vllm-node:latest", "vllm-node:latest"),
    ("base", "vllm-node", "vllm-node:latest"),
    ("base", "localhost:5000/vllm-node:0.14.0", "localhost:5000/vllm-node:0.14.0"),
    ("base", "vllm-node:0.14@sha256:" + "b" * 64, "vllm-node@sha256:" + "b" * 64),
    (
        "donor",
        "hellohal2064/vllm-qwen3.5-gb10@sha256:" + "c" * 64,
        "hellohal2064/vllm-qwen3.5-gb10@sha256:" + "c" * 64,
    ),
    ("prebuilt", "nvcr.io/nvidia/vllm:26.03-py3", "nvcr.io/nvidia/vllm:26.03-py3"),
    ("prebuilt", "vllm-node", "vllm-node"),
    ("prebuilt", "vllm-node:nightly@sha256:" + "d" * 64, "vllm-node:nightly@sha256:" + "d" * 64),
]


@pytest.mark.parametrize(("field", "typed", "used"), ACCEPTED_IMAGES)
def test_image_references_as_operators_type_them(field, typed, used):
    raw = dev_raw()
    raw["image"][field] = typed
    if field != "prebuilt":
        raw["image"].update(strategy="hybrid")
        del raw["image"]["prebuilt"]
    image = parse_stack_config(raw).image
    got = {"base": image.base_ref, "donor": image.donor_ref, "prebuilt": image.prebuilt}[field]
    assert got == used


def test_a_separate_tag_still_applies_to_an_untagged_base():
    raw = dev_raw()
    raw["image"] = {"strategy": "hybrid", "base": "lab-vllm-base", "base_tag": "0.14.0"}
    assert parse_stack_config(raw).image.base_ref == "lab-vllm-base:0.14.0"


def test_hybrid_strategy_and_report_mode_are_accepted():
    raw = dev_raw()
    raw["image"] = {"strategy": "hybrid", "model_check": "report"}
    image = parse_stack_config(raw).image
    assert image.strategy is ImageStrategy.HYBRID and image.model_check is ModelCheckMode.REPORT


# Each image strategy reads its own keys; a key it does not read is refused naming it.
STRATEGY_CASES = [
    # (case, image section, substrings the message must contain, substrings it must not)
    (
        "seed keys without a strategy",
        {"base": "vllm-node:0.14", "donor": "donor:1", "name": "mine", "transformers": "==5.2.0"},
        [
            "image.base: not used by strategy 'prebuilt'",
            "image.donor: not used by strategy 'prebuilt'",
            "image.name: not used by strategy 'prebuilt'",
            "image.transformers: not used by strategy 'prebuilt'",
        ],
        [],
    ),
    (
        "graft without donor and base",
        {"strategy": "graft"},
        ["image.donor: strategy 'graft' needs it", "image.base: strategy 'graft' needs it"],
        [],
    ),
    (
        "graft with the hybrid's keys",
        {
            "strategy": "graft",
            "base": "b:1",
            "donor": "d:1",
            "transformers": "==4.57.6",
            "base_vllm_dir": "/x/vllm",
        },
        [
            "image.transformers: not used by strategy 'graft'",
            "set image.strategy to 'hybrid'",
            "image.base_vllm_dir: not used by strategy 'graft'",
        ],
        ["image.donor", "image.base:"],
    ),
    (
        "prebuilt with a build key",
        {"prebuilt": "x:1", "smoke": False},
        ["image.smoke: not used"],
        ["prebuilt:"],
    ),
    (
        "hybrid with prebuilt",
        {"strategy": "hybrid", "prebuilt": "x:1"},
        ["image.prebuilt: not used by strategy 'hybrid'", "'prebuilt'"],
        [],
    ),
    ("bad ray version", {"ray_version": "newest"}, ["image.ray_version:"], []),
]


@pytest.mark.parametrize(
    ("case", "image", "expected", "absent"), STRATEGY_CASES, ids=[c[0] for c in STRATEGY_CASES]
)
def test_a_key_the_strategy_does_not_read_is_refused_naming_it(case, image, expected, absent):
    raw = dev_raw()
    raw["image"] = image
    with pytest.raises(ConfigError) as info:
        parse_stack_config(raw)
    message = str(info.value)
    for part in expected:
        assert part in message, f"{case}: {part!r} not in:\n{message}"
    for part in absent:
        assert part not in message, f"{case}: {part!r} in:\n{message}"


@pytest.mark.parametrize(
    ("image", "strategy"),
    [
        (
            {
                "strategy": "graft",
                "base": "vllm-node:0.14",
                "donor": "donor:0.17.1",
                "name": "g",
                "pip_args": ["--no-index"],
                "smoke": False,
                "platform": "linux/amd64",
                "ray_version": "2.49.1",
            },
            ImageStrategy.GRAFT,
        ),
        (
            {"prebuilt": "nvcr.io/nvidia/vllm:26.03-py3", "model_check": "report", "ray_version": "==2.60.0"},
            ImageStrategy.PREBUILT,
        ),
        (
            {
                "strategy": "hybrid",
                "base": "b:1",
                "donor": "d:1",
                "transformers": "4.57.6",
                "base_vllm_dir": "/x/vllm",
            },
            ImageStrategy.HYBRID,
        ),
    ],
)
def test_each_strategy_accepts_the_keys_it_reads(image, strategy):
    raw = dev_raw()
    raw["image"] = image
    parsed = parse_stack_config(raw).image
    assert parsed.strategy is strategy
    assert parsed.ray_version in (None, "==2.49.1", "==2.60.0")


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        (".venv/bin/python", "{project}/.venv/bin/python"),
        ("./venvs/hub/bin/python3", "{project}/venvs/hub/bin/python3"),
        ("/opt/hub/bin/python", "/opt/hub/bin/python"),
        ("python3", "python3"),
    ],
)
def test_a_relative_fetch_python_is_the_projects_own(tmp_path, typed, expected):
    raw = dev_raw("lab")
    raw["model"]["fetch_python"] = typed
    cfg = parse_stack_config(raw, project_dir=tmp_path)
    assert cfg.model.fetch_python == expected.format(project=tmp_path)


def test_a_relative_fetch_python_keeps_the_venv_symlink(tmp_path):
    # A venv's bin/python is a symlink to the system Python: resolved, it would lose the venv.
    (tmp_path / "real").mkdir()
    (tmp_path / ".venv").symlink_to(tmp_path / "real")
    raw = dev_raw("lab")
    raw["model"]["fetch_python"] = ".venv/bin/python"
    assert parse_stack_config(raw, project_dir=tmp_path).model.fetch_python == f"{tmp_path}/.venv/bin/python"


def test_the_lab_stack_file_names_no_checkout_of_its_own():
    from components.config import PROJECT_DIR

    written = stack_config("lab")["qwen35-spark:model"]["fetch_python"]
    assert not written.startswith("/"), "Pulumi.lab.yaml must not hold one checkout's absolute path"
    cfg = parse_stack_config(dev_raw("lab"))
    assert cfg.model.fetch_python == f"{PROJECT_DIR}/{written}"


@pytest.mark.parametrize("typed", ["bin/py thon", ".venv/bin/python;rm", "~/venv/bin/python"])
def test_a_fetch_python_that_is_no_path_is_refused_naming_the_field(typed):
    raw = dev_raw("lab")
    raw["model"]["fetch_python"] = typed
    with pytest.raises(ConfigError) as err:
        parse_stack_config(raw)
    assert "model.fetch_python" in str(err.value) and "relative to the project directory" in str(err.value)


def test_the_lab_declares_the_refusals_its_images_earn():
    cfg = parse_stack_config(dev_raw("lab"))
    expects = cfg.image.model_check_expects
    assert cfg.image.model_check == ModelCheckMode.REPORT and expects is not None
    assert expects.stages() == {
        "behaviour": "environment",
        "serve_args": "environment",
        "cluster_layer": "ray",
    }
    assert parse_stack_config(dev_raw()).image.model_check_expects is None


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (
            {"model_check": "enforce"},
            "image.model_check_expects: only with image.model_check: report",
        ),
        ({"model_check_expects": {"because": "x", "behaviour": "torch"}}, "one of environment, config"),
        ({"model_check_expects": {"because": "x", "cluster_layer": "environment"}}, "one of ray, cluster"),
        ({"model_check_expects": {"because": "x"}}, "name the stage at least one proof refuses at"),
        ({"model_check_expects": {"because": "two\nlines", "behaviour": "load"}}, "one line"),
        ({"model_check_expects": {"behaviour": "load"}}, "model_check_expects.because"),
        ({"model_check_expects": {"because": "x", "behavior": "load"}}, "did you mean 'behaviour'"),
    ],
    ids=[
        "under-enforce",
        "no-such-stage",
        "another-proofs-stage",
        "no-stage",
        "multi-line",
        "no-because",
        "typo",
    ],
)
def test_expected_refusals_are_refused_where_they_make_no_sense(image, expected):
    raw = dev_raw("lab")
    raw["image"] = {**raw["image"], **image}
    with pytest.raises(ConfigError) as err:
        parse_stack_config(raw)
    assert expected in str(err.value)


def test_the_compile_cache_is_on_unless_turned_off():
    assert parse_stack_config(dev_raw()).containers.compile_cache is True
    raw = dev_raw()
    raw.setdefault("containers", {})["compile_cache"] = False
    assert parse_stack_config(raw).containers.compile_cache is False
