"""recal.lightning: exact BatchNorm statistics in a Lightning Trainer, through recal-server.

    import lightning, recal.lightning

    trainer = lightning.Trainer(callbacks=[recal.lightning.RecalibrateBatchNorm(num_batches=200)])
    trainer.fit(model)  # at the end: the model's BatchNorm statistics recalibrated on its train data

PyTorch Lightning's StochasticWeightAveraging updates BatchNorm as torch's update_bn does (a
momentum-free running average of batch statistics); this callback replaces the statistics
with the exact population statistics of the model as it stands, computed by recal-server
(recal.torch.recalibrate: export, stream the batches, load the buffers back in place).

Under DDP every rank calls the callback with its own part of the train dataloader (its
DistributedSampler's): one sharded job is fed by every rank, the server merges the shards
exactly, and every rank loads the same statistics, those of one process over the union.
"""

import logging

import recal.torch  # first: without torch, its message names the extra that brings it
from recal import specs

try:
    import lightning.pytorch as pl
except ModuleNotFoundError as _missing:
    if not (_missing.name or "").startswith("lightning"):
        raise
    raise ModuleNotFoundError("recal.lightning needs Lightning, which this Python does not have: pip install "
                              "'recal[lightning]'", name="lightning") from _missing

__all__ = ["RecalibrateBatchNorm"]

_log = logging.getLogger(__name__)
_WHEN = ("fit_end", "every_n_epochs")


class RecalibrateBatchNorm(pl.Callback):
    """Recalibrates the LightningModule's BatchNorm statistics on recal-server.

    num_batches: batches of the train dataloader to use (all ranks together under DDP).
    when: "fit_end" (once, after training and after callbacks such as
        StochasticWeightAveraging have put their weights in place) or "every_n_epochs"
        (at the end of every `every_n_epochs`-th training epoch, after that epoch's
        validation).
    server, token: as for recal.torch.recalibrate (None: $RECAL_SERVER, else
        localhost:50051; $RECAL_TOKEN).
    dataloader: the batches to use instead of the trainer's train dataloader: an iterable,
        or a function of the trainer that returns one (under DDP each rank's own part).
    module: the module to recalibrate instead of the LightningModule itself: a function of
        the LightningModule (e.g. lambda m: m.backbone).
    options: the rest of recal.torch.recalibrate's keywords (input_fn, estimator, modules,
        include, exclude, bar, tls settings, ...); a misspelt one is refused here, when the
        callback is made.

    `last_result` holds the last recal.torch Result (the same on every rank).
    """

    def __init__(self, num_batches=200, *, when="fit_end", every_n_epochs=1, server=None, token=None,
                 dataloader=None, module=None, **options):
        super().__init__()
        if when not in _WHEN:
            specs.check_names([when], _WHEN, "value of when=")
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError("every_n_epochs must be a positive integer, not %r" % (every_n_epochs,))
        recal.torch.check_options(options, also=("when", "every_n_epochs", "dataloader", "module"))
        self.num_batches = num_batches
        self.when = when
        self.every_n_epochs = every_n_epochs
        self._dataloader = dataloader
        self._module = module
        self._options = dict(options, server=server, token=token)
        self.last_result = None

    def on_train_epoch_end(self, trainer, pl_module):
        if self.when == "every_n_epochs" and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.recalibrate(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module):
        # After the Trainer's teardown: the model is back from the DDP wrapper, the process
        # group is still up, and the train dataloader still holds each rank's sampler.
        if self.when == "fit_end":
            self.recalibrate(trainer, pl_module)

    def recalibrate(self, trainer, pl_module):
        """Recalibrates now (every rank, under DDP); returns the Result."""
        target = self._module(pl_module) if self._module is not None else pl_module
        result = recal.torch.recalibrate(target, self._batches(trainer), num_batches=self.num_batches,
                                         **self._options)
        self.last_result = result
        if trainer.is_global_zero:
            _log.info("recal: %d BatchNorm layers recalibrated from %d batches (%d samples, %d rank%s), job %s",
                      result.report.layers_recalibrated, result.report.batches, result.report.samples,
                      result.ranks, "" if result.ranks == 1 else "s", result.job.id)
        return result

    def _batches(self, trainer):
        if self._dataloader is not None:
            return self._dataloader(trainer) if callable(self._dataloader) else self._dataloader
        loader = trainer.train_dataloader
        if loader is None:
            raise RuntimeError("recal.lightning: the trainer has no train dataloader here; give "
                               "RecalibrateBatchNorm(dataloader=...)")
        if isinstance(loader, (dict, list, tuple)):
            raise TypeError("recal.lightning: the trainer has several train dataloaders (%s); give "
                            "RecalibrateBatchNorm(dataloader=lambda trainer: ...) the one to use"
                            % type(loader).__name__)
        return loader
