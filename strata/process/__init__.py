"""What every Strata process sets up before it serves, and how it stops: exit codes
(exits), several processes sharing one service's ports (workers), glibc's allocator, the
garbage collector, gRPC's transport, pydantic's plugin search, and the launcher's id.
"""
