"""How strictly a request's columns are taken: names the model does not have (refused, or
ignored as scikit-learn in-process and MLflow's scoring server ignore them), and numbers
sent as strings (``"12"``: refused, or converted by the model's schema as MLflow does).

``Rules`` is chosen per request: ``SERVING_EXTRA_COLUMNS`` for ``/predict``, KServe V2 and
TF Serving; MLflow's own rules for ``/invocations`` (``MLFLOW``). ``conform`` applies them.

Boundary: standard library and ``serving`` core modules (no Flask, no pydantic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from serving.errors import InvalidInput
from serving.inputs.cells import from_text
from serving.inputs.values import Locate, show
from serving.model.schema import Feature

#: Most characters of a client's name put in an error's location.
_NAME_CHARS = 64
#: Most names a message lists (missing features, unknown keys), then a count.
_LISTED = 5

__all__ = ["MLFLOW", "STRICT", "Rules", "check_names", "numbers_from_strings"]


@dataclass(frozen=True, slots=True)
class Rules:
    """How a request's columns are taken.

    :param extra: ``refuse`` (422 naming it) or ``ignore`` a column, key or input the
        model does not have; only for a model that knows its feature names.
    :param numbers_from_strings: a number or boolean feature takes a string that spells
        one (``"12"``, ``"0.5"``, ``"true"``; ASCII digits only), as MLflow converts a
        DataFrame's columns by its signature.
    :param on_ignored: called with each name ignored (the data plane logs it once).
    """

    extra: Literal["refuse", "ignore"] = "refuse"
    numbers_from_strings: bool = False
    on_ignored: Callable[[str], None] | None = None


STRICT = Rules()
#: ``mlflow models serve``: columns its signature does not name are dropped, and
#: columns are converted to the signature's types.
MLFLOW = Rules(extra="ignore", numbers_from_strings=True)


def _listed(names: Sequence[str]) -> str:
    """The first ``_LISTED`` of ``names``, each cut as a value is, and how many more."""
    more = f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else ""
    return ", ".join(map(show, names[:_LISTED])) + more


def check_names(
    keys: Sequence[str], names: Sequence[str], loc: str, what: str, rules: Rules = STRICT
) -> list[str]:
    """``keys`` as the model takes them: every one of ``names``, none twice, and none else
    (``rules.extra == "refuse"``) or others ignored (``"ignore"``; each reported to
    ``rules.on_ignored``). Returns the keys kept, in their order.

    :raises InvalidInput: (422) naming the first of ``names`` missing from ``keys`` (and the
        keys given that are none of ``names``: likely the same column misspelt), else the
        first unknown key (refused), else a key given twice.
    """
    known = set(names)
    unknown = [key for key in keys if key not in known]
    missing = [name for name in names if name not in keys]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        given = f"; given but unknown: {_listed(unknown)}" if unknown else ""
        msg = f"missing {what}{plural} {_listed(missing)}{given}"
        raise InvalidInput.at(loc, msg, f"missing_{what}")
    if unknown and rules.extra == "refuse":
        # a client's name is cut, as a value is: a 2 MB key made an 8 MB error body
        msg = f"unknown {what} {show(unknown[0])}; the model's {what}s are {', '.join(names)}"
        raise InvalidInput.at(f"{loc}.{unknown[0][:_NAME_CHARS]}", msg, f"unknown_{what}")
    if unknown and rules.on_ignored is not None:
        for key in unknown:
            rules.on_ignored(key)
    kept = [key for key in keys if key in known] if unknown else list(keys)
    if len(kept) != len(set(kept)):
        twice = next(key for i, key in enumerate(kept) if key in kept[:i])
        raise InvalidInput.at(loc, f"{what} {show(twice)} is given twice", f"duplicate_{what}")
    return kept


def numbers_from_strings(
    rows: Sequence[Sequence[Any]], features: Sequence[Feature], loc: Locate
) -> Sequence[Sequence[Any]]:
    """``rows`` (model order) with each string in a number or boolean feature read as the
    value it spells (``serving.inputs.cells.from_text``); rows without such strings as they are.

    :raises InvalidInput: (422) naming a string spelling a number no type holds.
    """
    typed = [j for j, f in enumerate(features) if f.kind in ("float", "integer", "boolean")]
    if not any(type(row[j]) is str for row in rows for j in typed):
        return rows
    out = []
    for i, row in enumerate(rows):
        values = list(row)
        for j in typed:
            if type(values[j]) is str:
                try:
                    values[j] = from_text(values[j], features[j])
                except ValueError as exc:
                    raise InvalidInput.at(loc(i, j), str(exc), "out_of_range") from None
        out.append(values)
    return out
