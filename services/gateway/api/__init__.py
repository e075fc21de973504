"""What clients and operators call: the v2 gRPC servicer, REST, the admin API, model control,
log and trace settings, system shared memory, and `Pipelines`, the facade they all ask."""
