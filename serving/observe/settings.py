"""The ``SERVING_*`` variables of observing: the metrics directory, the access log, the
log level and payload logging. ``serving.settings.Settings`` extends ``ObserveFields``,
as it does the model variables (``serving.model_settings.ModelFields``).

Boundary: pydantic-settings only (no Flask, werkzeug or Gunicorn), as the rest of
``serving/observe/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ObserveFields"]


class ObserveFields(BaseSettings):
    """The observing variables (``SERVING_<NAME>``); see ``serving.settings.Settings``."""

    model_config = SettingsConfigDict(env_prefix="SERVING_", frozen=True, extra="forbid")

    metrics_dir: Path | None = Field(
        None,
        description=(
            "prometheus-client multiprocess directory; its `*.db` files are removed at "
            "start (nothing else); one server per directory (a second one is refused at "
            "start)"
        ),
        json_schema_extra={"shown_default": "new temp dir"},
    )
    access_log: bool = Field(
        True,
        description=(
            "One JSON line per request on stdout: `request_id`, `route`, `status`, "
            "`latency_ms`, `instances`, `batch_size`, `model`, `model_version`"
        ),
    )
    access_log_queue_lines: int = Field(
        4096,
        ge=1,
        description=(
            "Access log lines a worker queues while stdout does not keep up (a pipe "
            "nobody reads; its writer takes at most as many more); more are dropped and "
            "counted in `access_log_dropped_total`, never waited for"
        ),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="`debug`, `info`, `warning` or `error` (any case)"
    )
    payload_log: Literal["off", "request", "response", "all"] = Field(
        "off",
        description=(
            "Payload logging: `request` (the decoded instances), `response` (the "
            "outputs), `all`; see [docs/observe.md](observe.md)"
        ),
    )
    payload_log_url: str | None = Field(
        None,
        pattern=r"^(https?|file)://.+",
        description=(
            "Its sink: `http(s)://...` gets one CloudEvent per record, "
            "`file:///path.jsonl` one JSON line per record (each worker writes "
            "`path-<pid>.jsonl`)"
        ),
    )
    payload_log_mode: Literal["binary", "structured"] = Field(
        "binary",
        description="CloudEvents HTTP content mode: `binary` (`ce-*` headers) or `structured`",
    )
    payload_log_sample: float = Field(
        1.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description=(
            "Share of requests logged, 0 to 1 (a request's request and response records "
            "go together)"
        ),
    )
    payload_log_queue_size: int = Field(
        10_000,
        ge=1,
        description=(
            "Records a worker holds for its sink; more are dropped and counted in "
            "`payload_log_dropped_total`, never waited for"
        ),
    )
    payload_log_queue_bytes: int = Field(
        64 * 2**20,
        ge=1024,
        description=(
            "Bytes of rows and outputs a worker holds for its sink (64 MiB; the record "
            "being sent included); a record that would pass it is dropped and counted in "
            "`payload_log_dropped_bytes_total`, never waited for"
        ),
    )
    payload_log_timeout_ms: float = Field(
        2000, gt=0, description="Longest one HTTP post of a record may take, in milliseconds"
    )
    payload_log_retries: int = Field(
        3,
        ge=0,
        le=10,
        description=(
            "HTTP retries of a record (backoff from 0.1 s, doubling), then it is dropped "
            "and counted"
        ),
    )
    payload_log_file_max_bytes: int = Field(
        100 * 2**20, ge=1024, description="Size at which a payload log file is rotated, in bytes"
    )
    payload_log_file_backups: int = Field(
        5,
        ge=0,
        description=(
            "Rotated payload log files kept per worker (`0`: the file starts afresh when full)"
        ),
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("metrics_dir")
    @classmethod
    def _check_metrics_dir(cls, value: Path | None) -> Path | None:
        if value is not None and value.exists() and not value.is_dir():
            raise ValueError("exists and is not a directory")
        return value

    @model_validator(mode="after")
    def _check_payload_log(self) -> ObserveFields:
        if self.payload_log != "off" and self.payload_log_url is None:
            raise ValueError("SERVING_PAYLOAD_LOG needs SERVING_PAYLOAD_LOG_URL (the sink)")
        return self
