"""Generated gRPC stubs (build output of `make proto`; never edited by hand)."""
