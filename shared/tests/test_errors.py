"""The one error mapping (`scalerl.serving.ErrorInterceptor`) on a real in-process gRPC server built by the
service bootstrap: each domain error -> its status code with the field in the details, pydantic errors ->
INVALID_ARGUMENT naming the field, anything else -> INTERNAL, in unary and streaming methods, logged once with
the job id as a record field."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from scalerl import errors
from scalerl.logs import JsonFormatter
from scalerl.recipe import parse_recipe
from scalerl.serving import ServiceRegistration, start_server
from scalerl.v1 import common_pb2

SERVICE = "scalerl.test.Errors"
FIELD = "task.num_train_prompts"

# What the handlers raise, by name (the request's `recipe_json` names one).
RAISE = {
    "InvalidArgument": lambda job_id: errors.InvalidArgument("must be > 0", field=FIELD),
    "NotFound": lambda job_id: errors.NotFound("no such thing", field=FIELD),
    "AlreadyExists": lambda job_id: errors.AlreadyExists("exists already", field=FIELD),
    "FailedPrecondition": lambda job_id: errors.FailedPrecondition("not now", field=FIELD),
    "ResourceExhausted": lambda job_id: errors.ResourceExhausted("too many", field=FIELD),
    "Unavailable": lambda job_id: errors.Unavailable("down", field=FIELD),
    "NotFoundOfJob": lambda job_id: errors.NotFound("unknown job", field="job_id", job_id="job-of-the-error"),
    "Validation": lambda job_id: _validation_error(),
    "Unexpected": lambda job_id: RuntimeError("boom"),
}
CODES = {
    "InvalidArgument": grpc.StatusCode.INVALID_ARGUMENT,
    "NotFound": grpc.StatusCode.NOT_FOUND,
    "AlreadyExists": grpc.StatusCode.ALREADY_EXISTS,
    "FailedPrecondition": grpc.StatusCode.FAILED_PRECONDITION,
    "ResourceExhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "Unavailable": grpc.StatusCode.UNAVAILABLE,
}


def _validation_error():
    try:
        parse_recipe('{"pipeline": {"max_staleness": -1}}')
    except Exception as err:
        return err
    raise AssertionError("the recipe should not validate")


def unary(request: common_pb2.Job, context):
    if request.recipe_json == "abort":
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "aborted by the servicer")
    if request.recipe_json:
        raise RAISE[request.recipe_json](request.job_id)
    return common_pb2.Job(job_id=request.job_id, state="ok")


def server_stream(request: common_pb2.Job, context):
    yield common_pb2.Job(job_id=request.job_id, state="first")
    yield common_pb2.Job(job_id=request.job_id, state="second")
    raise RAISE[request.recipe_json](request.job_id)


def bidi_stream(requests, context):
    for request in requests:
        if request.recipe_json:
            raise RAISE[request.recipe_json](request.job_id)
        yield common_pb2.Job(job_id=request.job_id, state="echo")


def _add(server: grpc.Server) -> None:
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, common_pb2.Job.FromString,
                                                     common_pb2.Job.SerializeToString),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream, common_pb2.Job.FromString,
                                                             common_pb2.Job.SerializeToString),
        "BidiStream": grpc.stream_stream_rpc_method_handler(bidi_stream, common_pb2.Job.FromString,
                                                            common_pb2.Job.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


@pytest.fixture(scope="module")
def channel():
    running = start_server(ServiceRegistration([SERVICE], _add), host="127.0.0.1", grpc_port=0, metrics_port=None,
                           max_workers=4)
    ch = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    yield ch
    ch.close()
    running.stop(0)


def _method(channel, kind: str, name: str):
    return getattr(channel, kind)(f"/{SERVICE}/{name}", request_serializer=common_pb2.Job.SerializeToString,
                                  response_deserializer=common_pb2.Job.FromString)


def call_unary(channel, what: str, job_id: str = "job-7") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        _method(channel, "unary_unary", "Unary")(common_pb2.Job(job_id=job_id, recipe_json=what), timeout=10)
    return err.value


def failure_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("what", sorted(CODES))
def test_each_domain_error_is_its_code_naming_the_field(channel, what):
    err = call_unary(channel, what)
    assert err.code() == CODES[what]
    assert err.details().startswith(f"{FIELD}: "), err.details()


def test_validation_error_is_invalid_argument_naming_the_field(channel):
    err = call_unary(channel, "Validation")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("pipeline.max_staleness: "), err.details()


def test_unexpected_exception_is_internal(channel):
    err = call_unary(channel, "Unexpected")
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == "RuntimeError: boom"


def test_success_and_context_abort_pass_through(channel, caplog):
    assert _method(channel, "unary_unary", "Unary")(common_pb2.Job(job_id="j"), timeout=10).state == "ok"
    with caplog.at_level(logging.INFO):
        err = call_unary(channel, "abort")
    assert (err.code(), err.details()) == (grpc.StatusCode.PERMISSION_DENIED, "aborted by the servicer")
    assert failure_records(caplog) == []  # the servicer's own abort: not the interceptor's to log


def test_server_stream_raising_mid_stream_gets_its_code(channel):
    call = _method(channel, "unary_stream", "ServerStream")(common_pb2.Job(job_id="job-s", recipe_json="NotFound"),
                                                            timeout=10)
    received = []
    with pytest.raises(grpc.RpcError) as err:
        for reply in call:
            received.append(reply.state)
    assert received == ["first", "second"]
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and err.value.details().startswith(f"{FIELD}: ")


def test_bidi_stream_raising_mid_stream_gets_its_code(channel):
    requests = iter([common_pb2.Job(job_id="a"), common_pb2.Job(job_id="b", recipe_json="Unexpected")])
    received = []
    with pytest.raises(grpc.RpcError) as err:
        for reply in _method(channel, "stream_stream", "BidiStream")(requests, timeout=10):
            received.append(reply.job_id)
    assert received == ["a"]
    assert err.value.code() == grpc.StatusCode.INTERNAL and "boom" in err.value.details()


@pytest.mark.parametrize("what,level", [("FailedPrecondition", logging.WARNING), ("Unexpected", logging.ERROR)])
def test_failure_is_logged_once_with_the_job_id_as_a_field(channel, caplog, what, level):
    with caplog.at_level(logging.INFO):
        call_unary(channel, what, job_id="job-logged")
    (record,) = failure_records(caplog)  # once: not by the interceptor and again by grpc
    assert record.levelno == level and record.name == "scalerl.serving"
    assert record.job_id == "job-logged"
    assert "job-logged" not in record.getMessage() and f"/{SERVICE}/Unary" in record.getMessage()
    assert json.loads(JsonFormatter("test").format(record))["job_id"] == "job-logged"
    assert (record.exc_info is not None) == (what == "Unexpected")  # the traceback only for the unexpected


def test_streaming_failure_is_logged_once_with_the_job_id(channel, caplog):
    with caplog.at_level(logging.INFO):
        with pytest.raises(grpc.RpcError):
            list(_method(channel, "unary_stream", "ServerStream")(
                common_pb2.Job(job_id="job-streamed", recipe_json="Unavailable"), timeout=10))
    (record,) = failure_records(caplog)
    assert record.job_id == "job-streamed"


def test_the_errors_job_id_is_used_when_the_request_has_none(channel, caplog):
    with caplog.at_level(logging.INFO):
        err = call_unary(channel, "NotFoundOfJob", job_id="")
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details().startswith("job_id: ")
    (record,) = failure_records(caplog)
    assert record.job_id == "job-of-the-error"
