"""python -m services.gateway --config FILE"""

from services.gateway.app import build, workers
from strata.rpc.main import run_service

if __name__ == "__main__":
    run_service("gateway", build, workers=workers)
