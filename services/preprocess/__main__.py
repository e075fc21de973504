"""python -m services.preprocess --config FILE"""

from services.preprocess.app import build
from strata.rpc.main import run_service

if __name__ == "__main__":
    run_service("preprocess", build)
