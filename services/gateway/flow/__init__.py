"""How an admitted request travels: flights, the chain of hops (preprocess, model stages with
failover and fallback, postprocess), shadows, the result cache and per-pipeline statistics."""
