"""MLflow / SageMaker scoring (``/invocations``, ``/ping``): ``routes``, ``codec``, ``schemas``."""

from serving.protocols.mlflow.routes import PROTOCOL as PROTOCOL

__all__ = ["PROTOCOL"]
