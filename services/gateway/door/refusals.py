"""The door's refusals, counted by reason and client and logged at a bounded rate.

Every refusal counts in `strata_gateway_refusals_total{reason, client}`. Client ids are
unbounded (a peer's address is one), so the label names only the first
`refusal_clients` clients refused, each cut to a bounded length, and counts every later
one as `(other)`. The log says each reason at most once per `refusal_log_seconds`: the first
refusal at once, later ones as counts in that reason's next line, with the clients refused
most and the latest message (which names the pipeline and its numbers).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from services.gateway.metrics import REFUSALS
from strata.config.gateway import Concurrency
from strata.errors import cut

log = logging.getLogger(__name__)

OTHER = "(other)"  # the label of every client past the named ones
NAMED_PER_LINE = 3  # clients a log line names; the rest are summed
LABEL_CHARACTERS = 64  # of a client id as a label value


class Refusals:
    """Counts and logs the door's refusals; `settings` may be replaced on reload."""

    def __init__(self, settings: Concurrency, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._named: set[str] = set()
        # Per reason: refusals since its last line, by client label; when it may log next.
        self._pending: dict[str, Counter[str]] = {}
        self._due: dict[str, float] = {}
        self._since: dict[str, float] = {}

    def label(self, client: str) -> str:
        """`client` as a label value: its (cut) id while it is among the named ones."""
        name = cut(client, LABEL_CHARACTERS)
        if name in self._named or len(self._named) < self.settings.refusal_clients:
            self._named.add(name)
            return name
        return OTHER

    def record(self, reason: str, client: str, message: str) -> None:
        """One refusal of `client` for `reason`, whose answer said `message`."""
        label = self.label(client)
        REFUSALS(reason, label).inc()
        pending = self._pending.setdefault(reason, Counter())
        pending[label] += 1
        now = self._clock()
        if now < self._due.get(reason, now):
            return
        log.warning("%s", self._line(reason, pending, now, message))
        pending.clear()
        self._due[reason] = now + self.settings.refusal_log_seconds
        self._since[reason] = now

    def _line(self, reason: str, pending: Counter[str], now: float, message: str) -> str:
        total = sum(pending.values())
        since = self._since.get(reason)
        when = "" if since is None else f" in the last {now - since:.0f} s"
        named = pending.most_common(NAMED_PER_LINE)
        rest = total - sum(count for _, count in named)
        clients = ", ".join(f"{client!r} {count}" for client, count in named)
        if rest:
            clients += f", others {rest}"
        return f"door refused {total} ({reason}){when}, by client: {clients}; latest: {message}"
