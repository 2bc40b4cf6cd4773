import os

import torch

from lm_fixtures import _base_lm, tiny_data, tiny_lm  # noqa: F401  (fixtures, found by name)

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
