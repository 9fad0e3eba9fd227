"""Watch a Hugging Face ``Trainer.train``:

>>> from neuraldbg.integrations.transformers import NeuralDbgCallback
>>> cb = NeuralDbgCallback(stop_on=("non_finite",))
>>> Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
>>> cb.session.explain()

The callback watches the model and the optimizer the trainer creates (``on_train_begin``) and
counts optimizer steps (once per gradient-accumulation window). The trainer clips gradients before
``on_pre_optimizer_step`` and zeroes them before ``on_step_end``, so the parameter gradients are read
where the session reads them by default: at the end of each backward pass, the window's last one
counting. The loss of each step is the mean of the ``loss`` the model returns for its micro-batches
(or, for a model that returns none, the ``loss`` of ``on_log``). ``stop_on`` causes set
``control.should_training_stop``. Only the main process (``state.is_world_process_zero``) prints the
verdict and writes ``save``.

When ``train`` raises, Hugging Face calls no callback; a callback given to the ``Trainer``'s
constructor takes ``train`` of that trainer in hand so that its hooks still go (one added later with
``add_callback``, from the trainer's next ``train`` on).
"""
from __future__ import annotations

import functools
import sys
import types
from collections.abc import Mapping

import torch
from transformers import TrainerCallback

from ._common import Watch

__all__ = ["NeuralDbgCallback"]

_GUARDED = "_neuraldbg_guarded"


def _find_trainer(callback):
    """The trainer whose callback handler holds ``callback``, found among its callers' frames."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        try:
            handler = getattr(owner, "callback_handler", None)
            if handler is not None and any(cb is callback for cb in getattr(handler, "callbacks", ())):
                return owner
        except Exception:  # noqa: BLE001 - an unrelated object with an unusual __getattr__
            pass
        frame = frame.f_back
    return None


def _guard(trainer) -> None:
    """Wrap the trainer's ``train`` once so that a failing run still ends every NeuralDbg callback."""
    if trainer is None or getattr(trainer.train, _GUARDED, False):
        return
    own = trainer.__dict__.get("train")  # an instance attribute set by someone else, kept in the chain

    def train(self, *args, **kwargs):
        try:
            return own(*args, **kwargs) if own is not None else type(self).train(self, *args, **kwargs)
        except BaseException as exc:
            outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            for cb in list(getattr(self.callback_handler, "callbacks", ())):
                if isinstance(cb, NeuralDbgCallback):
                    try:
                        cb._end(outcome)
                    except Exception as e:  # noqa: BLE001 - never hide the training's own exception
                        print(f"neuraldbg: could not stop watching: {type(e).__name__}: {e}")
            raise

    functools.update_wrapper(train, type(trainer).train)
    setattr(train, _GUARDED, True)
    trainer.train = types.MethodType(train, trainer)


def _any_rank(args, found: bool) -> bool:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return found
    flag = torch.tensor([float(found)], device=args.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class NeuralDbgCallback(TrainerCallback):
    """``Trainer(..., callbacks=[NeuralDbgCallback()])``; the session is in ``callback.session``."""

    def __init__(self, thresholds=None, *, session=None, stop_on=(), report=True, save=None, check_every=50,
                 **options):
        """``thresholds``, ``options`` (``every``, ``capacity``, ``on_step``, ...): as for ``NeuralDbg``.
        ``session``: report to this session instead of a new one. ``stop_on``: causes that stop training
        (``"non_finite"``: as soon as NaN/Inf is seen; others: checked every ``check_every`` steps).
        ``report``: print the verdict when training ends. ``save``: write the trace there."""
        self._watch = Watch(thresholds, session=session, stop_on=stop_on, report=report, save=save,
                            check_every=check_every, **options)
        self._guard_train = True
        self._loss_hook = None
        self._output_loss = False

    @property
    def session(self):
        """The session of the latest ``train`` (or the one given)."""
        return self._watch.session

    @property
    def stopped_by(self) -> str | None:
        """The cause that stopped the latest ``train``, if one did."""
        return self._watch.stopped_by

    # -- training begins and ends ------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kwargs):
        if self._guard_train:
            _guard(_find_trainer(self))

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self._guard_train:
            _guard(_find_trainer(self))  # for the next train(), when added after the trainer was made
        self._end("stopped")
        self._watch.start(model, optimizer, rank_zero=state.is_world_process_zero)
        self._output_loss = False
        self._loss_hook = model.register_forward_hook(self._on_model_output)

    def on_train_end(self, args, state, control, **kwargs):
        self._end("finished")

    def _end(self, outcome: str) -> None:
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        self._watch.finish(outcome)

    # -- each step ---------------------------------------------------------------------------------------
    def _on_model_output(self, module, args, output):
        if torch.is_grad_enabled() and isinstance(output, Mapping):
            loss = output.get("loss")
            if isinstance(loss, torch.Tensor):
                self._output_loss = True
                self._watch.add_loss(loss)

    def on_step_end(self, args, state, control, **kwargs):
        if self._watch.step_end(functools.partial(_any_rank, args)) is not None:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._watch.running and not self._output_loss and logs and isinstance(logs.get("loss"), (int, float)):
            self.session.record_loss(logs["loss"])


def callback_for(trainer, **kwargs) -> NeuralDbgCallback:
    callback = NeuralDbgCallback(**kwargs)
    callback._guard_train = False  # added and taken off around one call by its caller
    return callback


def find_callback(trainer):
    """A NeuralDbg callback the trainer already holds, if any."""
    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, NeuralDbgCallback)), None)


def add_callback(trainer, callback) -> None:
    trainer.add_callback(callback)


def remove_callback(trainer, callback) -> None:
    trainer.remove_callback(callback)
    callback._end("stopped")
