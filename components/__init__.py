"""qwen35-spark components: typed config, node transport, images, the Ray/vLLM cluster."""
