"""Named features on ``/predict``: instances as objects keyed by the feature names of a
model trained on a pandas DataFrame, reordered to the model's order."""

from __future__ import annotations

from typing import Any

import pandas as pd
from flask import Flask
from flask.testing import FlaskClient

from serving.protocols.schemas import ErrorResponse

Frame = tuple[Any, pd.DataFrame]


def test_predict_named_instances_are_reordered_to_the_models_features(
    named_app: Flask, frame_classifier: Frame
) -> None:
    model, X = frame_classifier
    rows = X.iloc[:8]
    shuffled = rows[list(reversed(X.columns))].to_dict("records")
    client = named_app.test_client()

    named = client.post("/predict", json={"instances": shuffled})
    positional = client.post("/predict", json={"instances": rows.values.tolist()})

    assert named.status_code == 200, named.get_data(as_text=True)
    assert named.get_json()["predictions"] == model.predict(rows).tolist()
    assert named.get_json()["probabilities"] == positional.get_json()["probabilities"]


def test_predict_missing_or_unknown_feature_is_422_naming_it(
    named_app: Flask, frame_classifier: Frame
) -> None:
    _, X = frame_classifier
    record = X.iloc[0].to_dict()
    client = named_app.test_client()

    missing = client.post("/predict", json={"instances": [record, {**record, "mean area": None}]})
    dropped = {k: v for k, v in record.items() if k != "mean area"}
    absent = client.post("/predict", json={"instances": [record, dropped]})
    unknown = client.post("/predict", json={"instances": [{**record, "mean colour": 1.0}]})

    assert missing.status_code == 422  # null is not a number
    assert absent.status_code == unknown.status_code == 422
    absent_error = ErrorResponse.model_validate(absent.get_json()).error
    assert absent_error.message == "instances[1]: missing feature 'mean area'"
    assert absent_error.details[0]["loc"] == "instances[1]"
    unknown_error = ErrorResponse.model_validate(unknown.get_json()).error
    assert unknown_error.details[0]["loc"] == "instances[0].mean colour"
    assert "unknown feature 'mean colour'" in unknown_error.message


def test_predict_objects_for_a_model_without_feature_names_are_422(client: FlaskClient) -> None:
    response = client.post("/predict", json={"instances": [{"a": 1, "b": 2, "c": 3}]})

    assert response.status_code == 422
    assert "does not know its feature names" in response.get_json()["error"]["message"]
