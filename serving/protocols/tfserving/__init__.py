"""TF Serving's REST API (predict, model status, metadata): ``routes``, ``codec``, ``schemas``."""

from serving.protocols.tfserving.routes import PROTOCOL as PROTOCOL

__all__ = ["PROTOCOL"]
