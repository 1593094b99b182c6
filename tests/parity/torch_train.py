"""torch_train.py — PyTorch training the way `onyx train` runs a config with Transformers'
defaults, for the parity tests that compare whole runs: sequential batches of `batch` rows (wrapping
around the data), AdamW without weight decay, a linear decay from `lr` to 0 over `steps`, gradient
clipping at 1.0, and optionally CPU autocast (Transformers' bf16=True on a CPU). Only parameters
that require gradients are trained.
"""
import contextlib

import torch


def train_like_onyx(model, data, steps, batch, lr, autocast_dtype=None):
    """Trains `model` on `data` ({input name: numpy array of rows}); returns each step's loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (steps - s) / steps))
    n = next(iter(data.values())).shape[0]
    losses = []
    model.train()
    for step in range(steps):
        lo = (step * batch) % n
        feeds = {k: torch.tensor(v[lo:lo + batch]) for k, v in data.items()}
        ctx = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
               else contextlib.nullcontext())
        with ctx:
            loss = model(**feeds).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
