"""recal.lightning (client/python/recal/lightning.py) in real Lightning Trainer.fit runs on the
CPU against the real recal-server: two DDP processes (gloo) whose train dataloaders' halves
feed one sharded job, every rank loading the same statistics, equal to the float64 reference
over the batches both ranks used; "every_n_epochs" in one process; misspelt options refused
when the callback is made.

Run by ctest (tests/python_client/CMakeLists.txt, test python_client_lightning) as
    PYTHONPATH=client/python .venv/bin/python -m unittest -v test_lightning
with RECAL_SERVER_BIN set (by hand it defaults to build/bin/recal-server).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import warnings

import lightning
import torch

import recal
import recal.lightning
import recal.torch
from test_client import Server  # the server helper (auth on, .token); puts tests/fixtures on sys.path

from test_torch_sdk import SmallNet  # noqa: E402
import reference  # noqa: E402 (tests/fixtures/reference.py: the float64 reference)

SAMPLES, BATCH, NUM_BATCHES = 32, 4, 6  # 4 batches a rank under DDP; the callback uses 3 of each


class Net(SmallNet, lightning.LightningModule):
    """test_torch_sdk's SmallNet (conv + BatchNorm2d, linear + BatchNorm1d, dropout) as a
    LightningModule: a regression on random data."""

    def training_step(self, batch, batch_index):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _dataset():
    g = torch.Generator().manual_seed(7)
    return torch.utils.data.TensorDataset(torch.randn(SAMPLES, 3, 8, 8, generator=g) * 3 + 1,
                                          torch.randn(SAMPLES, 6, generator=g))


def _trainer(callback, **kwargs):
    return lightning.Trainer(accelerator="cpu", callbacks=[callback], logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, **kwargs)


def _bn_state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if k.endswith("running_mean") or k.endswith("running_var")}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LightningTest(unittest.TestCase):
    """One server (one CPU worker) for the class."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="recal-lightning-")
        os.makedirs(os.path.join(cls.tmp, "root"))  # client streams read no data root
        cls.server = Server(os.path.join(cls.tmp, "data"), (os.path.join(cls.tmp, "root"),))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def jobs(self):
        with recal.Client(self.server.address, token=self.server.token) as client:
            return client.list()

    def test_ddp_fit_two_ranks_feed_one_job_and_load_the_reference_statistics(self):
        """Trainer.fit under DDP, two processes launched as a cluster launcher would (LOCAL_RANK
        set: Lightning starts none itself), gloo on loopback."""
        before = len(self.jobs())
        port = _free_port()
        procs = []
        for rank in range(2):
            out = os.path.join(self.tmp, "rank%d.pt" % rank)
            env = dict(os.environ, LOCAL_RANK=str(rank), NODE_RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", RECAL_SERVER=self.server.address,
                       RECAL_TOKEN=self.server.token)
            procs.append((out, subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank", out], env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        outputs = []
        for out, proc in procs:
            try:
                text, _ = proc.communicate(timeout=240)
            finally:
                proc.kill()
            self.assertEqual(proc.returncode, 0, text)
            outputs.append(torch.load(out))
        jobs = self.jobs()
        self.assertEqual(len(jobs), before + 1)  # one job for both ranks
        self.assertEqual(jobs[0].spec.shards, 2)
        for got in outputs:
            self.assertEqual((got["job"], got["ranks"], got["batches"], got["samples"]),
                             (jobs[0].id, 2, NUM_BATCHES, NUM_BATCHES * BATCH))
            for key, value in got["state"].items():  # the same model on both ranks
                self.assertTrue(torch.equal(value, outputs[0]["state"][key]), key)
        # The reference: the trained weights in float64 over the batches each rank's
        # DistributedSampler gave it (shuffled: Lightning shuffles training data), 3 of each.
        batches = [(x.double(),) for got in outputs for x in got["inputs"]]
        self.assertEqual(len(batches), NUM_BATCHES)
        self.assertFalse(torch.equal(outputs[0]["inputs"][0], outputs[1]["inputs"][0]))  # each its own half
        model64 = Net()
        model64.load_state_dict(outputs[0]["state"])
        ref = reference.reference_all(model64.double(), batches)[0]["population"]
        worst = reference.worst_error(_bn_state_of(outputs[0]["state"]), ref, 1e-5)
        self.assertLessEqual(worst, 1.0)
        sys.stderr.write("[worst error against the reference: %.3f x 1e-05] " % worst)

    def test_every_n_epochs_recalibrates_at_those_epochs(self):
        before = len(self.jobs())
        callback = recal.lightning.RecalibrateBatchNorm(num_batches=3, when="every_n_epochs", every_n_epochs=2,
                                                        server=self.server.address, token=self.server.token,
                                                        bar=False)
        seen = []
        original = callback.recalibrate
        callback.recalibrate = lambda trainer, module: seen.append(trainer.current_epoch) or original(trainer, module)
        torch.manual_seed(0)
        model = Net()
        loader = torch.utils.data.DataLoader(_dataset(), batch_size=BATCH)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on num_workers and the like
            _trainer(callback, max_epochs=5, devices=1).fit(model, loader)
        self.assertEqual(seen, [1, 3])
        self.assertEqual(len(self.jobs()), before + 2)
        result = callback.last_result
        self.assertEqual((result.report.batches, result.ranks, result.export), (3, 1, "export"))
        for key, value in _bn_state(model).items():  # what the last job computed, loaded in place
            self.assertIn(key, result.buffers)
            self.assertTrue(torch.isfinite(value).all(), key)

    def test_misspelt_options_are_refused_when_the_callback_is_made(self):
        with self.assertRaisesRegex(TypeError, "'estimater'; did you mean 'estimator'"):
            recal.lightning.RecalibrateBatchNorm(estimater="population")
        with self.assertRaisesRegex(TypeError, "'fit-end'; did you mean 'fit_end'"):
            recal.lightning.RecalibrateBatchNorm(when="fit-end")
        with self.assertRaisesRegex(TypeError, "'every_n_epoch'; did you mean 'every_n_epochs'"):
            recal.lightning.RecalibrateBatchNorm(every_n_epoch=2)


def _bn_state_of(state):
    return {k: v for k, v in state.items() if k.endswith("running_mean") or k.endswith("running_var")}


def _rank_main(out):
    """One DDP rank: Trainer.fit with the callback at fit end; saves the model's state and
    what the callback did."""
    torch.manual_seed(0)
    model = Net()
    callback = recal.lightning.RecalibrateBatchNorm(num_batches=NUM_BATCHES, bar=False)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(callback, max_epochs=2, devices=2, strategy="ddp")
        trainer.fit(model, loader)
    result = callback.last_result
    # The batches the callback used: the train dataloader's first ones, which its sampler
    # (set to the last epoch) gives again in the same order.
    inputs = [x for (x, _), _ in zip(trainer.train_dataloader, range(NUM_BATCHES // 2))]
    torch.save({"inputs": inputs, "state": {k: v.clone() for k, v in model.state_dict().items()}, "job": result.job.id,
                "ranks": result.ranks, "batches": result.batches, "samples": result.report.samples}, out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        _rank_main(sys.argv[2])
    else:
        unittest.main(verbosity=2)
