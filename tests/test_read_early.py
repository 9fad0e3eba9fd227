"""A recurrent layer's output read before its sequence ends (``out[:, 0]``, the state after the first step,
where ``out[:, -1]`` was meant): no module hook sees which time step the head reads, but the gradient of the
layer's input per time step does (a unidirectional layer's step t reaches only its outputs from t on). With a
loss that does not improve it is a plateau at the layer, with the readout's fix, never a larger learning rate;
a head that reads the end, or a task the first step decides, train quietly; a bidirectional layer read at its
start has read the whole sequence. The same holds of a causal Transformer read at its first position, seen at
the tokens' embedding: only the first position's gets a gradient."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faultgen.score import contradictions
from zoo import Run, train

CONFIDENT = 0.5


def _sequences(decided_by: str, steps_in_time: int = 20, batch: int = 64):
    """Four classes from the signs of one time step's features: the last step's, or the first's."""
    def data(step: int):
        x = torch.randn(batch, steps_in_time, 8, generator=torch.Generator().manual_seed(step))
        t = x[:, -1] if decided_by == "last" else x[:, 0]
        return x, (t[:, :4].sum(1) > 0).long() + 2 * (t[:, 4:].sum(1) > 0).long()
    return data


class Reader(nn.Module):
    def __init__(self, cell: str, at: int, seed: int, bidirectional: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](8, 48, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(96 if bidirectional else 48, 4)
        self.at = at

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, self.at])


def _run(cell: str, at: int, decided_by: str = "last", seed: int = 0, bidirectional: bool = False, steps: int = 300):
    model = Reader(cell, at, seed, bidirectional)
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), _sequences(decided_by), steps=steps))


@pytest.mark.parametrize("cell, seed", [("lstm", 0), ("gru", 1)])
def test_a_recurrent_layer_read_at_its_first_step_is_named_with_the_readouts_fix(cell, seed):
    dbg = _run(cell, 0, seed=seed)
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("loss_plateau", "rnn") and top.confidence >= CONFIDENT
    assert "out[:, -1]" in top.suggestion and "learning rate" not in top.suggestion
    assert any("time step 1 of 20" in line for line in top.chain)
    assert not [h for h in dbg.explain()[1:] if h.confidence >= CONFIDENT]  # the flat loss is in its chain
    assert contradictions(dbg.explain()) == []
    rows = dbg.trace.meta["through_time"]["rnn"]
    assert {r[3] for r in rows} == {1} and {r[2] for r in rows} == {20}


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_same_layer_read_at_its_last_step_trains_quietly(cell):
    dbg = _run(cell, -1)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]
    assert {r[3] for r in dbg.trace.meta["through_time"]["rnn"]} == {20}


def test_a_first_step_read_is_no_failure_where_the_first_step_decides():
    dbg = _run("lstm", 0, decided_by="first")
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_a_bidirectional_layer_read_at_its_first_step_sees_the_whole_sequence():
    """Its backward direction's first output has read every step: the readout is not what holds it back
    (remembering the last step over the whole sequence may be)."""
    dbg = _run("lstm", 0, bidirectional=True)
    assert {r[3] for r in dbg.trace.meta["through_time"]["rnn"]} == {20}
    assert not [h for h in dbg.explain() if "out[:, -1]" in h.suggestion]


def test_a_half_read_sequence_is_its_time_read_threshold():
    """Read at step 8 of 20 (40%): under the default ``time_read`` (half the sequence) it is named; a
    threshold below 40% lets it be."""
    dbg = _run("lstm", 7)
    assert dbg.explain()[0].layer == "rnn"
    assert all(h.layer != "rnn" for h in dbg.reanalyze(time_read=0.3))


def test_rows_written_before_they_kept_the_reached_steps_are_read_without_them():
    """A saved run whose rows hold three entries (no last step reached) says nothing of the readout, and
    the through-time reading still works on them."""
    assert any("out[:, -1]" in h.suggestion for h in _run("lstm", 0, steps=120).explain())
    dbg = _run("lstm", 0, steps=120)
    dbg.trace.meta["through_time"]["rnn"] = [r[:3] for r in dbg.trace.meta["through_time"]["rnn"]]
    assert not [h for h in dbg.explain() if "out[:, -1]" in h.suggestion]


VOCAB, LENGTH, WIDTH = 10, 12, 32


def _tokens(decided_by: str = "all"):
    """Token sequences labelled by whether token 3 appears twice or more (the whole sequence decides), or
    by their first token."""
    def data(step: int):
        x = torch.randint(0, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(step))
        return x, (x[:, 0] >= VOCAB // 2).long() if decided_by == "first" else ((x == 3).sum(1) >= 2).long()
    return data


class CausalAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, h):
        b, t, _ = h.shape
        q, k, v = (z.view(b, t, 2, WIDTH // 2).transpose(1, 2) for z in self.qkv(h).chunk(3, dim=-1))
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, WIDTH))


class CausalClassifier(nn.Module):
    """Token and position embeddings, causal self-attention blocks, and a head on one position: written by
    hand, or with ``nn.TransformerEncoder`` on (positions, batch, width) inputs."""

    def __init__(self, at: int, seed: int, library: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(LENGTH, WIDTH)
        self.library, self.at = library, at
        if library:
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, 2, 64, dropout=0.0), 2,
                                             enable_nested_tensor=False)
        else:
            self.attn = nn.ModuleList(CausalAttention() for _ in range(2))
            self.norms = nn.ModuleList(nn.LayerNorm(WIDTH) for _ in range(2))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        if self.library:  # positions first, as nn.TransformerEncoder takes them by default
            h = (self.emb(x) + self.pos(positions)).transpose(0, 1)
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            return self.head(self.enc(h, mask=mask, is_causal=True)[self.at])
        h = self.emb(x) + self.pos(positions)
        for attn, norm in zip(self.attn, self.norms):
            h = h + attn(norm(h))
        return self.head(h[:, self.at])


def _causal(at: int, seed: int = 0, library: bool = False, decided_by: str = "all"):
    model = CausalClassifier(at, seed, library)
    return train(Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _tokens(decided_by), steps=300))


@pytest.mark.parametrize("library, seed", [(False, 0), (True, 1)], ids=["by_hand", "encoder_positions_first"])
def test_a_causal_transformer_read_at_its_first_position_is_named_at_the_tokens(library, seed):
    """Read at position 0 under a causal mask, the prediction has seen one token of twelve: the loss comes
    down to the label prior's and stays. Named at the token embedding, with the readout's fix, never a
    learning rate."""
    dbg = _causal(0, seed, library)
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("loss_plateau", "emb") and top.confidence >= CONFIDENT, dbg.report()
    assert "out[:, -1]" in top.suggestion and "learning rate" not in top.suggestion
    assert any("position 1 of 12" in line for line in top.chain)
    assert contradictions(dbg.explain()) == []


@pytest.mark.parametrize("library", [False, True], ids=["by_hand", "encoder_positions_first"])
def test_a_causal_transformer_read_at_its_last_position_trains_quietly(library):
    dbg = _causal(-1, library=library)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()
    rows = dbg.trace.meta["positions_read"]["emb"]
    assert {r[4] for r in rows} == {LENGTH}


def test_a_first_position_read_is_no_failure_where_the_first_token_decides():
    dbg = _causal(0, decided_by="first")
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_a_recurrent_layer_read_early_is_named_at_the_layer_not_at_its_tokens():
    """An embedding before an LSTM read at its first step: both see the cut; the recurrent layer's reading
    is the one named."""
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb, self.rnn = nn.Embedding(VOCAB, WIDTH), nn.LSTM(WIDTH, WIDTH, batch_first=True)
            self.head = nn.Linear(WIDTH, 2)

        def forward(self, x):
            return self.head(self.rnn(self.emb(x))[0][:, 0])
    model = Tagger()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _tokens(), steps=300))
    hyps = [h for h in dbg.explain() if "before its sequence ends" in h.chain[0]]
    assert [h.layer for h in hyps] == ["rnn"], dbg.report()


def test_padding_a_mask_hides_is_not_read_as_an_early_readout():
    """Sequences of 4 to 12 tokens padded to 32, a key padding mask, a summary token read at position 0
    without a causal mask: the padded positions get no gradient, yet every real token does. Random labels
    make the loss flat; the readout is not named for it."""
    class Summary(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb, self.pos = nn.Embedding(VOCAB, WIDTH, padding_idx=0), nn.Embedding(32, WIDTH)
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, 2, 64, dropout=0.0, batch_first=True),
                                             2, enable_nested_tensor=False)
            self.head = nn.Linear(WIDTH, 2)

        def forward(self, x):
            h = self.emb(x) + self.pos(torch.arange(x.shape[1]))
            return self.head(self.enc(h, src_key_padding_mask=x == 0)[:, 0])

    def data(step: int):
        g = torch.Generator().manual_seed(step)
        lengths = torch.randint(4, 13, (32,), generator=g)
        x = torch.randint(2, VOCAB, (32, 32), generator=g)
        x[:, 0] = 1
        x[torch.arange(32)[None] >= lengths[:, None]] = 0
        return x, torch.randint(0, 2, (32,), generator=g)
    model = Summary()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, steps=200))
    assert not [h for h in dbg.explain() if "out[:, -1]" in h.suggestion], dbg.report()
    rows = dbg.trace.meta["positions_read"]["emb"]
    assert all(r[4] >= r[3] for r in rows)  # every real token reached: the padding is no part of the length


class BiReader(nn.Module):
    """A bidirectional LSTM read at its last position (the backward direction has seen one step there), or
    at both directions' final states."""

    def __init__(self, seed: int, ends: bool):
        super().__init__()
        torch.manual_seed(seed)
        self.rnn = nn.LSTM(8, 48, batch_first=True, bidirectional=True)
        self.head = nn.Linear(96, 4)
        self.ends = ends

    def forward(self, x):
        out, (h, _) = self.rnn(x)
        return self.head(torch.cat([h[-2], h[-1]], dim=1) if self.ends else out[:, -1])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_bidirectional_layer_read_at_its_last_position_gets_the_readouts_fix(seed):
    """The first step decides the class: only the backward direction's end, at the first step, reads it in one
    step; read at out[:, -1], the gradient vanishes back through the forward direction. It was named
    with the forget-gate bias, which leaves the readout as it is."""
    model = BiReader(seed, ends=False)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), _sequences("first"), steps=300))
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("vanishing_gradients", "rnn") and top.confidence >= CONFIDENT
    assert "h_n[-2]" in top.suggestion and "forget-gate" not in top.suggestion
    assert any("bidirectional" in line for line in top.chain)
    fixed = BiReader(seed, ends=True)
    assert not [h for h in train(Run(fixed, torch.optim.Adam(fixed.parameters(), lr=3e-3), _sequences("first"),
                                     steps=300)).explain() if h.confidence >= CONFIDENT]
