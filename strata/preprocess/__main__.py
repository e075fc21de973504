"""python -m strata.preprocess --config FILE"""

from strata.cli import run_service
from strata.preprocess.app import build

if __name__ == "__main__":
    run_service("preprocess", build)
