"""python -m services.postprocess --config FILE"""

from services.postprocess.app import build
from strata.rpc.main import run_service

if __name__ == "__main__":
    run_service("postprocess", build)
