"""One package per wire protocol, each readable alone: ``routes.py`` (thin Flask views:
read body -> ``codec.decode`` -> ``DataPlane.infer`` -> ``codec.encode`` -> response),
``codec.py`` (its bodies to and from ``serving.inputs.instances`` and model outputs) and
``schemas.py`` (its pydantic bodies). ``base`` holds what they share; ``probes`` the
service's health, metrics and OpenAPI routes. ``serving.app.create_app`` wires them.
"""
