"""python -m strata.inference --config FILE"""

from strata.cli import run_service
from strata.inference.app import build

if __name__ == "__main__":
    run_service("inference", build)
