"""The layers behind the gateway: hops and their lanes, circuit breakers, hop timeouts, A/B
routing, per-arm figures and the replica each sequence sticks to."""
