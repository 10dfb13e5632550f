"""Thin Flask blueprints: parse with ``serving.schemas``, call the runtime, answer JSON.

Each module declares one module-level ``bp``; ``serving.app.create_app`` registers them.
Shared request helpers live in ``serving.api.common``.
"""
