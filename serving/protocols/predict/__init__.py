"""``POST /predict``: the service's own protocol (``routes``, ``codec``, ``schemas``)."""

from serving.protocols.predict.routes import PROTOCOL as PROTOCOL

__all__ = ["PROTOCOL"]
