"""python -m strata.postprocess --config FILE"""

from strata.cli import run_service
from strata.postprocess.app import build

if __name__ == "__main__":
    run_service("postprocess", build)
