"""Tiny real models for tests. Importable by Gunicorn workers (``tests.models``), so they
can be pickled to a file and served end to end."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt


class RowEcho:
    """Predicts each row's first feature: a caller can check it got its own rows back.

    Records every batch size it saw (in-process tests only).
    """

    def __init__(self, n_features: int = 3, delay_s: float = 0.0) -> None:
        self.n_features_in_ = n_features
        self.delay_s = delay_s
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        with self._lock:
            self.batch_sizes.append(len(X))
        if self.delay_s:
            time.sleep(self.delay_s)
        return X[:, 0].copy()

    def __getstate__(self) -> dict[str, Any]:
        return {"n_features_in_": self.n_features_in_, "delay_s": self.delay_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["n_features_in_"], state["delay_s"])  # type: ignore[misc]


class SlowLoading(RowEcho):
    """A RowEcho whose unpickling takes ``load_s`` seconds (readiness tests)."""

    def __init__(self, n_features: int = 3, delay_s: float = 0.0, load_s: float = 2.0) -> None:
        super().__init__(n_features, delay_s)
        self.load_s = load_s

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "load_s": self.load_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        time.sleep(state["load_s"])
        self.__init__(state["n_features_in_"], state["delay_s"], state["load_s"])  # type: ignore[misc]


class Ballast(RowEcho):
    """A RowEcho carrying ``mib`` MiB of float64 ones (memory measurement tests): its
    unpickled array is that much resident memory."""

    def __init__(self, n_features: int = 3, mib: int = 48) -> None:
        super().__init__(n_features)
        self.ballast = np.ones(mib * 2**20 // 8)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "ballast": self.ballast}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__init__(state["n_features_in_"], state["delay_s"])
        self.ballast = state["ballast"]


class FailsOnNegative(RowEcho):
    """A RowEcho that raises when any row's first feature is negative (and never on warmup)."""

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if (X[:, 0] < 0).any():
            raise ValueError("negative first feature")
        return super().predict(X)


class WrongLength(RowEcho):
    """Returns one prediction too few when the batch has more than one row."""

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        out = super().predict(X)
        return out[:-1] if len(out) > 1 else out


def echo(X: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Plain function: first feature per row."""
    return np.asarray(X[:, 0])


class HangsOn42(RowEcho):
    """A RowEcho whose predict hangs (60 s) when a row's first feature is 42."""

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if (X[:, 0] == 42).any():
            time.sleep(60)
        return super().predict(X)


class RowOffset(RowEcho):
    """Predicts each row's first feature plus ``offset``: tells two model versions apart."""

    def __init__(self, n_features: int = 1, offset: float = 0.0) -> None:
        super().__init__(n_features)
        self.offset = offset

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return super().predict(X) + self.offset

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "offset": self.offset}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["n_features_in_"], state["offset"])  # type: ignore[misc]


class UnevenLoading(RowOffset):
    """A RowOffset whose unpickling takes ``load_s[i]`` seconds in the i-th process to load
    it (i counted with lock files in ``tickets``): workers that load at different speeds.
    ``exit_on`` makes predict end the process with ``os._exit(3)`` when a row's first
    feature equals it (a model that kills its worker at run time). The number of files in
    ``tickets`` is the number of times it was loaded."""

    def __init__(
        self,
        load_s: tuple[float, ...] = (1.0,),
        tickets: str = "",
        exit_on: float | None = None,
        offset: float = 0.0,
    ) -> None:
        super().__init__(1, offset)
        self.load_s, self.tickets, self.exit_on = load_s, tickets, exit_on

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if self.exit_on is not None and (X[:, 0] == self.exit_on).any():
            import os

            os._exit(3)
        return super().predict(X)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "load_s": self.load_s,
            "tickets": self.tickets,
            "exit_on": self.exit_on,
            "offset": self.offset,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        import os

        ticket = 0
        while True:
            try:
                os.close(os.open(f"{state['tickets']}/{ticket}", os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                ticket += 1
        time.sleep(state["load_s"][min(ticket, len(state["load_s"]) - 1)])
        self.__init__(  # type: ignore[misc]
            state["load_s"], state["tickets"], state["exit_on"], state.get("offset", 0.0)
        )


class ReusedBuffer:
    """Predicts each row's first feature into one output buffer it reuses for every call
    (``return self.out[:n]``, as a model saving allocations does): whatever a caller was
    handed that still points into the buffer changes on the next call.

    ``gate`` (set: open) holds each call until it is set; ``entered`` is set by the first
    call. Records every batch size it saw. In-process tests only (not picklable).
    """

    def __init__(self, n_features: int = 3, capacity: int = 64) -> None:
        self.n_features_in_ = n_features
        self.out = np.zeros(capacity)
        self.batch_sizes: list[int] = []
        self.entered, self.gate = threading.Event(), threading.Event()
        self.gate.set()

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        self.batch_sizes.append(len(X))
        self.entered.set()
        assert self.gate.wait(10.0), "the test never opened the gate"
        n = len(X)
        self.out[:n] = X[:, 0]
        return self.out[:n]


class TypedChurn:
    """A team's own class over the churn pipeline (``examples/churn.py``), as a migration
    brings it: it declares its columns (strings, and numbers that may be missing) and
    takes a pandas DataFrame, as the pipeline does. ``load(path)`` reads
    ``path/churn.joblib``. Serve with ``SERVING_MODEL_CLASS=tests.models:TypedChurn``."""

    input_schema: ClassVar[list[dict[str, Any]]] = [
        {"name": "plan", "type": "string", "categories": ["basic", "pro", "team"]},
        {"name": "region", "type": "string"},
        {"name": "seats", "type": "double", "required": False},
        {"name": "usage_hours", "type": "double", "required": False},
    ]
    input_format = "dataframe"
    classes = (0, 1)

    def load(self, path: Any) -> None:
        import joblib

        self.pipeline = joblib.load(f"{path}/churn.joblib")

    def predict(self, frame: Any) -> dict[str, Any]:
        if not frame["plan"].map(type).eq(str).all():  # raw strings, never a float matrix
            raise TypeError(f"plan must hold str, got {frame['plan'].dtype}")
        return {
            "predictions": self.pipeline.predict(frame),
            "probabilities": self.pipeline.predict_proba(frame),
        }


class StringsWithoutSchema:
    """Takes raw string columns but declares nothing: its warm-up (float zeros) fails as
    ``np.isnan`` on strings does in the migration trial."""

    n_features = 2

    def load(self, path: Any) -> None:
        pass

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        raise TypeError("ufunc 'isnan' not supported for the input types")


class FreePlan:
    """A team's own class over an ``OrdinalEncoder`` pipeline (``tests.tabular.write_plan``)
    declaring ``plan`` a free string (no categories): the encoder refuses ``""``, the value
    a warm-up makes up for it (issue 34). ``load(path)`` reads ``path/plan.joblib``."""

    input_schema: ClassVar[list[dict[str, Any]]] = [
        {"name": "plan", "type": "string"},
        {"name": "seats", "type": "double"},
    ]
    input_format = "dataframe"

    def load(self, path: Any) -> None:
        import joblib

        self.pipeline = joblib.load(f"{path}/plan.joblib")
        self.seen: list[list[str]] = []

    def predict(self, frame: Any) -> Any:
        self.seen.append(list(frame["plan"]))
        return self.pipeline.predict(frame)


class FreePlanWithExamples(FreePlan):
    """A ``FreePlan`` that gives its own warm-up rows (a method, as a class may build them)."""

    def warmup_instances(self) -> list[dict[str, Any]]:
        return [{"plan": "pro", "seats": 3.0}, {"plan": "team", "seats": 1.0}]


class FreePlanWithBadExamples(FreePlan):
    """A ``FreePlan`` whose own warm-up rows name a plan its encoder does not know."""

    warmup_instances: ClassVar[list[list[Any]]] = [["gold", 1.0]]


class ForksOnPredict(RowEcho):
    """A RowEcho whose predict, given a row whose first feature is 7, forks a child process
    that sleeps ``child_s`` seconds (a model starting a helper process) and writes the
    child's pid to ``pid_file``."""

    def __init__(self, pid_file: str = "", child_s: float = 120.0) -> None:
        super().__init__(1)
        self.pid_file, self.child_s = pid_file, child_s

    def predict(self, X: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if (X[:, 0] == 7).any():
            import os

            pid = os.fork()
            if pid == 0:
                try:
                    time.sleep(self.child_s)
                finally:
                    os._exit(0)
            with open(self.pid_file, "w") as out:
                out.write(str(pid))
        return super().predict(X)

    def __getstate__(self) -> dict[str, Any]:
        return {"pid_file": self.pid_file, "child_s": self.child_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["pid_file"], state["child_s"])  # type: ignore[misc]


def credit_handle(seen: list[Any], keep: str | None = None) -> Any:
    """A ``credit`` model over a nullable integer ``dependents`` and a float ``income``
    (V2 missing-value tests): predicts ``dependents`` (NaN as -1) plus ``income``, and
    keeps each batch it is called with in ``seen`` (only column ``keep`` when given)."""
    from serving.model.handle import ModelHandle
    from serving.model.schema import feature

    def predict(batch: Any) -> Any:
        seen.append((batch[keep] if keep else batch).copy())
        return {"predictions": np.nan_to_num(batch["dependents"], nan=-1.0) + batch["income"]}

    features = (
        feature("dependents", "integer", np.int64, missing=True),
        feature("income", "float", np.float64),
    )
    return ModelHandle(
        name="credit", version="1", format="python", predict_batch=predict, features=features,
        feature_names=("dependents", "income"),
    )  # fmt: skip


def run_then_echo(code: str) -> RowEcho:
    """Runs ``code`` (trial-load tests: a load that forks, hangs, lists its descriptors),
    then is a RowEcho."""
    exec(code)
    return RowEcho()


class RunsOnLoad:
    """Unpickling it runs ``code`` in the loading process (``run_then_echo``)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return run_then_echo, (self.code,)
