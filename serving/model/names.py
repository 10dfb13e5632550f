"""A model's name and version as URLs, metric labels and file names carry them: the
patterns, the checks a pattern cannot make (only dots; a TF Serving method at the end
of a version), and a list of models' (each name and version once, labels naming listed
versions). Plain functions raising ``ValueError``, for the settings' validators.

Boundary: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

__all__ = [
    "NAME_PATTERN",
    "TF_VERBS",
    "VERSION_PATTERN",
    "check_listing",
    "no_tf_verb",
    "not_only_dots",
    "only_dots",
]

#: A model's name and version, as URLs, metric labels and file names carry them.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
VERSION_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


def only_dots(value: str) -> bool:
    """Whether ``value`` is a path step, not a name: a client's URL library removes ``.``
    and ``..`` (RFC 3986 section 5.2.4), so ``/predict/..`` would reach ``/``."""
    return bool(value) and not value.strip(".")


def not_only_dots(value: str) -> str:
    """``value``, unless ``only_dots``.

    :raises ValueError: naming it.
    """
    if only_dots(value):
        raise ValueError(f"{value!r} is made of only dots, a path step in a URL, not a name")
    return value


#: TF Serving's methods, which its URLs put after a ``:``.
TF_VERBS: Final = frozenset({"predict", "classify", "regress"})


def no_tf_verb(value: str) -> str:
    """``value``, a version, unless it ends in ``:predict`` (or ``:classify``,
    ``:regress``): TF Serving's ``/versions/<x>:predict`` and ``GET /versions/<x>:predict``
    would be one URL.

    :raises ValueError: naming the method.
    """
    _, colon, verb = value.rpartition(":")
    if colon and verb in TF_VERBS:
        raise ValueError(f"{value!r} ends in ':{verb}', a TF Serving method in a URL")
    return value


def check_listing(entries: Sequence[tuple[str, str, Mapping[str, str]]], limit: int) -> None:
    """A list of models' ``(name, version, labels)``: at least one, at most ``limit``
    (``SERVING_MAX_MODELS``), each name and version once, and each TF Serving label of a
    name naming one version of it that is listed.

    :raises ValueError: naming the model, version or label.
    """
    if not entries:
        raise ValueError("is an empty list")
    if len(entries) > limit:
        raise ValueError(f"lists {len(entries)} models, more than SERVING_MAX_MODELS={limit}")
    seen = set()
    for name, version, _ in entries:
        if (name, version) in seen:
            raise ValueError(f"lists model {name!r} version {version!r} twice")
        seen.add((name, version))
    labels: dict[tuple[str, str], str] = {}
    for name, _, named in entries:
        for label, version in named.items():
            if (name, version) not in seen:
                raise ValueError(
                    f"model {name!r}: label {label!r} names version {version!r}, which is "
                    "not listed"
                )
            if labels.setdefault((name, label), version) != version:
                raise ValueError(f"model {name!r}: label {label!r} names two versions")
