"""What an MLflow folder's ``MLmodel`` file says about the answer: the pyfunc flavour's
``predict_fn`` (``mlflow.sklearn.save_model(..., pyfunc_predict_fn=...)``), the method
``mlflow.pyfunc.load_model(path).predict`` and ``mlflow models serve`` call.

Boundary: standard library; PyYAML is imported only when an ``MLmodel`` file is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = ["PyfuncOutput", "pyfunc_output"]

#: The output of ``ModelHandle.predict_batch`` that ``/invocations`` answers.
PyfuncOutput = Literal["predictions", "probabilities"]

#: The ``predict_fn`` values served, and the output each is.
_OUTPUTS: dict[str, PyfuncOutput] = {"predict": "predictions", "predict_proba": "probabilities"}


def pyfunc_output(model_path: Path) -> PyfuncOutput:
    """The output ``mlflow.pyfunc`` answers for the model at ``model_path``: its
    ``predict_fn`` in the ``MLmodel`` file beside it (``predict`` when there is no such
    file, or it names none).

    :raises ValueError: when the file is not readable YAML, is a link out of the model's
        folder (as ``serving.model.schema`` refuses one), or names a ``predict_fn`` not
        served (``predict_log_proba``, ``score``, ...), naming it.
    """
    path = model_path.with_name("MLmodel")
    if not path.is_file():
        return "predictions"
    if not path.resolve().is_relative_to(path.parent.resolve()):
        raise ValueError("MLmodel is a link out of the model's folder: copy the file in")
    import yaml

    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise ValueError("MLmodel is not valid YAML") from None
    flavors = document.get("flavors") if isinstance(document, dict) else None
    pyfunc = flavors.get("python_function") if isinstance(flavors, dict) else None
    predict_fn = pyfunc.get("predict_fn", "predict") if isinstance(pyfunc, dict) else "predict"
    output = _OUTPUTS.get(predict_fn) if isinstance(predict_fn, str) else None
    if output is None:
        served = ", ".join(_OUTPUTS)
        raise ValueError(
            f"MLmodel's predict_fn {str(predict_fn)[:64]!r} is not served ({served} are)"
        )
    return output
