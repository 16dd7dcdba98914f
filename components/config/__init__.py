"""Typed, validated stack configuration: the program's interface to operators.

Stack config (Pulumi.<stack>.yaml) → frozen pydantic models → components. Components never read
`pulumi.Config`; `load_stack_config` is the one place that does, and a bad config becomes one
`ConfigError` naming every bad field by path, before any resource is registered.

- `fields`: the base model, field types, name patterns and one-field checks the sections share;
- `nodes` (`nodes`, `ssh`), `image` (`image`, `copy`), `serve`, `checkpoint` (`model`),
  `cluster` (`fabric`, `ray`, `cluster`, `containers`), `health`, `bench`, `answers`: the section
  models;
- `stack`: StackConfig; `cross_checks`: the checks across its sections;
- `loading`: reading Pulumi's config, and pydantic's errors as the operator's messages.
"""

from components.config.answers import AnswersConfig
from components.config.bench import BenchConfig
from components.config.checkpoint import ModelConfig
from components.config.cluster import (
    DEFAULT_MASTER_PORT,
    LEGACY_IB_HCA,
    ClusterConfig,
    ContainerConfig,
    Executor,
    FabricConfig,
    RayConfig,
    RestartPolicy,
)
from components.config.fields import IMAGE_STORES, PROJECT_DIR, CheckMode
from components.config.health import HealthConfig
from components.config.image import CopyConfig, ExpectedRefusals, ImageConfig, ImageStrategy, ModelCheckMode
from components.config.loading import (
    NAMESPACE,
    ConfigError,
    load_secrets,
    load_stack_config,
    parse_stack_config,
)
from components.config.nodes import (
    GB10_MEMORY_GB,
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_LISTEN_PORT,
    NodeConfig,
    RayPorts,
    Role,
    SshConfig,
)
from components.config.serve import ServeConfig, SpeculativeConfig
from components.config.stack import StackConfig

__all__ = [
    "DEFAULT_MASTER_PORT",
    "GB10_MEMORY_GB",
    "IMAGE_STORES",
    "LEGACY_IB_HCA",
    "NAMESPACE",
    "PROJECT_DIR",
    "RAY_CLIENT_SERVER_PORT",
    "RAY_DASHBOARD_AGENT_LISTEN_PORT",
    "AnswersConfig",
    "CheckMode",
    "BenchConfig",
    "ClusterConfig",
    "ConfigError",
    "ContainerConfig",
    "CopyConfig",
    "Executor",
    "ExpectedRefusals",
    "FabricConfig",
    "HealthConfig",
    "ImageConfig",
    "ImageStrategy",
    "ModelCheckMode",
    "ModelConfig",
    "NodeConfig",
    "RayConfig",
    "RayPorts",
    "RestartPolicy",
    "Role",
    "ServeConfig",
    "SpeculativeConfig",
    "SshConfig",
    "StackConfig",
    "load_secrets",
    "load_stack_config",
    "parse_stack_config",
]
