"""Instances and their checks against a model: ``instances``, ``conform``, ``values``,
``cells``, ``rules`` (see README.md)."""
