import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "training"))

from lm_fixtures import _base_lm, tiny_data, tiny_lm  # noqa: E402,F401  (fixtures, by name)

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
