"""Structured logging: one JSON object per line (or plain text for humans). The job id, learner step and policy
version travel as fields (`job_logger(log, job_id).info(...)`, or `extra={"step": n}`), never inside the text."""

from __future__ import annotations

import json
import logging
import sys
import time


FIELDS = ("job_id", "step", "version")


class JobLog(logging.LoggerAdapter):
    """A logger bound to one job: every line carries `job_id` (and any other bound field) as a field; a call's
    own `extra` (e.g. `step`, `version`) adds to them."""

    def process(self, msg, kwargs):
        kwargs["extra"] = {**self.extra, **kwargs.get("extra", {})}
        return msg, kwargs

    def bind(self, **fields) -> "JobLog":
        return JobLog(self.logger, {**self.extra, **fields})


def job_logger(logger: logging.Logger, job_id: str, **fields) -> JobLog:
    return JobLog(logger, {"job_id": job_id, **fields})


class TextFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) not in (None, ""))
        return f"{text} [{fields}]" if fields else text


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value not in (None, ""):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(service: str, level: str = "INFO", as_json: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if as_json else TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
