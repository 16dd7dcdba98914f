"""Ray container specs, pure: every flag and variable each node's container gets, as tables."""

from __future__ import annotations

import pytest

from components.config import RestartPolicy
from components.containers import COMPILE_CACHE, CONTAINER_HF_HOME, Mount, fabric_env, host_path
from components.ray_cluster import RAY_TMP, ray_container_spec, ray_start_argv
from tests.support.program import config_from

IMAGE_ID = "sha256:" + "c" * 64


@pytest.fixture
def dev():
    return config_from()


def test_head_command_binds_its_fabric_address(dev):
    head = dev.head
    assert ray_start_argv(dev, head) == [
        "ray", "start", "--head", "--block",
        "--node-ip-address=192.168.200.12",
        "--port=6379",
        "--dashboard-host=192.168.200.12",
        "--dashboard-port=8265",
        "--num-gpus=1",
    ]  # fmt: skip


def test_worker_joins_the_head_on_the_fabric(dev):
    worker = dev.workers[0]
    assert ray_start_argv(dev, worker) == [
        "ray", "start", "--block",
        "--address=192.168.200.12:6379",
        "--node-ip-address=192.168.200.13",
        "--num-gpus=1",
    ]  # fmt: skip


def test_dashboard_host_is_an_explicit_choice(dev):
    opened = config_from(ray={"dashboard_host": "0.0.0.0", "dashboard_port": 9265})
    assert "--dashboard-host=0.0.0.0" in ray_start_argv(opened, opened.head)
    assert "--dashboard-port=9265" in ray_start_argv(opened, opened.head)


def test_lab_ray_ports_become_flags():
    lab = config_from("lab")
    argv = ray_start_argv(lab, lab.workers[0])
    assert argv[:5] == [
        "ray",
        "start",
        "--block",
        "--address=127.0.0.2:16379",
        "--node-ip-address=127.0.0.3",
    ]
    for flag in (
        "--node-manager-port=17111",
        "--object-manager-port=17112",
        "--metrics-export-port=17113",
        "--dashboard-agent-listen-port=17114",
        "--dashboard-agent-grpc-port=17115",
        "--runtime-env-agent-port=17116",
        "--min-worker-port=17300",
        "--max-worker-port=17399",
    ):
        assert flag in argv


@pytest.mark.parametrize(
    ("node", "ip"),
    [(0, "192.168.200.12"), (1, "192.168.200.13")],
)
def test_fabric_env_uses_the_nodes_own_address(dev, node, ip):
    env = fabric_env(dev, dev.nodes[node])
    assert env == {
        "HF_HUB_OFFLINE": "1",
        "VLLM_HOST_IP": ip,
        "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
        "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
        "TP_SOCKET_IFNAME": "enp1s0f0np0",
        "UCX_NET_DEVICES": "enp1s0f0np0",
        "OMPI_MCA_btl_tcp_if_include": "enp1s0f0np0",
        "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
        "NCCL_IB_DISABLE": "0",
        # NCCL says which transport the serving ranks took (read after the gate).
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "RAY_memory_monitor_refresh_ms": "0",
        "HF_HOME": CONTAINER_HF_HOME,
    }


def test_gid_index_only_when_configured(dev):
    assert "NCCL_IB_GID_INDEX" not in fabric_env(dev, dev.head)
    with_gid = config_from(fabric={"ib_gid_index": 3})
    assert fabric_env(with_gid, with_gid.head)["NCCL_IB_GID_INDEX"] == "3"


def test_no_hca_turns_infiniband_off():
    lab = config_from("lab")
    env = fabric_env(lab, lab.head)
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in env


def test_head_spec_defaults(dev):
    spec = ray_container_spec(dev, dev.head, IMAGE_ID)
    assert spec.name == "qwen35-ray-head"
    assert spec.image == IMAGE_ID
    assert spec.command[:4] == ("ray", "start", "--head", "--block")
    assert spec.network_mode == "host" and spec.ipc_mode == "host"
    assert spec.shm_size_mb == 16384
    assert spec.gpus == "all"
    assert spec.devices == ("/dev/infiniband",)
    assert ("memlock", -1, -1) in spec.ulimits
    assert any(name == "stack" for name, _, _ in spec.ulimits)
    assert spec.capabilities == ("CAP_IPC_LOCK",)
    assert spec.privileged is False
    assert spec.init is True
    assert spec.restart is RestartPolicy.UNLESS_STOPPED and spec.max_retry_count is None
    assert spec.secret_env == {"HF_TOKEN": "hf_token"}
    assert "HF_TOKEN" not in spec.env
    assert Mount("/home/aurora/.cache/huggingface", CONTAINER_HF_HOME) in spec.mounts
    assert Mount("qwen35-ray-tmp", RAY_TMP, volume=True) in spec.mounts


def test_worker_spec_has_no_ray_tmp_volume(dev):
    spec = ray_container_spec(dev, dev.workers[0], IMAGE_ID)
    assert spec.name == "qwen35-ray-worker"
    assert spec.node == "spark-2"
    assert [m.target for m in spec.mounts] == [CONTAINER_HF_HOME, COMPILE_CACHE]
    assert spec.env["VLLM_HOST_IP"] == "192.168.200.13"


def test_privileged_is_an_explicit_option():
    cfg = config_from(containers={"privileged": True})
    spec = ray_container_spec(cfg, cfg.head, IMAGE_ID)
    assert spec.privileged is True and spec.capabilities == ()


def test_on_failure_is_bounded():
    cfg = config_from(containers={"restart": "on-failure"})
    spec = ray_container_spec(cfg, cfg.head, IMAGE_ID)
    assert spec.restart is RestartPolicy.ON_FAILURE and spec.max_retry_count == 5


def test_lab_differences_come_from_config():
    lab = config_from("lab")
    spec = ray_container_spec(lab, lab.head, IMAGE_ID)
    assert spec.gpus is None and spec.devices == () and spec.restart is RestartPolicy.NO
    # Each lab node has its own HF cache (model.cache_dirs), as separate machines have.
    assert spec.mounts[0] == Mount("/run/qwen35-lab/node-a/hf-cache", CONTAINER_HF_HOME)
    worker = ray_container_spec(lab, lab.workers[0], IMAGE_ID)
    assert worker.mounts[0] == Mount("/run/qwen35-lab/node-b/hf-cache", CONTAINER_HF_HOME)


@pytest.mark.parametrize(
    ("path", "user", "expected"),
    [
        ("~/.cache/huggingface", "aurora", "/home/aurora/.cache/huggingface"),
        ("~/.cache/huggingface", "root", "/root/.cache/huggingface"),
        ("/data/hf", "aurora", "/data/hf"),
    ],
)
def test_host_path(path, user, expected):
    assert host_path(path, user) == expected


def test_env_list_is_sorted_and_secret_free(dev):
    spec = ray_container_spec(dev, dev.head, IMAGE_ID)
    envs = spec.env_list()
    assert envs == sorted(envs)
    assert not any(e.startswith(("HF_TOKEN=", "VLLM_API_KEY=")) for e in envs)


def every_spec(config):
    """Every container spec of `config`'s Ray graph: the Ray containers and the server."""
    from components.vllm_server import vllm_container_spec

    return [
        *(ray_container_spec(config, n, IMAGE_ID) for n in config.nodes),
        vllm_container_spec(config, IMAGE_ID),
    ]


def test_every_spec_mounts_the_compile_cache_and_points_each_compiler_under_it(dev):
    for spec in every_spec(dev):
        assert Mount("qwen35-compile-cache", COMPILE_CACHE, volume=True) in spec.mounts, spec.name
        for var in (
            "VLLM_CACHE_ROOT",
            "TORCHINDUCTOR_CACHE_DIR",
            "TRITON_CACHE_DIR",
            "FLASHINFER_WORKSPACE_BASE",
        ):
            assert spec.env[var].startswith(COMPILE_CACHE + "/"), (spec.name, var)
        # Each compiler its own directory: none reads another's files as its own.
        values = [spec.env[v] for v in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")]
        assert len(set(values)) == 3


def test_the_compile_cache_volume_carries_the_stack_s_prefix():
    blue = config_from(containers={"name_prefix": "blue"})
    for spec in every_spec(blue):
        assert Mount("blue-compile-cache", COMPILE_CACHE, volume=True) in spec.mounts


def test_compile_cache_off_leaves_no_mount_and_no_variable():
    off = config_from(containers={"compile_cache": False})
    for spec in every_spec(off):
        assert COMPILE_CACHE not in [m.target for m in spec.mounts]
        assert not {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"} & spec.env.keys()
        assert not any(k.startswith("FLASHINFER") for k in spec.env)
