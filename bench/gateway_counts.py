"""The gateway's own counts, read from its Prometheus /metrics page: refusals, answers, flights.

The door counts each refusal in `strata_gateway_refusals_total{reason, client}` and the rate
limiter in `strata_gateway_rate_limited_total{scope}`; every answer counts in
`strata_gateway_requests_total{pipeline, code, protocol}`. A benchmark reads them to say what
the server refused and why, beside what its clients saw; `strata_gateway_flight_requests`
says how many flights carried how many requests (their mean size between two readings).
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

TIMEOUT = 5.0  # seconds; a page that does not come sooner is read at the next sample


@dataclass
class GatewayCounts:
    """Totals since the gateway started."""

    refusals: Counter[tuple[str, str]] = field(default_factory=Counter)  # (reason, client)
    rate_limited: Counter[str] = field(default_factory=Counter)  # by scope
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (protocol, code)
    flights: float = 0.0  # flights that left
    flight_requests: float = 0.0  # the requests they carried

    @property
    def refused(self) -> int:
        return int(sum(self.refusals.values()) + sum(self.rate_limited.values()))

    def by_reason(self) -> Counter[str]:
        """Refusals by reason, rate limits as `rate_limited:<scope>`."""
        out: Counter[str] = Counter()
        for (reason, _), count in self.refusals.items():
            out[reason] += int(count)
        for scope, count in self.rate_limited.items():
            out[f"rate_limited:{scope}"] += int(count)
        return out

    def as_dict(self) -> dict:
        return {
            "refusals": [
                {"reason": r, "client": c, "count": int(n)} for (r, c), n in self.refusals.items()
            ],
            "rate_limited": {scope: int(n) for scope, n in self.rate_limited.items()},
            "answers": [
                {"protocol": p, "code": c, "count": int(n)} for (p, c), n in self.answers.items()
            ],
        }


def read(address: str) -> GatewayCounts:
    """The counts on the gateway's metrics page at `address` (host:port); OSError if it
    cannot be read."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=TIMEOUT) as page:
        return parse(page.read().decode())


def parse(text: str) -> GatewayCounts:
    counts = GatewayCounts()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "strata_gateway_refusals_total":
                counts.refusals[labels["reason"], labels["client"]] += sample.value
            elif sample.name == "strata_gateway_rate_limited_total":
                counts.rate_limited[labels["scope"]] += sample.value
            elif sample.name == "strata_gateway_requests_total":
                counts.answers[labels["protocol"], labels["code"]] += sample.value
            elif sample.name == "strata_gateway_flight_requests_count":
                counts.flights += sample.value
            elif sample.name == "strata_gateway_flight_requests_sum":
                counts.flight_requests += sample.value
    return counts
