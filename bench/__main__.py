"""python -m bench --config FILE: every benchmark, one after the other (`make bench`)."""

from bench import batching

if __name__ == "__main__":
    batching.main()
