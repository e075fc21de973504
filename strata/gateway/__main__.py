"""python -m strata.gateway --config FILE"""

from strata.cli import run_service
from strata.gateway.app import build

if __name__ == "__main__":
    run_service("gateway", build)
