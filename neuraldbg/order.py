"""Whether an attention model over tokens sees their order: one replay of a pass, once per run.

Attention mixes a sequence's positions as a set: without positional information added to the tokens'
embeddings (a learned position embedding, sinusoids, rotary phases) and without a causal mask, a model
that pools its outputs, or reads them at one position, gives the same prediction for any order of the
other tokens. On a task that depends on the order the loss comes down only as far as the bag of tokens
predicts, and stops there; every layer looks healthy. No hook sees it.

The reading (``sees_order``) replays one sample on a copy of the model without its hooks, in eval mode:
as it is (twice: a model that does not give the same output twice cannot be compared), with its tokens
between the first and the last in reverse order (a summary token at the start and an end token stay where
they are), and with those tokens replaced by another sample's: an output that does not change then either
does not read them at all (a causal model read at its first position), which says nothing of their order.
Arguments with a row per position that are masks (0/1 or boolean) are reordered with the tokens; other
ones (position or segment ids) would reorder the positions themselves, and the replay is not made.
"""
from __future__ import annotations

import contextlib
import io
import random

import numpy as np
import torch
from torch import nn

from . import nanhunt
from .leak import _moved, token_input
from .mixing import MAX_COPY_BYTES, _sharded

MIN_POSITIONS = 4  # a sequence shorter than this has too few middle tokens to reorder
ROWS_TRIED = 8     # samples looked at, at most, for one whose middle tokens reversed are another sequence


def token_ids(args: tuple, kwargs: dict, batch: int) -> torch.Tensor | None:
    """The pass's tensor of token ids, (batch, positions), when it has one with at least ``MIN_POSITIONS``."""
    ids = token_input(args, kwargs, batch)
    return ids if ids is not None and ids.shape[1] >= MIN_POSITIONS else None


class _NotReplayable(Exception):
    pass


def sees_order(model: nn.Module, ids: torch.Tensor, args: tuple, kwargs: dict,
               autocast: list | None = None) -> bool | None:
    """Whether the model's output for one sample changes when the order of its middle tokens does, in a
    replay on a copy of ``model`` in eval mode. None when the replay does not lend itself: a model too large
    to copy or sharded, no sample whose middle tokens reversed differ, as many samples as positions (a square
    argument could be a mask over the positions), an argument with a row per position that is no mask, a
    model that gives two outputs for the same input, or NaN/Inf, or fails on one sample; and when the
    output does not change with the middle tokens replaced either (it does not read them)."""
    n, length = ids.shape
    if (length < MIN_POSITIONS or n == length or _sharded(model)
            or sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) > MAX_COPY_BYTES):
        return None
    middle = ids[:ROWS_TRIED, 1:-1]
    row = next((i for i in range(middle.shape[0]) if not torch.equal(middle[i], middle[i].flip(0))), None)
    if row is None:
        return None
    bag = middle[row].sort().values
    other = next((i for i in range(middle.shape[0]) if not torch.equal(middle[i].sort().values, bag)), None)
    if other is None:
        return None
    replaced = ids.clone()
    replaced[row, 1:-1] = ids[other, 1:-1]
    order = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(length - 2, 0, -1),
                       torch.full((1,), length - 1, dtype=torch.long)]).to(ids.device)

    def one(v, reordered: bool, swap: bool = False):
        if swap and v is ids:
            return replaced[row:row + 1]
        if not isinstance(v, torch.Tensor) or v.dim() < 1 or v.shape[0] != n:
            return v
        per_position = v.dim() >= 2 and v.shape[1] == length
        if per_position and v is not ids and not (v.dtype == torch.bool or bool(((v == 0) | (v == 1)).all())):
            raise _NotReplayable  # position or segment ids: reordered with the tokens they say nothing
        v = v[row:row + 1]
        return v[:, order] if reordered and per_position else v

    def run(replica, reordered: bool, swap: bool = False) -> list[torch.Tensor]:
        with torch.no_grad(), torch.random.fork_rng(), nanhunt._autocast(autocast):
            out = replica(*[one(a, reordered, swap) for a in args],
                          **{k: one(v, reordered, swap) for k, v in kwargs.items()})
        return [t.detach().float().clone() for t in nanhunt.float_tensors(out)]

    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            replica = nanhunt.copy_without_hooks(model).eval()
            base, again, moved = run(replica, False), run(replica, False), run(replica, True)
            other_tokens = run(replica, False, swap=True)
            del replica
    except _NotReplayable:
        return None
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    if not base or len(base) != len(again) or len(base) != len(moved):
        return None
    if not all(bool(t.isfinite().all()) for t in base):
        return None  # (NaN/Inf outputs compare as nothing)
    if any(a.shape != b.shape or _moved(a, b) for a, b in zip(base, again)):
        return None  # not the same outputs twice: nothing to compare against
    if any(a.shape != b.shape for a, b in zip(base, moved)):
        return True
    if any(_moved(a, b) for a, b in zip(base, moved)):
        return True
    if len(other_tokens) != len(base) or not any(a.shape != b.shape or _moved(a, b)
                                                 for a, b in zip(base, other_tokens)):
        return None  # the middle tokens do not reach the output at all: nothing said of their order
    return False
