"""Every error this program raises for an operator shares one root, and keeps its old base."""

from __future__ import annotations

import pytest

from components.checkpoint.plan import CheckpointError
from components.config import ConfigError
from components.errors import Qwen35Error
from components.image_ref import ImageRefError
from components.memory_fit import MemoryFitError
from components.model_support import ModelSupportError
from components.node_image.errors import ExportFailed, NodeImageError
from components.readiness_gate import GateFailed
from components.remote import RemoteError
from components.serve_args import ServeArgsError
from components.transfer.endpoints import EndpointError
from components.transfer.peer import PeerUnreachable
from components.transfer.tuning import TuningError
from lab.layout import LabError


@pytest.mark.parametrize(
    ("error", "base"),
    [
        (CheckpointError, RuntimeError),
        (ConfigError, ValueError),
        (EndpointError, ValueError),
        (ExportFailed, RuntimeError),
        (GateFailed, RuntimeError),
        (ImageRefError, ValueError),
        (LabError, RuntimeError),
        (MemoryFitError, ValueError),
        (ModelSupportError, RuntimeError),
        (NodeImageError, RuntimeError),
        (PeerUnreachable, RuntimeError),
        (RemoteError, RuntimeError),
        (ServeArgsError, RuntimeError),
        (TuningError, ValueError),
    ],
)
def test_each_error_has_the_one_root_and_its_old_base(error, base):
    assert issubclass(error, Qwen35Error) and issubclass(error, base)


def test_a_caught_root_keeps_the_message():
    with pytest.raises(Qwen35Error, match="could not be reached over SSH"):
        raise RemoteError("spark-2", ["true"], 255, b"")
