"""The naive server to beat: Flask calling ``predict`` once per request, no batching.

Run under Gunicorn sync workers (``gunicorn bench.naive_app:app -k sync -w 2``) with
``NAIVE_MODEL_PATH`` set; the model loads at import in each worker.
"""

from __future__ import annotations

import os

import joblib
import numpy as np
from flask import Flask, jsonify, request

model = joblib.load(os.environ["NAIVE_MODEL_PATH"])
app = Flask(__name__)


@app.post("/predict")
def predict():  # type: ignore[no-untyped-def]
    instances = np.asarray(request.get_json()["instances"], dtype=np.float64)
    return jsonify({"predictions": model.predict(instances).tolist()})
