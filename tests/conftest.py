import os
import sys
from pathlib import Path

# the fault generator (benchmarks/faultgen) is shared by `make eval` and the tests
sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
