"""KServe V2 (Open Inference Protocol) over REST: ``routes``, ``codec``, ``schemas``."""

from serving.protocols.v2.routes import PROTOCOL as PROTOCOL

__all__ = ["PROTOCOL"]
