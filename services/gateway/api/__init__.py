"""What clients and operators call, each protocol translated to the application service
(services/gateway/serving/): the v2 gRPC servicer, REST, the admin API, model control, and
log and trace settings."""
