"""What travels between Strata's processes: tensors (codec, stack, their limits), a
flight's members and deadlines, v2 metadata and statistics, and Triton's sequence extension.
"""
