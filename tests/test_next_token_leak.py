"""A model trained on next tokens whose outputs read the tokens after their position: a Transformer given no
causal mask, attention written by hand without one, a bidirectional recurrence. Each position sees the
token it is asked to predict, the loss falls by copying it, and every layer looks healthy. The targets are
read off the output's gradient; one replay of a sample with its last token changed says whether earlier
positions see it. A causal model, a forward recurrence, targets that are not the next tokens (a token
autoencoder) stay quiet."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Thresholds, leak

CONFIDENT = 0.5
V, T = 12, 16


def _text(seed: int, n: int = 512) -> torch.Tensor:
    """Sequences of a random order-1 Markov chain: next tokens that can be learned."""
    g = torch.Generator().manual_seed(seed)
    moves = torch.softmax(torch.randn(V, V, generator=g) * 2, -1)
    x = torch.zeros(n, T + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (n,), generator=g)
    for t in range(1, T + 1):
        x[:, t] = torch.multinomial(moves[x[:, t - 1]], 1, generator=g).squeeze(1)
    return x


class Encoder(nn.Module):
    def __init__(self, causal: bool, seed: int = 0, d: int = 32):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.pos = nn.Embedding(V, d), nn.Parameter(torch.randn(T, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out, self.causal = nn.Linear(d, V), causal

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        return self.out(self.enc(self.emb(x) + self.pos[:x.shape[1]], mask=mask, is_causal=self.causal))


class HandWritten(nn.Module):
    def __init__(self, causal: bool, seed: int = 0, d: int = 32):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.qkv, self.proj = nn.Embedding(V, d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm, self.out, self.causal = nn.LayerNorm(d), nn.Linear(d, V), causal

    def forward(self, x):
        h = self.emb(x)
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(h.shape[-1])
        if self.causal:
            n = x.shape[1]
            scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        return self.out(h + self.proj(scores.softmax(-1) @ v))


class Recurrent(nn.Module):
    def __init__(self, bidirectional: bool, seed: int = 0, d: int = 32):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(V, d)
        self.rnn = nn.LSTM(d, d, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(d * (2 if bidirectional else 1), V)

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


def _train(model, seed: int = 0, steps: int = 60, shift: int = 1, thresholds=None, noise: float = 0.0):
    text = _text(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt, thresholds=thresholds) as dbg:
        for _ in range(steps):
            batch = text[torch.randint(0, len(text), (16,), generator=g)]
            x, y = batch[:, :-1], batch[:, shift:shift + T]
            if noise:  # a share of the targets replaced by random tokens
                y = torch.where(torch.rand(y.shape, generator=g) < noise, torch.randint(0, V, y.shape, generator=g), y)
            opt.zero_grad()
            loss = F.cross_entropy(model(x).transpose(1, 2), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def _confident(dbg):
    return [h for h in dbg.explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_transformer_with_no_causal_mask_is_named_at_its_attention(seed):
    dbg = _train(Encoder(causal=False, seed=seed), seed)
    top = _confident(dbg)[0]
    assert (top.cause, top.layer) == ("data", "enc.layers.0.self_attn")
    assert top.step <= 2 and "is_causal=True" in top.suggestion
    assert "the next input tokens" in top.chain[0]
    assert dbg.trace.meta["next_token"]["share"] == 1.0


def test_attention_written_by_hand_without_a_mask_is_named_with_the_mask():
    dbg = _train(HandWritten(causal=False))
    top = _confident(dbg)[0]
    assert top.cause == "data" and "triu" in top.suggestion
    assert top.layer == "proj"  # the first module after the attention written as functions


@pytest.mark.parametrize("model", [lambda: Encoder(causal=True), lambda: HandWritten(causal=True),
                                   lambda: Recurrent(bidirectional=False)], ids=["encoder", "hand", "lstm"])
def test_causal_models_are_read_and_quiet(model):
    dbg = _train(model())
    assert dbg.trace.meta["next_token"]["sees_ahead"] is False
    assert _confident(dbg) == []


def test_a_bidirectional_recurrence_reads_ahead():
    dbg = _train(Recurrent(bidirectional=True))
    top = _confident(dbg)[0]
    assert (top.cause, top.layer) == ("data", "rnn")


class GivenMask(nn.Module):
    """``nn.MultiheadAttention`` given a mask in one of PyTorch's conventions, or the other's by mistake: a bool
    mask is True where attention is blocked, a float mask is added to the scores."""

    def __init__(self, kind: str, d: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.pos = nn.Embedding(V, d), nn.Parameter(torch.randn(T, d) * 0.02)
        self.att, self.norm, self.out, self.kind = nn.MultiheadAttention(d, 4, batch_first=True), nn.LayerNorm(d), \
            nn.Linear(d, V), kind

    def mask(self, n: int) -> torch.Tensor:
        ones = torch.ones(n, n)
        return {"bool": torch.triu(ones, 1).bool(), "float": torch.triu(torch.full((n, n), float("-inf")), 1),
                "bool_tril": torch.tril(ones).bool(), "float_01": torch.tril(ones)}[self.kind]

    def forward(self, x):
        h = self.norm(self.emb(x) + self.pos[:x.shape[1]])
        return self.out(h + self.att(h, h, h, attn_mask=self.mask(x.shape[1]), need_weights=False)[0])


@pytest.mark.parametrize("kind", ["bool_tril", "float_01"])
def test_a_mask_given_in_the_other_convention_reads_ahead_with_both_conventions_in_the_fix(kind):
    dbg = _train(GivenMask(kind))
    top = _confident(dbg)[0]
    assert (top.cause, top.layer) == ("data", "att")
    assert "True where attention is blocked" in top.suggestion and "not 0/1" in top.suggestion


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_mask_given_in_its_convention_is_quiet(kind):
    dbg = _train(GivenMask(kind))
    assert dbg.trace.meta["next_token"]["sees_ahead"] is False
    assert _confident(dbg) == []


def test_the_next_token_share_is_a_threshold():
    """A twentieth of the targets replaced by random tokens: ~95% are the next ones. Read as a next-token model
    at the default ``next_token_share``; re-analysed above the share read, the verdict goes; a session started
    with it there does not replay the model at all."""
    dbg = _train(Encoder(causal=False), noise=0.05)
    assert 0.9 <= dbg.trace.meta["next_token"]["share"] < 0.99
    assert _confident(dbg)[0].cause == "data"
    dbg.reanalyze(next_token_share=0.99)
    assert all(h.cause != "data" for h in _confident(dbg))
    dbg = _train(Encoder(causal=False), noise=0.05, thresholds=Thresholds(next_token_share=0.99))
    assert "next_token" not in dbg.trace.meta


def test_targets_that_are_the_input_itself_are_no_next_token_model():
    """A token autoencoder predicts each position's own token: reading the whole sequence is its design."""
    dbg = _train(Encoder(causal=False), shift=0)
    assert "next_token" not in dbg.trace.meta
    assert all(h.cause != "data" for h in _confident(dbg))


@pytest.mark.parametrize("model", [lambda: Encoder(causal=True), lambda: HandWritten(causal=True),
                                   lambda: Recurrent(bidirectional=False)], ids=["encoder", "by_hand", "lstm"])
def test_labels_never_shifted_under_a_causal_model_are_named(model):
    """Targets that are the inputs at their own positions, under a model that reads no later token: the labels
    were not shifted. The loss falls to ~0 by copying, and nothing is learned of the next token."""
    dbg = _train(model(), shift=0)
    assert dbg.trace.meta["next_token"]["ahead_by"] == 0
    top = _confident(dbg)[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0)
    assert top.suggestion.startswith("shift the labels by one")


class Seq2Seq(nn.Module):
    """``nn.Transformer`` fed a source and the target shifted right (teacher forcing), both of one length."""

    def __init__(self, masked: bool, d: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.pos = nn.Embedding(V + 1, d), nn.Embedding(T + 1, d)
        self.tf = nn.Transformer(d, 4, 1, 1, 64, dropout=0.0, batch_first=True)
        self.head, self.masked = nn.Linear(d, V + 1), masked

    def forward(self, src, tgt_in):
        def embed(t):
            return self.emb(t) + self.pos(torch.arange(t.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1]) if self.masked else None
        return self.head(self.tf(embed(src), embed(tgt_in), tgt_mask=mask))


@pytest.mark.parametrize("masked", [False, True])
def test_a_decoder_fed_its_target_without_a_mask_is_named_whichever_input_comes_first(masked):
    """The targets are the next tokens of the second token input, not the first: each one is read. Without
    ``tgt_mask`` the decoder's self-attention reads the token it is asked for; with it, the run is quiet."""
    model, text = Seq2Seq(masked), _text(0)
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(40):
            src = text[torch.randint(0, len(text), (16,), generator=g), :T]
            tgt = src.flip(1)
            tgt_in = torch.cat([torch.full((16, 1), V), tgt[:, :-1]], 1)  # a start token, then the target
            opt.zero_grad()
            loss = F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    if masked:
        assert all(h.cause != "data" for h in _confident(dbg))
        return
    top = _confident(dbg)[0]
    assert (top.cause, top.layer, top.step) == ("data", "tf.decoder.layers.0.self_attn", 0)


class Tagger(nn.Module):
    """A bidirectional tagger handed its labels as well (a model that computes its own loss would be): one tag
    per token, from a vocabulary of the same size as the tokens'."""

    def __init__(self, d: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.rnn = nn.Embedding(V, d), nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, V)

    def forward(self, x, labels=None):
        return self.out(self.rnn(self.emb(x))[0])


def test_labels_handed_to_the_model_are_not_read_as_its_inputs():
    """The targets are the ``labels`` tensor itself, position for position, and the model is handed it: its last
    entry changed, no output changes, so it is no input the model reads, and nothing is named."""
    model, text = Tagger(), _text(0)
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(60):
            x = text[torch.randint(0, len(text), (16,), generator=g), :T]
            tags = (x * 3 + 1) % V  # a tag per token
            opt.zero_grad()
            loss = F.cross_entropy(model(x, labels=tags).transpose(1, 2), tags)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert "next_token" not in dbg.trace.meta
    assert all(h.cause != "data" for h in _confident(dbg))


def test_targets_at_their_own_positions_are_told_from_the_next_ones():
    ids = torch.tensor([[1, 2, 3, 4, 5] * 8])
    logits = torch.zeros(1, 40, 8, requires_grad=True)
    F.cross_entropy(logits.transpose(1, 2), ids, reduction="sum").backward()
    share, read, ahead_by = leak.next_token_share(ids, logits.grad)
    assert (share, ahead_by) == (1.0, 0) and read == 38


def test_next_token_share_reads_hard_targets_only():
    ids = torch.tensor([[1, 2, 3, 4, 5] * 8])
    logits = torch.zeros(1, 40, 8, requires_grad=True)
    targets = ids[:, 1:].clone()
    # the last position is no one's target here; the others' targets are the next tokens
    loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, reduction="sum")
    loss.backward()
    share, read, ahead_by = leak.next_token_share(ids, logits.grad)
    assert (share, read, ahead_by) == (1.0, 38, 1)  # the last two positions have no token two ahead
    # where the next token repeats the position's own, a target says nothing of which one it is: not read
    runs = torch.tensor([[1, 1, 2, 2, 3] * 8])
    assert leak.next_token_share(runs, logits.grad) is None  # too few positions left to read
    # soft labels are no hard target: nothing is read
    logits.grad = None
    F.cross_entropy(logits.reshape(-1, 8), torch.full((40, 8), 1 / 8)).backward()
    assert leak.next_token_share(ids, logits.grad) is None


class SentenceVAE(nn.Module):
    """A bidirectional encoder sums the sentence up into a latent; a causal decoder predicts the next tokens
    from it: reading the whole sentence through the latent is the design."""

    def __init__(self, d: int = 32, z: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, d)
        self.enc = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.mu, self.logvar, self.z2h = nn.Linear(2 * d, z), nn.Linear(2 * d, z), nn.Linear(z, d)
        self.dec, self.out = nn.GRU(d, d, batch_first=True), nn.Linear(d, V)

    def forward(self, x):
        e = self.emb(x)
        _, h = self.enc(e)
        h = torch.cat([h[0], h[1]], -1)
        mu = self.mu(h)
        z = mu + torch.randn_like(mu) * (0.5 * self.logvar(h)).exp() if self.training else mu
        return self.out(self.dec(e, self.z2h(z).unsqueeze(0))[0])


def test_a_latent_that_sums_up_the_whole_sentence_is_not_read_as_a_leak():
    dbg = _train(SentenceVAE())
    assert "next_token" not in dbg.trace.meta
    assert all(h.cause != "data" for h in dbg.explain())


def test_targets_two_tokens_ahead_are_told_from_the_next_ones():
    ids = torch.tensor([[1, 2, 3, 4, 5] * 8])
    logits = torch.zeros(1, 40, 8, requires_grad=True)
    F.cross_entropy(logits[:, :-2].transpose(1, 2), ids[:, 2:], reduction="sum").backward()
    share, read, ahead_by = leak.next_token_share(ids, logits.grad)
    assert (share, ahead_by) == (1.0, 2) and read == 38


def _gpt2(labels_shifted_by_hand: bool, steps: int = 40):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=32))
    text, g = _text(0), torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            batch = text[torch.randint(0, len(text), (T,), generator=g)]  # as many samples as positions
            x = batch[:, :-1]
            out = model(input_ids=x, labels=batch[:, 1:] if labels_shifted_by_hand else x)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            dbg.record_loss(out.loss)
    return dbg


def test_a_hugging_face_causal_lm_given_its_labels_as_they_are_is_read_and_quiet():
    dbg = _gpt2(labels_shifted_by_hand=False)
    assert dbg.trace.meta["next_token"]["sees_ahead"] is False
    assert all(h.cause != "data" for h in _confident(dbg))


def test_labels_shifted_by_hand_for_a_model_that_shifts_them_are_named():
    """The model compares logits[:, :-1] with labels[:, 1:]: labels already shifted make every target the
    token after the next. Was attention_collapse with "add a warm-up"."""
    dbg = _gpt2(labels_shifted_by_hand=True)
    top = _confident(dbg)[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0)
    assert "labels=input_ids" in top.suggestion and "warm-up" not in top.suggestion


class LeftPadded(nn.Module):
    """Attention written by hand over left-padded rows: the padding keys masked with the dtype's lowest value
    (as transformers does), and the causal mask or not. A padding query has every key masked, so it attends
    to all of them alike, the tokens after it too: it carries no loss (its target is ignore_index)."""

    PAD = V  # one more token than the text has

    def __init__(self, causal: bool, seed: int = 0, d: int = 32):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.pos = nn.Embedding(V + 1, d), nn.Parameter(torch.randn(T, d) * 0.02)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm, self.out, self.causal = nn.LayerNorm(d), nn.Linear(d, V), causal

    def forward(self, x):
        n = x.shape[1]
        h = self.emb(x) + self.pos[:n]
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        masked = (x == self.PAD)[:, None, :].expand(-1, n, -1)
        if self.causal:
            masked = masked | torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        scores = (q @ k.transpose(1, 2) / math.sqrt(h.shape[-1])).masked_fill(masked, torch.finfo(h.dtype).min)
        return self.out(h + self.proj(scores.softmax(-1) @ v))


def _train_left_padded(model, seed: int = 0, steps: int = 60):
    text = _text(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            batch = text[torch.randint(0, len(text), (16,), generator=g)]
            x, y = batch[:, :-1].clone(), batch[:, 1:T + 1].clone()
            pad = torch.arange(T)[None] < torch.randint(2, T // 2, (16, 1), generator=g)  # the first sample too
            x[pad], y[pad] = LeftPadded.PAD, -100
            opt.zero_grad()
            loss = F.cross_entropy(model(x).transpose(1, 2), y, ignore_index=-100)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_left_padding_whose_rows_see_ahead_is_quiet_where_the_loss_reads_none(seed):
    """Only the positions the loss reads are compared: the padding's rows see the last token, the rest not."""
    dbg = _train_left_padded(LeftPadded(causal=True, seed=seed), seed)
    assert dbg.trace.meta["next_token"]["sees_ahead"] is False
    assert _confident(dbg) == []


def test_left_padding_without_a_causal_mask_reads_ahead():
    top = _confident(_train_left_padded(LeftPadded(causal=False)))[0]
    assert top.cause == "data" and top.layer == "proj"
