"""What can go wrong with a NodeImage, as exception types."""

from __future__ import annotations

from components.errors import Qwen35Error


class NodeImageError(Qwen35Error, RuntimeError):
    """A copy could not be made or verified; the message names the node and what to do next."""


class ExportFailed(NodeImageError):
    """Reading layers from the source's store failed (not the link): `docker save` may still work."""


class Mismatch(Exception):
    """The loaded image is not the wanted one (`loaded`: an ImageInfo)."""

    def __init__(self, loaded):
        super().__init__(loaded.image_id)
        self.loaded = loaded
