"""A clock a test moves by hand: pass it where a class takes `clock=time.monotonic`."""


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
