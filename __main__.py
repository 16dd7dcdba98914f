"""qwen35-spark: read validated stack config, build the deployment, export its outputs."""

import pulumi

from components.config import load_secrets, load_stack_config
from components.deployment.component import DeploymentArgs, Qwen35Deployment

config = load_stack_config()
secrets = load_secrets()
deployment = Qwen35Deployment(
    "qwen35",
    DeploymentArgs(config=config, hf_token=secrets["hf_token"], api_key=secrets["api_key"]),
)
for key, value in deployment.outputs.items():
    pulumi.export(key, value)
