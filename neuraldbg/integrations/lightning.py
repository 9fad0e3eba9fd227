"""Watch a PyTorch Lightning ``Trainer.fit``:

>>> from neuraldbg.integrations.lightning import NeuralDbgCallback
>>> cb = NeuralDbgCallback()
>>> pl.Trainer(max_epochs=3, callbacks=[cb]).fit(lit_module, loader)
>>> cb.session.explain()

The callback watches the LightningModule and its (first) optimizer, counts optimizer steps (once
per gradient-accumulation window), measures each training step whether or not ``training_step``
calls the module's own forward, reads the parameter gradients in ``on_before_optimizer_step``
(after the precision plugin has unscaled them, before clipping), and records the training loss of
each step. It stops watching when ``fit`` ends, fails or is interrupted. Under DDP every rank
records; only global rank 0 prints the verdict and writes ``save``.
"""
from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from functools import partial

try:
    import pytorch_lightning as _pl
except ImportError:  # the unified package only
    import lightning.pytorch as _pl  # type: ignore[no-redef]

from ._common import Watch

__all__ = ["NeuralDbgCallback"]


def _loss_of(output):
    """The loss in what ``training_step`` returns: a tensor, or a mapping with a ``"loss"`` entry."""
    return output.get("loss") if isinstance(output, Mapping) else output


def _replay(batch, batch_idx, module):
    """``training_step`` on a copy of the module (no trainer: its ``self.log`` calls only warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _loss_of(module.training_step(batch, batch_idx))


class _LightningWatch:
    """The callback's behaviour, shared by the classes built on each Lightning package's ``Callback``."""

    def __init__(self, thresholds=None, *, session=None, stop_on=(), report=True, save=None, check_every=50,
                 **options):
        """``thresholds``, ``options`` (``every``, ``capacity``, ``on_step``, ...): as for ``NeuralDbg``.
        ``session``: report to this session instead of a new one. ``stop_on``: causes that stop training
        (``"non_finite"``: as soon as NaN/Inf is seen; others: checked every ``check_every`` steps).
        ``report``: print the verdict when ``fit`` ends. ``save``: write the trace there."""
        super().__init__()
        self._watch = Watch(thresholds, session=session, stop_on=stop_on, report=report, save=save,
                            check_every=check_every, **options)
        self._step_seen = 0

    @property
    def session(self):
        """The session of the latest ``fit`` (or the one given)."""
        return self._watch.session

    @property
    def stopped_by(self) -> str | None:
        """The cause that stopped the latest ``fit``, if one did."""
        return self._watch.stopped_by

    # -- fit begins and ends ---------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        session = self._watch.start(pl_module, optimizer, rank_zero=trainer.is_global_zero)
        self._step_seen = session.step

    def on_fit_end(self, trainer, pl_module) -> None:
        self._watch.finish("finished")

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._watch.finish("interrupted" if isinstance(exception, KeyboardInterrupt) else "failed")

    def teardown(self, trainer, pl_module, stage) -> None:
        self._watch.finish("stopped")

    # -- each batch ------------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._watch.running:
            self.session.begin_pass(batch, run=partial(_replay, batch, batch_idx))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self._watch.running:
            self.session.end_forward(loss)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._watch.running:
            self.session.read_gradients()  # unscaled by now, not yet clipped

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._watch.running:
            return
        loss = _loss_of(outputs)
        if loss is not None:  # Lightning hands it back divided by the accumulation
            self._watch.add_loss(loss.detach() * trainer.accumulate_grad_batches)
        if self.session.step == self._step_seen:
            return  # inside an accumulation window: no optimizer step yet
        self._step_seen = self.session.step
        if self._watch.step_end(partial(_any_rank, trainer)) is not None:
            trainer.should_stop = True


def _any_rank(trainer, found: bool) -> bool:
    return bool(trainer.strategy.reduce_boolean_decision(found, all=False))


_CLASSES: dict[type, type] = {}


def _callback_class(base: type) -> type:
    """``NeuralDbgCallback`` on a Lightning package's own ``Callback`` (``pytorch_lightning`` and
    ``lightning.pytorch`` each accept only theirs)."""
    if base not in _CLASSES:
        _CLASSES[base] = type("NeuralDbgCallback", (_LightningWatch, base),
                              {"__module__": __name__, "__doc__": __doc__})
    return _CLASSES[base]


NeuralDbgCallback = _callback_class(_pl.Callback)


def callback_for(trainer, **kwargs):
    """A callback of the Lightning package ``trainer`` comes from."""
    package = type(trainer).__module__.split(".trainer")[0]
    return _callback_class(importlib.import_module(package).Callback)(**kwargs)


def find_callback(trainer):
    """A NeuralDbg callback the trainer already holds, if any."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, _LightningWatch)), None)


def add_callback(trainer, callback) -> None:
    trainer.callbacks.append(callback)


def remove_callback(trainer, callback) -> None:
    if callback in trainer.callbacks:
        trainer.callbacks.remove(callback)
    callback._watch.finish("stopped")
