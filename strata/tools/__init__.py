"""What an operator runs: `make run`'s launcher (launch), the gRPC health check
(healthcheck), the container probe (probe), and `strata admin`'s client (admin_client).
"""
