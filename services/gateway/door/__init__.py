"""Who may come in and how many: identity, rate limits, the adaptive concurrency limit, the
degradation ladder's level, and the refusals they give."""
