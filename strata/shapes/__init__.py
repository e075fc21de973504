"""A pipeline's tensors, checked and derived: a request's tensors against its
declared inputs (schema), its steps and rules against the model's signature (wiring), the
sizes its preprocess makes (sizes), the tail it leaves to the model (folding).
"""
