import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

# Tests run many tiny tensor ops; torch's intra-op thread pool only adds wake-up latency to
# them, and on a shared 2-core machine it can add milliseconds per op.
torch.set_num_threads(1)
