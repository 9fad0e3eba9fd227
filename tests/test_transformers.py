"""Hugging Face: ``Trainer(callbacks=[NeuralDbgCallback()])`` reaches the verdicts of a plain loop."""
import numpy as np
import pytest
import torch
import transformers  # the real framework: `make venv` installs the [transformers] extra
from transformers import Trainer, TrainingArguments

from neuraldbg import NeuralDbg, Stat
from neuraldbg.integrations.transformers import NeuralDbgCallback

from frameworks import CASES, Case, Classifier, dataset, hooks_left, plain_run, verdict

transformers.logging.set_verbosity_error()


def hf_trainer(case: Case, callbacks, tmp_path, model=None, **args) -> Trainer:
    model = model or Classifier(case)
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    constant = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    args = {"max_grad_norm": 0.0, "logging_strategy": "no", **args}
    targs = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                              max_steps=case.steps, per_device_train_batch_size=case.batch,
                              gradient_accumulation_steps=case.accumulate, bf16=case.bf16, disable_tqdm=True,
                              train_sampling_strategy="sequential", **args)
    return Trainer(model=model, args=targs, train_dataset=dataset(case), optimizers=(opt, constant),
                   callbacks=callbacks)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verdict_steps_and_loss_equal_those_of_the_plain_loop(case, tmp_path):
    plain = plain_run(case)
    cb = NeuralDbgCallback(every=1, report=False)
    tr = hf_trainer(case, [cb], tmp_path)
    tr.train()
    dbg = cb.session
    assert dbg.step == tr.state.global_step == plain.step == case.steps  # optimizer steps, once per window
    assert verdict(dbg) == verdict(plain)
    assert verdict(plain)[:1] == [(*case.expect, 0)] if case.expect else verdict(plain) == []
    np.testing.assert_allclose(dbg.trace.loss.data, plain.trace.loss.data, rtol=1e-5)
    np.testing.assert_array_equal(dbg.trace.loss.steps, plain.trace.loss.steps)
    assert not dbg.watching and hooks_left(tr.model, tr.optimizer.optimizer) == 0


def test_gradients_are_read_before_clipping_and_before_they_are_zeroed(tmp_path):
    case = Case("clipped", accumulate=4, steps=3, batch=8)
    plain = plain_run(case)
    cb = NeuralDbgCallback(every=1, report=False)
    hf_trainer(case, [cb], tmp_path, max_grad_norm=1e-3).train()
    for name in ("net.0", "net.2", "net.4"):
        seen = cb.session.trace.stats.data[0, cb.session.trace.layer(name).index, Stat.W_GRAD_NORM]
        assert seen == pytest.approx(plain.trace.stats.data[0, plain.trace.layer(name).index, Stat.W_GRAD_NORM],
                                     rel=1e-4)
        assert seen > 1e-2  # far above what clipping left


def test_stop_on_non_finite_sets_should_training_stop(tmp_path, capsys):
    case = Case("nan", nan_loss=True)
    cb = NeuralDbgCallback(every=1, stop_on=("non_finite",))
    tr = hf_trainer(case, [cb], tmp_path)
    tr.train()
    assert cb.stopped_by == "non_finite"
    assert tr.state.global_step == cb.session.step == 1
    out = capsys.readouterr().out
    assert "stopping training after step 1: non_finite" in out and "training finished after 1 steps" in out


class Failing(Classifier):
    def __init__(self, case, fail_at):
        super().__init__(case)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls > self.fail_at:
            raise RuntimeError("a bug in the model")
        return super().forward(x, labels)


def test_no_hook_outlives_a_train_that_raises(tmp_path, capsys):
    case = Case("dead_then_bug", dead=True)
    model = Failing(case, fail_at=12)
    cb = NeuralDbgCallback(every=1)
    tr = hf_trainer(case, [cb], tmp_path, model=model)
    with pytest.raises(RuntimeError, match="a bug in the model"):
        tr.train()
    assert cb.session.step == 12 and not cb.session.watching
    assert hooks_left(model, tr.optimizer.optimizer) == 0
    out = capsys.readouterr().out
    assert "training failed after 12 steps" in out and "dead_units in `net.3`" in out
    # the trainer still trains, watched again, once the bug is gone
    model.fail_at = 10 ** 9
    tr.train()
    assert cb.session.step == case.steps and hooks_left(model, tr.optimizer.optimizer) == 0


def test_a_model_that_returns_no_loss_gets_the_loss_of_on_log(tmp_path):
    case = Case("external_loss", steps=6)
    logged = []

    def loss_func(outputs, labels, num_items_in_batch=None):
        loss = torch.nn.functional.cross_entropy(outputs["logits"], labels)
        logged.append(loss.item())
        return loss

    cb = NeuralDbgCallback(every=1, report=False)
    tr = hf_trainer(case, [cb], tmp_path, logging_strategy="steps", logging_steps=1)
    tr.compute_loss_func = loss_func
    tr.train()
    assert cb.session.trace.loss.n == case.steps
    np.testing.assert_allclose(cb.session.trace.loss.data, logged, rtol=1e-4)
    np.testing.assert_array_equal(cb.session.trace.loss.steps, np.arange(case.steps))


def test_main_process_writes_the_trace(tmp_path):
    case = Case("dead", dead=True, steps=10)
    path = tmp_path / "hf.ndbg"
    cb = NeuralDbgCallback(every=1, save=path, report=False)
    tr = hf_trainer(case, [cb], tmp_path)
    tr.train()
    assert tr.state.is_world_process_zero and path.exists()
    assert verdict(NeuralDbg.load(path)) == verdict(cb.session) == [("dead_units", "net.3", 0)]


def test_a_tiny_bert_from_config_gets_the_verdict_of_a_plain_loop(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    def bert():
        torch.manual_seed(0)
        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        return BertForSequenceClassification(config)

    g = torch.Generator().manual_seed(3)
    rows = [{"input_ids": torch.randint(1, 100, (12,), generator=g), "labels": torch.tensor(i % 2)}
            for i in range(64)]
    lr, steps = 40.0, 8  # SGD far too fast for this model

    model = bert()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(rows, batch_size=8)
    with NeuralDbg(model, opt, every=1) as plain:
        for batch in loader:
            opt.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            plain.record_loss(loss)

    model = bert()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    cb = NeuralDbgCallback(every=1, report=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", max_steps=steps,
                             per_device_train_batch_size=8, max_grad_norm=0.0, logging_strategy="no",
                             disable_tqdm=True, train_sampling_strategy="sequential")
    tr = Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb],
                 optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)))
    tr.train()
    assert cb.session.step == plain.step == steps
    assert verdict(cb.session) == verdict(plain)
    assert ("learning_rate_too_high", "", 0) in verdict(plain)
    assert hooks_left(model, opt) == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_query_and_key_gradients_that_grow_from_their_small_start_are_no_explosion(seed):
    """A small BERT at its std-0.02 init: the queries' and keys' gradients start ~1e-5x the layers after them
    (a product of two small projections) and grow to their level as attention learns, 1e5-fold from their
    start. That is a recovery, not an explosion (it read as exploding_gradients at 0.53 on one seed)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=12, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + seed)
    with NeuralDbg(model, opt) as dbg:
        for _ in range(250):
            x = torch.randint(1, 3, (32, 15), generator=g)
            x = torch.where(torch.rand(32, 15, generator=g) < 0.3, torch.randint(3, 10, (32, 15), generator=g), x)
            y = ((x == 1).sum(1) > (x == 2).sum(1)).long()  # which of two tokens is in the majority
            opt.zero_grad()
            loss = model(input_ids=torch.cat([torch.full((32, 1), 11), x], 1), labels=y).loss
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.trace.loss.data[-20:].mean() < 0.2  # it learned
    keys = [e for e in dbg.analysis().events if e.after == "exploding" and e.layer.endswith((".query", ".key"))]
    assert not keys
    assert not [h for h in dbg.explain() if h.confidence >= 0.5]


def _token_classes(seed: int, n: int = 1024, length: int = 16, vocab: int = 120, k: int = 4):
    """Each class owns five signal tokens; a sequence holds three of its class's among random filler."""
    g = torch.Generator().manual_seed(seed)
    signal = torch.arange(10, 10 + 5 * k).view(k, 5)
    y = torch.randint(0, k, (n,), generator=g)
    ids = torch.randint(10 + 5 * k, vocab, (n, length), generator=g)
    for _ in range(3):
        at = torch.randint(0, length, (n,), generator=g)
        ids[torch.arange(n), at] = signal[y, torch.randint(0, 5, (n,), generator=g)]
    return [{"input_ids": ids[i], "labels": y[i]} for i in range(n)]


@pytest.mark.parametrize("warmup", [10000, 10], ids=["warmup_longer_than_the_run", "warmup_of_5_percent"])
def test_a_warmup_longer_than_the_run_is_named_under_the_trainer(warmup, tmp_path):
    """A small BERT trained by the Trainer with warmup_steps=10000 and max_steps=200: the rate reaches 2e-5
    of its 1e-3 and the loss stays at chance. The schedule is named (the trainer's optimizer wrapper hides the
    scheduler's mark; the rate changing from step to step shows one), not the queries' and keys' gradients,
    which a softmax over small logits keeps far below the layers after them by design while the values beside
    them carry the signal. With a warm-up of 10 steps it trains, and nothing is said of those gradients."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=128,
                                                     max_position_embeddings=32, num_labels=4))
    cb = NeuralDbgCallback(report=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                             max_steps=200, per_device_train_batch_size=16, learning_rate=1e-3,
                             warmup_steps=warmup, lr_scheduler_type="linear", logging_strategy="no",
                             disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=_token_classes(0), callbacks=[cb]).train()
    hyps = cb.session.explain()
    assert not [h for h in hyps if h.cause == "vanishing_gradients" and h.confidence >= 0.3], cb.session.report()
    if warmup < 200:
        assert not [h for h in hyps if h.confidence >= 0.5], cb.session.report()
        return
    top = hyps[0]
    assert (top.cause, top.layer) == ("learning_rate_too_low", "") and top.confidence >= 0.5, cb.session.report()
    assert "warm-up" in top.suggestion and "raise the learning rate" not in top.suggestion
