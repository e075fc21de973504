"""Example Strata plugins: a preprocess step and a postprocess rule of one's own code."""
