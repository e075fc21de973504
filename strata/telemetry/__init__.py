"""Spans, logs and metrics: tracing and JSON logs set up alike in every service
(tracing), trace context on the wire (propagation), spans exported off the serving path
(spanexport), Prometheus pages (metrics), step and rule durations (timings), and `make
trace`'s receiver (traces).
"""
