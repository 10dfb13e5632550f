"""KServe V2 ``parameters`` a request may carry, and the missing-value token they name.

The protocol leaves ``parameters`` open; this server reads these and refuses any other
name, so a misspelt one is a 400 naming it rather than a setting silently not taken:

- request: ``binary_data_output`` (read), ``null_value``; the names tritonclient reserves
  (``sequence_id``, ``sequence_start``, ``sequence_end``, ``priority``, ``timeout``,
  ``headers``) and ``content_type`` (KServe and MLServer codecs) are taken and ignored;
- input: ``binary_data_size`` (read), ``null_value``; ``content_type`` is taken and
  ignored; ``shared_memory_*`` is refused by ``codec`` (not supported).

``null_value`` (a string) names the element of a ``BYTES`` input that is a missing value,
as JSON ``null`` is: tritonclient writes ``None`` and NaN in an object array as the strings
``"None"`` and ``"nan"``, and cannot send ``null``. Set on the request
(``client.infer(..., parameters={"null_value": "None"})``) it applies to every ``BYTES``
input; an input's own ``parameters.null_value`` overrides it for that input. Numbers need
no token: NaN in a float tensor is a missing value, as ``null`` is.
"""

from __future__ import annotations

from serving.errors import InvalidInput
from serving.protocols.v2.schemas import V2InferRequest

__all__ = ["null_tokens"]

#: Request parameters taken: read by this server, or sent by clients and ignored.
REQUEST = frozenset(
    {
        "binary_data_output", "null_value", "content_type", "sequence_id", "sequence_start",
        "sequence_end", "priority", "timeout", "headers",
    }
)  # fmt: skip
#: Input parameters taken (``shared_memory_*``: refused by ``codec`` as not supported).
INPUT = frozenset({"binary_data_size", "null_value", "content_type"})


def _refuse_unknown(given: object, known: frozenset[str], loc: str, what: str) -> None:
    """:raises InvalidInput: at ``loc.<name>`` for the first parameter of ``given`` (a
    parsed ``parameters``, or None) not in ``known`` (``shared_memory_*``: ``codec``'s),
    the message ``"<what> '<name>' (taken: ...)"``."""
    names = list(getattr(given, "model_extra", None) or {})
    unknown = next(
        (n for n in names if n not in known and not n.startswith("shared_memory_")), None
    )
    if unknown is not None:
        msg = f"{what} {unknown[:64]!r} (taken: {', '.join(sorted(known))})"
        raise InvalidInput.at(f"{loc}.{unknown[:64]}", msg, "parameter")


def null_tokens(body: V2InferRequest) -> list[str | None]:
    """Per input, in request order, the string its ``BYTES`` elements equal when missing
    (None: no token; a non-``BYTES`` input's is None).

    :raises InvalidInput: naming the input (``inputs[1].parameters.nul_value``) or the
        request's parameter: a name not taken (the message lists those taken), or
        ``null_value`` on an input that is not ``BYTES`` (NaN or ``null`` is its missing
        value). A ``null_value`` that is not a string is refused by the schema.
    """
    request = body.parameters
    _refuse_unknown(request, REQUEST, "parameters", "unknown request parameter")
    default = request.null_value if request else None
    tokens: list[str | None] = []
    for index, tensor in enumerate(body.inputs):
        given = tensor.parameters
        loc = f"inputs[{index}].parameters"
        _refuse_unknown(given, INPUT, loc, f"input {tensor.name!r}: unknown parameter")
        own = given.null_value if given else None
        if own is not None and tensor.datatype != "BYTES":
            msg = (
                f"input {tensor.name!r}: null_value applies to BYTES inputs; a missing "
                f"{tensor.datatype} value is NaN (float datatypes) or JSON null"
            )
            raise InvalidInput.at(f"{loc}.null_value", msg, "parameter")
        tokens.append((own if own is not None else default) if tensor.datatype == "BYTES" else None)
    return tokens
