"""What the test tiers share, each once. A fixture or helper two test modules need lives here.

program.py          the real `__main__.py` under Pulumi's mock runtime, what it registers
registrations.py    every stack variant's registrations as one JSON document (the refactor check)
provider_host.py    dynamic resources driven as the engine drives them, without the CLI
ledger_provider.py  a small provider that tests that host
declared.py         declared container inputs as the `docker run` that starts the same container
hub_fixture.py      the stand-in Hub serving a generated repo, as a fixture (every tier)
standin_openai.py   a stand-in OpenAI-compatible server, for readiness tests
lab_nodes.py        the lab session's nodes; a node's input dict, image tags and containers
node_image_lab.py   NodeImage's lab helpers: props, small images built on a node
health_lab.py       the health programs in the lab (tests/lab and bench)
fabric_trees.py     sysfs trees modelled on a Spark's RoCE functions (FabricCheck)
ports.py            a TCP port nothing listens on
patch_modules.py    the standalone scripts under patches/ loaded as modules
vllm_trees.py       real vLLM release trees from PyPI, cached outside git
"""
