"""Strata, the one installed package: what every service shares, by concern.

- `wire`: tensors, flights, deadlines and v2 messages between processes;
- `calls`: a call served, and its failures as statuses;
- `config`: the deployment's one YAML file, typed;
- `telemetry`: spans, logs and metrics;
- `security`: TLS, identities, API keys, bearer tokens, what a caller may hold open;
- `process`: a process's set-up before it serves, and its exit codes;
- `rpc`: a service's entry, its gRPC server's life-cycle, its channels to the next hop;
- `tools`: the launcher, the health check, the probe, `strata admin`;
- `models`: the model repository on disk and a model's ONNX signature;
- `plugins`: the public interface of steps and rules (`strata.plugins`) and their registry;
- `shapes`: a pipeline's tensors checked against its config and its model;
- `convert`: the converter; `command`: the `strata` console script; `errors`: the one error
  hierarchy; `yamltext`: the YAML parser; `proto`: the generated stubs.

It imports no service; every service imports it.
"""

__version__ = "0.1.0"  # the one version string; pyproject.toml reads it
