"""The deployment's one YAML file, typed and validated at load time: one module per concern.

- `endpoints`: where each layer listens and where callers reach it;
- `pipelines`: what clients see as one model (tensors, steps, the model and its routes, rules);
- `gateway`, `inference`, `preprocess`, `postprocess`: each service's own settings;
- `server`, `tls`, `limits`: what every process shares;
- `settings`: the root (`Settings`), and `load_settings`, which reads and validates the file.
"""

from strata.config.settings import ConfigError, Settings, load_settings

__all__ = ["ConfigError", "Settings", "load_settings"]
