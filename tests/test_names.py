"""serving.model.names: a model's name and version as URLs carry them, and a list of
models' names, versions and labels."""

from __future__ import annotations

import re

import pytest

from serving.model import names


@pytest.mark.parametrize(
    ("value", "dots"), [(".", True), ("...", True), ("", False), ("a.", False)]
)
def test_names_only_dots_is_a_path_step_not_an_empty_name(value: str, dots: bool) -> None:
    assert names.only_dots(value) is dots


@pytest.mark.parametrize("version", ["a:predict", "2024:classify", "x:y:regress"])
def test_names_a_version_ending_in_a_tf_serving_method_is_refused(version: str) -> None:
    assert re.fullmatch(names.VERSION_PATTERN, version)  # the pattern alone allows it

    with pytest.raises(ValueError, match="a TF Serving method"):
        names.no_tf_verb(version)


@pytest.mark.parametrize("version", ["2024:06", "predict", "a:predicts", "1"])
def test_names_other_versions_pass(version: str) -> None:
    assert names.no_tf_verb(version) == version


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([], "empty list"),
        ([("a", "1", {}), ("a", "1", {})], "lists model 'a' version '1' twice"),
        ([("a", "1", {"stable": "2"})], "label 'stable' names version '2', which is not listed"),
        (
            [("a", "1", {"stable": "1"}), ("a", "2", {"stable": "2"})],
            "label 'stable' names two versions",
        ),
        ([("a", str(v), {}) for v in range(3)], "more than SERVING_MAX_MODELS=2"),
    ],
)
def test_names_a_list_of_models_is_checked_naming_the_fault(entries: list, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        names.check_listing(entries, limit=2)


def test_names_a_good_list_passes() -> None:
    names.check_listing([("a", "1", {"stable": "1"}), ("a", "2", {}), ("b", "1", {})], limit=8)
