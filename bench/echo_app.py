"""The framework's own ceiling: Flask on the same Gunicorn config (gthread, same workers and
threads) parsing the same JSON body and answering a constant prediction, no model.

    gunicorn bench.echo_app:app -k gthread -w 2 --threads 64
"""

from __future__ import annotations

from flask import Flask, jsonify, request

app = Flask(__name__)


@app.post("/predict")
def predict():  # type: ignore[no-untyped-def]
    instances = request.get_json()["instances"]
    return jsonify({"predictions": [0] * len(instances)})
