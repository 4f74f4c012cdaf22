"""A real PyTorch training step for `iobench load --compute-mode callback` (README: Loader).

    iobench load DATA --compute-mode callback --compute-fn examples/torch_step.py:step

The model is sized from the first batch (token batches are (batch, seq_len) arrays; image
batches with --decode are (batch, H, W, 3)), so it runs on any dataset iobench reads.
"""

import numpy as np
import torch

_model = None
_opt = None


def step(batch, i):
    global _model, _opt
    x = torch.from_numpy(np.asarray(batch.data, dtype=np.float32).reshape(len(batch.data), -1))
    if _model is None:
        _model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        _opt = torch.optim.SGD(_model.parameters(), lr=1e-6)
    loss = _model(x).square().mean()
    _opt.zero_grad()
    loss.backward()
    _opt.step()
