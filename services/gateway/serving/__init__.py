"""The application service: the pipelines as the v2 models clients see, whichever protocol
asks (api/ translates each protocol to it): readiness, metadata, statistics, counting, and one
inference from the door to its outputs, in and out of shared memory."""
