"""Whether a next-token model sees the tokens it is asked to predict: one replay of a pass, once per run.

A language model trained on next tokens (the loss's target at position ``t`` is the input's token ``t + 1``)
must compute position ``t``'s output from tokens ``0..t`` only: a causal mask in its attention, or a
recurrence that runs forward. Without one (a ``TransformerEncoder`` given no ``mask``, attention written
by hand with no ``triu`` mask, ``is_causal`` left out) every position reads the next token and copies it:
the loss falls to ~0, every layer looks healthy, and the model cannot generate. No hook sees it.

Two readings, both cheap and taken at most a few times a run:

- the targets, off the gradient the loss left at the output (``next_token_share``): a hard target's
  logits get one entry pushed up, the target's; compared with the input shifted by one position;
- a replay (``sees_ahead``) on a copy of the model without its hooks, in eval mode, of the first sample
  alone, twice: as it is, and with its last token replaced by another token of the batch. A causal model
  gives the same outputs at every earlier position; one that reads ahead does not.
"""
from __future__ import annotations

import contextlib
import io
import random

import numpy as np
import torch
from torch import nn

from . import nanhunt
from .mixing import EQUAL, MAX_COPY_BYTES, _sharded

MIN_POSITIONS = 32   # hard targets read, at least, before the next-token share is trusted
MAX_POSITIONS = 256  # positions looked at, at most (the first ones of the batch): a large vocabulary's
#                      gradient is read in a bounded memory
POOLED = 1 << 16     # a module output with no position axis kept by a replay, at most (entries)


def token_inputs(args: tuple, kwargs: dict, batch: int, length: int | None = None) -> list[torch.Tensor]:
    """The pass's tensors of token ids of shape (batch, length) (of any length when None), in argument order:
    a sequence-to-sequence model has two (the source, and the target it is fed shifted)."""
    return [v for v in list(args) + list(kwargs.values())
            if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == batch
            and (length is None or v.shape[1] == length) and not v.is_floating_point() and v.dtype != torch.bool]


def token_input(args: tuple, kwargs: dict, batch: int, length: int | None = None) -> torch.Tensor | None:
    """The pass's first tensor of token ids of shape (batch, length) (see ``token_inputs``), when it has one."""
    found = token_inputs(args, kwargs, batch, length)
    return found[0] if found else None


def next_token_share(ids: torch.Tensor, g: torch.Tensor) -> tuple[float, int, int] | None:
    """(share of the read positions whose target is an input token, positions read, how far ahead: 1, the next
    token; 2, the one after it: labels shifted by hand for a model that shifts them again; 0, the position's
    own token: labels not shifted at all),
    from the gradient ``g`` (batch, length, vocabulary) a cross-entropy left at the output: a position whose
    gradient has exactly one negative entry has a hard target there. Read only where the position's own
    token and the two after it all differ (where two are equal, a target cannot tell which it is); at most
    ``MAX_POSITIONS`` positions are looked at. The largest of the three shares is returned. None when fewer
    than ``MIN_POSITIONS`` are read."""
    with torch.no_grad():
        per_row = min(g.shape[1] - 2, MAX_POSITIONS)
        if per_row < 1:
            return None
        rows = -(-MAX_POSITIONS // per_row)
        ids = ids[:rows].to(g.device)  # (only the positions looked at are copied)
        own, nxt, after = (ids[:, k:per_row + k].reshape(-1) for k in range(3))
        g = g.detach()[:rows, :per_row].reshape(-1, g.shape[-1])
        low, target = g.min(dim=-1)
        hard = ((low < 0) & ((g < 0).sum(dim=-1) == 1) & torch.isfinite(g).all(dim=-1)
                & (nxt != own) & (after != own) & (after != nxt))
        read = int(hard.sum())
        if read < MIN_POSITIONS:
            return None
        shares = [int((target == t)[hard].sum()) for t in (own, nxt, after)]
    ahead = max((1, 2, 0), key=lambda k: shares[k])  # (the next token first where two tie)
    return shares[ahead] / read, read, ahead


def _other_token(ids: torch.Tensor) -> int | None:
    """A token of the batch that is not the first sample's last one."""
    last = ids[0, -1]
    others = ids[ids != last]
    return int(others[0]) if others.numel() else None


def _positions(t, length: int) -> torch.Tensor | None:
    """A module output's rows per position of the one sample replayed, batch first or sequence first."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
        return None
    if t.shape[0] == 1 and t.shape[1] == length:
        return t[0]
    if t.shape[0] == length and t.shape[1] == 1:
        return t[:, 0]
    return None


def _rows(t: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """A module output's positions before the last (those of ``keep`` only, when given), as two numbers each
    (their sum and their norm): what a replay keeps of every module, in the memory of a few values per
    position."""
    rows = t[:-1].detach().float().reshape(t.shape[0] - 1, -1)
    if keep is not None:
        rows = rows[keep.to(rows.device)]
    return torch.stack([rows.sum(dim=1), rows.norm(dim=1)])


def _moved(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` (kept by ``_rows``, or a pooled output) differ beyond rounding."""
    a, b = a.float(), b.float()
    return float((b - a).abs().max()) > EQUAL * (float(a.abs().max()) or 1.0)


def sees_ahead(model: nn.Module, ids: torch.Tensor, args: tuple, kwargs: dict,
               autocast: list | None = None, carries: torch.Tensor | None = None) -> tuple[bool, str, bool] | None:
    """Whether the outputs of the first sample at positions before its last change when its last token does,
    in a replay on a copy of ``model`` in eval mode, the first module, in the order the forward runs, whose
    output at those positions does ("" when none is found: the change arises in the model's own forward), and
    whether the output at the last position changes (``ids`` reach the output where they stand: labels given to
    the model, or a target it shifts itself, do not). Every argument with a row per sample is cut to the first
    one. ``carries``: the first sample's positions the loss reads (bool, one per position; None: all): only
    those are compared, module by module too, since an output the loss never reads may see anything (a left
    padding's rows, whose every key is masked, attend to all of them alike).

    None when the replay does not lend itself: a model too large to copy or sharded, one token only, an
    output without the positions, a model that gives two outputs for the same input, one that fails on one
    sample; or when a module's output with no position axis (one vector per sample: a sentence's latent, a
    pooled summary) changes with the last token: a model that reads the whole sequence through such a
    summary by design (a sentence VAE's decoder) cannot be told from one that reads ahead."""
    n, length = ids.shape
    other = _other_token(ids)
    read = None if carries is None else carries.reshape(-1)[:length - 1].to("cpu", torch.bool)
    if read is not None and (len(read) != length - 1 or not bool(read.any())):
        return None  # no position before the last that the loss reads: nothing to tell
    if (other is None or length < 2 or _sharded(model)
            or sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) > MAX_COPY_BYTES):
        return None
    changed = ids[:1].clone()
    changed[0, -1] = other

    def first(v, swap=None):
        if v is ids:
            return swap if swap is not None else ids[:1]
        if not isinstance(v, torch.Tensor) or v.dim() < 1 or v.shape[0] != n:
            return v
        # (with as many samples as positions, a square float or boolean argument is taken for an attention
        # mask over the positions; integer ones, labels or a tokenizer's attention_mask, have a row per sample)
        square = n == length and v.dim() == 2 and v.shape[1] == n
        return v if square and (v.is_floating_point() or v.dtype == torch.bool) else v[:1]

    taken: dict[str, torch.Tensor] = {}   # per module, in the order they finish: its positions (see _rows)
    pooled: dict[str, torch.Tensor] = {}  # per module whose output has no position axis: that output

    def keep(name):
        def hook(m, inputs, output):
            t = next(iter(nanhunt.float_tensors(output)), None)
            rows = _positions(t, length)
            if rows is not None and name not in taken:
                taken[name] = _rows(rows, read)
            elif (rows is None and t is not None and t.dim() >= 1 and t.shape[0] == 1 and t.numel() <= POOLED
                  and length not in t.shape[1:] and name not in pooled):  # (no axis of the positions at all)
                pooled[name] = t.detach().float().clone()
        return hook

    def run(replica, swap=None, hooked=None):
        taken.clear()
        pooled.clear()
        handles = [m.register_forward_hook(keep(name)) for name, m in (hooked or [])]
        try:
            with torch.no_grad(), torch.random.fork_rng(), nanhunt._autocast(autocast):
                out = replica(*[first(a, swap) for a in args], **{k: first(v, swap) for k, v in kwargs.items()})
        finally:
            for h in handles:
                h.remove()
        t = next((t[0] for t in nanhunt.float_tensors(out) if t.dim() == 3 and t.shape[:2] == (1, length)), None)
        return None if t is None else (_rows(t, read), t[-1].detach().float().reshape(-1).clone())

    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            replica = nanhunt.copy_without_hooks(model).eval()
            modules = [(name, m) for name, m in replica.named_modules() if name]
            base = run(replica, hooked=modules)
            layers, summaries = dict(taken), dict(pooled)
            again = run(replica)
            moved = run(replica, changed, hooked=modules)
            del replica
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    if base is None or again is None or moved is None or _moved(base[0], again[0]) or _moved(base[1], again[1]):
        return None  # no output per position, or not the same outputs twice: nothing to compare against
    reaches = _moved(base[1], moved[1])
    if not _moved(base[0], moved[0]):
        return False, "", reaches
    if any(name in pooled and pooled[name].shape == t.shape and _moved(t, pooled[name])
           for name, t in summaries.items()):
        return None  # the last token reaches a summary of the whole sequence: by design, or not, cannot be told
    place = next((name for name, t in layers.items()  # in the order the modules finished
                  if name in taken and taken[name].shape == t.shape and _moved(t, taken[name])), "")
    return True, place, reaches
