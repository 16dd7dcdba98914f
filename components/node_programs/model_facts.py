"""Runs ON a node (stdlib only): what the model-support check's memory-fit preflight reads of a snapshot.

    python3 - SNAPSHOT_DIR        (this file on stdin)

Prints one JSON object on stdout: the weight bytes (the safetensors index's `metadata.total_size`,
else the sum of the `*.safetensors` shard sizes, symlinks followed), where that figure came from,
the layer count, architecture and the whole `config.json` (the KV-cache sizing reads it), and the
bytes of the MTP head's and the vision encoder's tensors, read from the safetensors headers of the
shards that hold them (the serving options decide whether vLLM loads those). Exit 0 with a report,
2 on a usage error.
"""

from __future__ import annotations

import json
import os
import struct
import sys

INDEX = "model.safetensors.index.json"
# Tensor name prefixes of the parts a serving option leaves out (Qwen3.5's FP8 release names).
PARTS = {"mtp": ("mtp.",), "vision": ("model.visual.", "visual.")}
# A safetensors header is a JSON object after its 8-byte length; refuse absurd lengths.
MAX_HEADER = 100 * 1024 * 1024


def layer_count(config: dict) -> int | None:
    """`num_hidden_layers` of the text model (multimodal configs nest it in `text_config`)."""
    for section in (config.get("text_config") or {}, config):
        value = section.get("num_hidden_layers") if isinstance(section, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def weight_bytes(snapshot: str) -> tuple[int | None, str | None, int]:
    """(bytes, source, shards): the index's total_size when it has one, else the shard sizes."""
    names = sorted(n for n in os.listdir(snapshot) if n.endswith(".safetensors"))
    index_path = os.path.join(snapshot, INDEX)
    if os.path.exists(index_path):
        with open(index_path, encoding="utf-8") as handle:
            index = json.load(handle)
        total = (index.get("metadata") or {}).get("total_size")
        shards = len(set((index.get("weight_map") or {}).values())) or len(names)
        if isinstance(total, int) and total > 0:
            return total, "index", shards
    if not names:
        return None, None, 0
    return sum(os.stat(os.path.join(snapshot, n)).st_size for n in names), "shards", len(names)


def header(path: str) -> dict:
    """The safetensors header of one shard: tensor name -> {dtype, shape, data_offsets}."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > MAX_HEADER:
            raise ValueError(f"{os.path.basename(path)}: safetensors header of {length} bytes")
        return json.loads(handle.read(length))


def part_bytes(snapshot: str) -> dict:
    """Bytes of the tensors under each of PARTS' prefixes (only the shards holding them are read)."""
    index_path = os.path.join(snapshot, INDEX)
    if os.path.exists(index_path):
        with open(index_path, encoding="utf-8") as handle:
            weight_map = json.load(handle).get("weight_map") or {}
    else:
        weight_map = {}
        for name in sorted(n for n in os.listdir(snapshot) if n.endswith(".safetensors")):
            weight_map.update(dict.fromkeys(header(os.path.join(snapshot, name)), name))
    totals = {part: 0 for part in PARTS}
    counts = {part: 0 for part in PARTS}
    wanted: dict[str, list[tuple[str, str]]] = {}
    for tensor, shard in weight_map.items():
        for part, prefixes in PARTS.items():
            if tensor.startswith(prefixes):
                wanted.setdefault(shard, []).append((tensor, part))
                counts[part] += 1
    for shard, tensors in sorted(wanted.items()):
        entries = header(os.path.join(snapshot, shard))
        for tensor, part in tensors:
            offsets = (entries.get(tensor) or {}).get("data_offsets") or (0, 0)
            totals[part] += int(offsets[1]) - int(offsets[0])
    return {f"{part}_bytes": totals[part] for part in PARTS} | {
        f"{part}_tensors": counts[part] for part in PARTS
    }


def facts(snapshot: str) -> dict:
    report: dict = {"snapshot": snapshot, "exists": os.path.isdir(snapshot)}
    if not report["exists"]:
        report["error"] = f"{snapshot} is not a directory on this node"
        return report
    try:
        total, source, shards = weight_bytes(snapshot)
        report.update(weight_bytes=total, weight_source=source, shards=shards)
        config_path = os.path.join(snapshot, "config.json")
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as handle:
                config = json.load(handle)
            report.update(
                num_layers=layer_count(config),
                architectures=config.get("architectures") or [],
                model_type=config.get("model_type"),
                config=config,
            )
    except (OSError, ValueError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    try:
        report.update(part_bytes(snapshot))
    except (OSError, ValueError, KeyError, struct.error) as exc:
        # Unreadable headers only cost precision: the fit then counts every byte as loaded.
        report["parts_error"] = f"{type(exc).__name__}: {exc}"
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: model_facts.py SNAPSHOT_DIR", file=sys.stderr)
        return 2
    print(json.dumps(facts(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
