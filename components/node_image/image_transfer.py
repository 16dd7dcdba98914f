"""The pure parts of copying an image between nodes: layer identity, and the layer filter's argv.

The filter itself is a node program (`components/node_programs/layer_filter.py` with its library
`layer_export.py`, run on the source inside the transfer's pipeline); its functions are re-exported
here for the orchestrator and tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from components.image_ref import familiar_reference, full_reference  # noqa: F401  (re-exported)
from components.image_ref import split_tagged as split_reference  # noqa: F401  (re-exported)
from components.node_programs import program_argv
from components.node_programs.layer_export import (  # noqa: F401  (re-exported)
    ExportUnavailable,
    StreamCounter,
    export_plan,
    export_stream,
    layer_tar_size,
    regular_file_header,
    tar_split_entries,
    write_layer_tar,
)
from components.node_programs.layer_filter import Exit as FilterExit  # noqa: F401
from components.node_programs.layer_filter import (  # noqa: F401  (re-exported)
    filter_stream,
    legacy_layer_depth,
    pax_records,
    retag_metadata,
    split_json_object,
    tar_header_fields,
)
from components.node_programs.wire import REPORT_MARKER as REPORT  # noqa: F401  (re-exported)
from components.node_programs.wire import chain_ids


def present_chains(images_layers: Iterable[Sequence[str]]) -> set[str]:
    """Every chain ID a classic daemon holds, from the layer lists of all its images."""
    found: set[str] = set()
    for layers in images_layers:
        found.update(chain_ids(list(layers)))
    return found


def present_prefix(layers: Sequence[str], chains_on_destination: set[str]) -> int:
    """How many bottom layers the destination already has as a chain (docker load skips those)."""
    count = 0
    for index, chain in enumerate(chain_ids(layers)):
        if chain not in chains_on_destination:
            break
        count = index + 1
    return count


def filter_spec(
    layers: Sequence[str],
    keep_from: int,
    new_tag: str,
    compress: str = "none",
    export: dict | None = None,
    leave_out: Sequence[str] = (),
) -> dict:
    """What the filter needs to know; plain JSON."""
    if compress not in ("none", "gzip"):
        raise ValueError(f"compression {compress!r}: use 'none' or 'gzip'")
    return {
        "layers": list(layers),
        "keep_from": keep_from,
        "leave_out": list(leave_out),
        "new_tag": new_tag,
        "compress": compress,
        "export": export,
    }


def filter_argv(spec: dict, python: str = "python3") -> list[str]:
    """The filter as run on the source: the program travels in the command itself."""
    return program_argv("layer_filter", [json.dumps(spec, separators=(",", ":"), sort_keys=True)], python)
