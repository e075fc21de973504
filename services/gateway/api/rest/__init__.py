"""The KServe v2 REST API at the gateway: the same pipelines, admission and flights as gRPC,
over HTTP/JSON with the binary tensor extension (uvicorn and Starlette, in the gateway's own
process and event loop).

Request -> body limits (scan) -> JSON and binary data to a v2 message (tensors) -> the
application service (services/gateway/serving/pipelines.py), as a gRPC request goes -> the
answer as JSON or binary (tensors); any failure -> {"error": ...} with the HTTP status of its
code (statuses).
"""
