"""A call as a server serves it: failures as statuses (grpc_errors), the `Process` call
and the streams (v1process, v1stream, v2stream, streams), fan-out without tasks (gathering).
"""
