"""python -m services.inference --config FILE"""

from services.inference.app import build
from strata.rpc.main import run_service

if __name__ == "__main__":
    run_service("inference", build)
