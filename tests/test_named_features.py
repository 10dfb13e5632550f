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


def test_predict_a_list_among_objects_is_422_naming_the_list_not_the_first_object(
    named_app: Flask, frame_classifier: Frame
) -> None:
    """Found by a new user's trial: ``[{...}, {...}, [...]]`` was refused as
    ``instances[0]: Input should be a valid array``: the first object, read as a list."""
    _, X = frame_classifier
    records = X.iloc[:2].to_dict("records")
    mixed = [*records, X.iloc[2].tolist()]
    rows = [*X.iloc[:2].values.tolist(), X.iloc[2].to_dict()]

    as_objects = named_app.test_client().post("/predict", json={"instances": mixed})
    as_lists = named_app.test_client().post("/predict", json={"instances": rows})

    assert as_objects.status_code == as_lists.status_code == 422
    assert as_objects.get_json()["error"]["details"][0]["loc"] == "instances[2]"
    assert as_objects.get_json()["error"]["message"].startswith("instances[2]: ")
    assert as_lists.get_json()["error"]["details"][0]["loc"] == "instances[2]"


def test_predict_objects_for_a_model_without_feature_names_are_422(client: FlaskClient) -> None:
    response = client.post("/predict", json={"instances": [{"a": 1, "b": 2, "c": 3}]})

    assert response.status_code == 422
    assert "does not know its feature names" in response.get_json()["error"]["message"]


def test_a_missing_category_is_answered_alike_alone_or_in_a_batch(
    settings: Any, metrics: Any
) -> None:
    """Found by the new-user trial: a null in a string column was None in a column of its
    own (a lone request: object dtype) but NaN in a column holding strings (a batch:
    pandas 3's str dtype), and scikit-learn takes None for an unknown category, NaN for
    a missing value. The same request got 0.6985 alone and 0.9994 beside another."""
    import numpy as np
    from sklearn.compose import make_column_transformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    from serving.app import create_app
    from serving.model.loaders import estimator_handle

    rng = np.random.default_rng(5)
    home = rng.choice(["own", "rent", "mortgage"], 400).astype(object)
    home[rng.random(400) < 0.15] = np.nan  # missing, learned as a category of its own
    frame = pd.DataFrame({"income": rng.normal(50, 15, 400), "home": home})
    target = np.where(frame["home"].isna(), 1, (frame["income"] > 50).astype(int))
    encode = make_column_transformer(
        ("passthrough", ["income"]),
        (OneHotEncoder(handle_unknown="ignore", sparse_output=False), ["home"]),
    )
    model = make_pipeline(encode, HistGradientBoostingClassifier(random_state=0))
    model.fit(frame, target)
    handle = estimator_handle(model, name="credit", version="1", format="pickle")
    app = create_app(settings, models=[handle], metrics=metrics)
    try:
        client = app.test_client()
        lone = {"income": 41.5, "home": None}
        other = {"income": 60.0, "home": "rent"}
        alone = client.post("/predict", json={"instances": [lone]}).get_json()
        beside = client.post("/predict", json={"instances": [lone, other]}).get_json()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    # in-process, missing is NaN, as pandas reads it (and as the model was fitted)
    row = pd.DataFrame({"income": [41.5], "home": [np.nan]}).astype(frame.dtypes.to_dict())
    expected = model.predict_proba(row)
    assert alone["probabilities"][0] == beside["probabilities"][0] == expected[0].tolist()
    assert alone["predictions"][0] == beside["predictions"][0] == 1


def test_a_missing_category_reaches_an_encoder_fitted_on_none_as_none(
    settings: Any, metrics: Any
) -> None:
    """Found by the new-user trial: a OneHotEncoder fitted on an object column holding
    None (categories ['sedan', 'suv', 'truck', None]) was sent NaN for a null, an unknown
    category to it: 500 'Found unknown categories [nan]', for the valid rows of the same
    request too. In-process the model takes None, as it was fitted."""
    import numpy as np
    from sklearn.compose import make_column_transformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    from serving.app import create_app
    from serving.model.loaders import estimator_handle

    rng = np.random.default_rng(7)
    vehicle = rng.choice(np.array(["sedan", "suv", "truck", None], dtype=object), 300)
    frame = pd.DataFrame(
        {"vehicle": pd.Series(vehicle, dtype=object), "amount": rng.normal(5, 2, 300)}
    )
    target = (frame["amount"] > 5).astype(int) ^ frame["vehicle"].isna().astype(int)
    encode = make_column_transformer(
        (OneHotEncoder(sparse_output=False), ["vehicle"]), ("passthrough", ["amount"])
    )
    model = make_pipeline(encode, LogisticRegression()).fit(frame, target)
    assert None in model[0].named_transformers_["onehotencoder"].categories_[0].tolist()
    handle = estimator_handle(model, name="claims", version="1", format="pickle")
    app = create_app(settings, models=[handle], metrics=metrics)
    try:
        client = app.test_client()
        lone = {"vehicle": None, "amount": 3.0}
        other = {"vehicle": "suv", "amount": 7.0}
        alone = client.post("/predict", json={"instances": [lone]})
        beside = client.post("/predict", json={"instances": [lone, other]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert alone.status_code == beside.status_code == 200, beside.get_data(as_text=True)
    rows = pd.DataFrame({"vehicle": pd.Series([None, "suv"], dtype=object), "amount": [3.0, 7.0]})
    expected = model.predict_proba(rows).tolist()
    assert alone.get_json()["probabilities"] == expected[:1]
    assert beside.get_json()["probabilities"] == expected


def test_boolean_and_integer_columns_of_a_dataframe_model_take_json_true_and_false(
    settings: Any, metrics: Any
) -> None:
    """Found by the new-user trial: a pipeline fitted on a DataFrame with a bool column
    (scaled, and one-hot encoded) refused ``"homeowner": true`` with 422 'true is not a
    number' on every JSON protocol: scikit-learn keeps no column types, so the feature
    was guessed float, and a bool column one-hot encoded was guessed integer. In-process
    the model takes True/False (scikit-learn casts them to 1.0/0.0 itself)."""
    import numpy as np
    from sklearn.compose import make_column_transformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from serving.app import create_app
    from serving.model.loaders import estimator_handle

    rng = np.random.default_rng(7)
    frame = pd.DataFrame({
        "income": rng.normal(50, 15, 300),
        "homeowner": rng.random(300) < 0.4,
        "married": rng.random(300) < 0.5,
        "n_late": rng.integers(0, 5, 300),
    })  # fmt: skip
    target = (frame["income"] / 50 + frame["homeowner"] - frame["n_late"] / 4 > 1).astype(int)
    encode = make_column_transformer(
        (StandardScaler(), ["income", "homeowner", "n_late"]),
        (OneHotEncoder(sparse_output=False), ["married"]),
    )
    model = make_pipeline(encode, LogisticRegression()).fit(frame, target)
    handle = estimator_handle(model, name="loan", version="1", format="pickle")
    app = create_app(settings, models=[handle], metrics=metrics)
    rows = frame.iloc[:6]
    records = rows.astype(object).to_dict("records")  # Python bool, int and float
    try:
        client = app.test_client()
        answer = client.post("/predict", json={"instances": records})
        wrong = client.post("/predict", json={"instances": [{**records[0], "married": 1}]})
        csv = client.post("/invocations", data=rows.to_csv(index=False),
                          content_type="text/csv")  # fmt: skip
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["probabilities"] == model.predict_proba(rows).tolist()
    assert csv.status_code == 200, csv.get_data(as_text=True)  # pandas writes True/False
    assert csv.get_json()["predictions"] == model.predict(rows).tolist()
    assert wrong.status_code == 422  # the encoder knows True and False only
    assert "instances[0].married" in wrong.get_data(as_text=True)
