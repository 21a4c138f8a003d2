"""recal.torch (client/python/recal/torch.py) and the installable package against the real
recal-server: eager models recalibrated in place against the independent float64 reference
(tests/fixtures/reference.py), exported with torch.export by default (PT2 archives, any batch
size) and with torch.jit.script / trace when export fails, given ScriptModules and
ExportedPrograms, positional / keyword / two-input batches, two processes under
torch.distributed, the PreciseBN hook and do_precise_bn, failures, `pip install` into a fresh
virtualenv, and the README's training-loop example.

Run by ctest (tests/python_client/CMakeLists.txt, test python_client_torch) as
    PYTHONPATH=client/python .venv/bin/python -m unittest -v test_torch_sdk
with RECAL_SERVER_BIN set (by hand it defaults to build/bin/recal-server).
"""

import contextlib
import copy
import datetime
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types
import unittest
import warnings
from unittest import mock

import grpc
import torch
import torchvision

import recal
import recal.torch
from recal import recal_pb2
from test_client import ROOT, Server, _unused_port  # the server helper (auth on, .token); puts tests/fixtures on sys.path

import reference  # noqa: E402 (tests/fixtures/reference.py: the float64 reference)

RTOL = 1e-5
RECALCTL_BIN = os.environ.get("RECALCTL_BIN", os.path.join(ROOT, "build", "bin", "recalctl"))


@contextlib.contextmanager
def _tqdm_as(module):
    """sys.modules["tqdm"] replaced by `module` (None: "not installed") for the block, and
    nothing else touched. mock.patch.dict(sys.modules, ...) would restore the whole dict on
    exit, dropping every module imported in the block: a first torch.export in it imports
    torch._inductor, whose second import then fails ("Artifact of type=autotune already
    registered"), so every later export in the process falls back to script."""
    saved = sys.modules.get("tqdm", _NOT_IMPORTED)
    sys.modules["tqdm"] = module
    try:
        yield
    finally:
        if saved is _NOT_IMPORTED:
            del sys.modules["tqdm"]
        else:
            sys.modules["tqdm"] = saved


_NOT_IMPORTED = object()


def _bn_state(model):
    """{running_mean / running_var key: tensor} of every BatchNorm of an eager model."""
    keys = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            prefix = name + "." if name else ""
            keys.update((prefix + "running_mean", prefix + "running_var"))
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k in keys}


def _reference(model, batches, estimator="population"):
    """The float64 reference: a float64 copy of `model` run on float64 inputs (uint8 inputs
    as they are: the models convert them), every BatchNorm normalising by its batch's
    statistics, computed and merged exactly in float64."""
    model64 = copy.deepcopy(model).double()
    inputs = [tuple(x.double() if x.is_floating_point() else x for x in batch) for batch in batches]
    return reference.reference_all(model64, inputs)[0][estimator]


def _flags(model):
    return [m.training for m in model.modules()]


def _other_state(model):
    """Everything in the state_dict but the running statistics."""
    bn = set(_bn_state(model))
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k not in bn}


class SmallNet(torch.nn.Module):
    """Conv + BatchNorm2d, linear + BatchNorm1d, dropout: a fast model for most tests."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 6)
        self.bn1d = torch.nn.BatchNorm1d(6)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.drop(self.bn1d(self.fc(x)))


class TwoInputs(torch.nn.Module):
    """forward(image, extra): uint8 images (converted and scaled inside) and float16 features."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(5, 4)
        self.bn1d = torch.nn.BatchNorm1d(4)

    def forward(self, image, extra):
        x = self.bn(self.conv(image.to(self.conv.weight.dtype) / 255.0)).mean(dim=(2, 3))
        return x + self.bn1d(self.fc(extra.to(self.fc.weight.dtype)))


class KeywordNet(torch.nn.Module):
    """forward(pixels, depth): fed from dict batches by keyword."""

    def __init__(self):
        super().__init__()
        self.rgb = torch.nn.Conv2d(3, 4, 1)
        self.bn_rgb = torch.nn.BatchNorm2d(4)
        self.d = torch.nn.Conv2d(1, 4, 1)
        self.bn_d = torch.nn.BatchNorm2d(4)

    def forward(self, pixels, depth):
        return self.bn_rgb(self.rgb(pixels)) * 2 + self.bn_d(self.d(depth))


class DataDependent(SmallNet):
    """A branch on the values in the batch: TorchScript compiles it, torch.export cannot
    capture it."""

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        if bool(x.mean() > 0.25):
            x = x * 2
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.drop(self.bn1d(self.fc(x)))


class ExportAndScriptFail(SmallNet):
    """Neither torch.export (a branch on the values) nor TorchScript (super()) takes it;
    the trace keeps the branch, which every batch takes."""

    def forward(self, x):
        if bool(x.abs().sum() >= 0):
            return super().forward(x)
        return x


class ConvNet(torch.nn.Module):
    """BatchNorm2d only (a batch of one sample still has 100 values per channel)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(6)
        self.conv2 = torch.nn.Conv2d(6, 4, 3)
        self.bn2 = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))


def _small_batches(seed, sizes):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 3, 12, 12, generator=g) * 2 + 0.5, torch.zeros(n, dtype=torch.long)) for n in sizes]


def _seeded(cls, seed=0):
    torch.manual_seed(seed)
    model = cls()
    with torch.no_grad():  # old statistics that are not the defaults
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return model


class ImageNetSized(torch.nn.Module):
    """Shallow (exact in float32) but fed ImageNet-sized inputs: a wide strided stem, two
    BatchNorm2d and a BatchNorm1d after pooling."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 8, stride=8)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.bn3 = torch.nn.BatchNorm1d(16)

    def forward(self, x):
        x = self.bn2(self.conv(torch.relu(self.bn1(self.stem(x)))))
        return self.bn3(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class _TransformedImages(torch.utils.data.Dataset):
    """uint8 images through a torchvision transform, with labels."""

    def __init__(self, images, transform):
        self.images, self.transform = images, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), i % 10


class _PushSpy:
    """Stands in for client.stub.PushBatches and records every pushed input's dtype and size."""

    def __init__(self, inner):
        self.inner, self.inputs = inner, []

    def future(self, requests, metadata=None):
        def spy():
            for message in requests:
                self.inputs.extend((t.dtype, list(t.shape), len(t.data)) for t in message.inputs)
                yield message

        return self.inner.future(spy(), metadata=metadata)


class TorchSdkTest(unittest.TestCase):
    """One server (one CPU worker) for the class."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="recal-torch-sdk-")
        os.makedirs(os.path.join(cls.tmp, "root"))  # client streams read no data root
        cls.server = Server(os.path.join(cls.tmp, "data"), (os.path.join(cls.tmp, "root"),))
        cls.options = dict(server=cls.server.address, token=cls.server.token)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assertMatchesReference(self, model, ref, rtol=RTOL):
        worst = reference.worst_error(_bn_state(model), ref, rtol)
        self.assertLessEqual(worst, 1.0, "worst error %.3f x rtol %g" % (worst, rtol))
        sys.stderr.write("[worst error against the reference: %.3f x %g] " % (worst, rtol))
        return worst

    # ------------------------------------------------------------------- eager models

    def test_resnet18_from_a_dataloader_in_place_matches_the_float64_reference(self):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10)
        model.train()
        model.layer3.eval()  # a mixed state, which must survive
        images = torch.randint(0, 256, (13, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        transform = torchvision.transforms.Compose([
            torchvision.transforms.ConvertImageDtype(torch.float32),
            torchvision.transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        loader = torch.utils.data.DataLoader(_TransformedImages(images, transform), batch_size=4,
                                             drop_last=False)
        batches = [(x,) for x, _ in loader]
        self.assertEqual([b[0].shape[0] for b in batches], [4, 4, 4, 1])  # a last batch of one
        original = copy.deepcopy(model)
        flags, other, old = _flags(model), _other_state(model), _bn_state(model)

        bar = types.SimpleNamespace(bars=[])

        class FakeTqdm:  # tqdm is not installed here: the bar's code path with a stand-in
            def __init__(self, total, **kwargs):
                self.total, self.n, self.closed = total, 0, False
                bar.bars.append(self)

            def update(self, n):
                self.n += n

            def close(self):
                self.closed = True

        seen = []
        with _tqdm_as(types.SimpleNamespace(tqdm=FakeTqdm)), \
                self.assertWarns(recal.torch.ShortDataWarning):
            result = recal.torch.recalibrate(model, loader, progress=seen.append, **self.options)

        # torch.export by default (a PT2 archive, the batch dimension dynamic: batches of 4
        # and a last one of 1 through one program).
        self.assertEqual((result.export, result.export_error), ("export", ""))
        self.assertEqual(result.report.model_format, "exported_program")
        self.assertEqual((result.batches, result.num_batches, result.short_data), (4, 200, True))
        self.assertEqual((result.report.batches, result.report.samples), (4, 13))
        self.assertEqual(result.job.state, recal.SUCCEEDED)
        self.assertEqual(len(result.buffers), 40)  # 20 BatchNorm2d layers, mean and var
        self.assertEqual(seen[-1].batches_done, 4)
        self.assertEqual([(b.n, b.closed) for b in bar.bars], [(4, True)])
        # In place, against the reference; nothing else moved.
        ref = _reference(original, batches)
        self.assertMatchesReference(model, ref)
        self.assertEqual(_flags(model), flags)
        self.assertEqual(next(model.parameters()).device.type, "cpu")
        for key, value in _other_state(model).items():
            self.assertTrue(torch.equal(value, other[key]), key)
        self.assertFalse(torch.equal(_bn_state(model)["bn1.running_mean"], old["bn1.running_mean"]))
        # Control: without the one-sample batch the reference is off by more than the tolerance.
        short = _reference(original, batches[:3])
        self.assertGreater(reference.worst_error(_bn_state(model), short, RTOL), 1.0)

    def test_a_train_mode_efficientnet_with_stochastic_depth_matches_the_float64_reference(self):
        # Exported in train mode, the program holds EfficientNet's stochastic depth (random
        # masks); under the default modules=eval the server runs it as eval mode does. Float64:
        # a deep random-init network is chaotic in float32.
        torch.manual_seed(0)
        model = torchvision.models.efficientnet_b0(num_classes=10).double().train()
        data = torch.randn(10, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=4)
        original = copy.deepcopy(model)
        result = recal.torch.recalibrate(model, loader, num_batches=3, **self.options)
        self.assertEqual((result.export, result.report.batches), ("export", 3))
        self.assertMatchesReference(model, _reference(original, [(x,) for (x,) in loader]))
        self.assertTrue(all(m.training for m in model.modules()))

    # ------------------------------------------------------------- quantization-aware models

    def _qat_family(self, family):
        """(model, its DataLoader, the batches) of a quantization-aware fixture family."""
        import models  # tests/fixtures/models.py

        model, _ = models.build(family)
        inputs, batch_size = models.make_data(family)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs[0]), batch_size=batch_size)
        return model, loader, [(x,) for (x,) in loader]

    def _qat_state(self, model, family):
        """({BatchNorm statistics key: tensor}, {every other buffer: tensor}) of the model."""
        import models

        keys = set(models.bn_state_keys(model, family))
        buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        return ({k: v for k, v in buffers.items() if k in keys},
                {k: v for k, v in buffers.items() if k not in keys})

    def test_a_pt2e_qat_graphmodule_is_exported_as_it_is_its_quantizers_held(self):
        # torchao's prepare_qat_pt2e gives a GraphModule whose train() / eval() torch refuses:
        # exported as it is, its fused quantizers stay in the program, run frozen.
        model, loader, batches = self._qat_family("qat_pt2e")
        ref = reference.reference_all(copy.deepcopy(model), batches)[0]["population"]
        _, observers = self._qat_state(model, "qat_pt2e")
        result = recal.torch.recalibrate(model, loader, **self.options)
        self.assertEqual((result.export, result.export_error), ("export", ""))
        self.assertGreater(result.report.quantizers.count, 0)
        self.assertEqual(result.report.quantizers.observers_frozen, result.report.quantizers.count)
        statistics, others = self._qat_state(model, "qat_pt2e")
        self.assertLessEqual(reference.worst_error(statistics, ref, RTOL), 1.0)
        for key, value in observers.items():  # scales, zero points, ranges: as they were
            self.assertTrue(torch.equal(others[key], value), key)

    def test_iterations_run_a_job_per_pass_on_the_statistics_of_the_pass_before(self):
        model, loader, batches = self._qat_family("qat_fx")
        two = reference.reference_passes(copy.deepcopy(model), batches, 2)
        result = recal.torch.recalibrate(model, loader, iterations=2, **self.options)
        self.assertEqual(len(result.iterations), 2)
        self.assertGreater(result.iterations[0].max_var_change, result.iterations[1].max_var_change)
        self.assertGreater(result.iterations[1].max_var_change, 0)
        self.assertIs(result.report, result.iterations[1].report)
        statistics, _ = self._qat_state(model, "qat_fx")
        self.assertLessEqual(reference.worst_error(statistics, two, RTOL), 1.0)
        with self.assertRaisesRegex(ValueError, "an iterator is read once"):
            recal.torch.recalibrate(model, iter(loader), iterations=2, **self.options)

    def test_two_inputs_through_input_fn_travel_compact_and_stop_at_num_batches(self):
        model = _seeded(TwoInputs)
        g = torch.Generator().manual_seed(2)
        data = [(torch.randint(0, 256, (6, 3, 10, 10), dtype=torch.uint8, generator=g),
                 torch.randn(6, 5, generator=g).half(), torch.zeros(6)) for _ in range(5)]
        drawn = []

        def loader():
            for batch in data:
                drawn.append(batch)
                yield batch

        original = copy.deepcopy(model)
        with recal.Client(self.server.address, token=self.server.token) as client:
            spy = _PushSpy(client.stub.PushBatches)
            client.stub.PushBatches = spy
            with warnings.catch_warnings():
                warnings.simplefilter("error", recal.torch.ShortDataWarning)
                result = recal.torch.recalibrate(model, loader(), server=client, num_batches=3,
                                                 input_fn=lambda batch: (batch[0], batch[1]))
        self.assertEqual((result.batches, result.short_data, result.report.batches), (3, False, 3))
        self.assertEqual(len(drawn), 3)  # no batch read beyond num_batches
        self.assertEqual(spy.inputs, [(recal_pb2.Tensor.UINT8, [6, 3, 10, 10], 1800),
                                      (recal_pb2.Tensor.FLOAT16, [6, 5], 60)] * 3)
        self.assertMatchesReference(model, _reference(original, [b[:2] for b in data[:3]]))

    def test_dict_batches_feed_a_keyword_forward_exported_scripted_or_traced(self):
        g = torch.Generator().manual_seed(3)
        # Keys in another order than the forward's, and one it does not take.
        data = [{"label": torch.zeros(n), "depth": torch.rand(n, 1, 6, 6, generator=g) * 3,
                 "pixels": torch.randn(n, 3, 6, 6, generator=g) + 1} for n in (5, 5, 2)]
        for export, made in (("auto", "export"), ("script", "script"), ("trace", "trace")):
            with self.subTest(export=export):
                model = _seeded(KeywordNet)
                original = copy.deepcopy(model)
                result = recal.torch.recalibrate(model, data, num_batches=3, export=export, **self.options)
                self.assertEqual((result.export, result.export_error), (made, ""))
                self.assertEqual(sorted(result.buffers), sorted(_bn_state(model)))
                ref = _reference(original, [(b["pixels"], b["depth"]) for b in data])
                self.assertMatchesReference(model, ref)

    def test_a_scriptmodule_an_exportedprogram_a_syncbatchnorm_model_and_a_trace_fallback(self):
        data = _small_batches(4, (8, 8, 3))
        # SyncBatchNorm (no process group here, CPU) is exported as plain BatchNorm.
        plain = _seeded(SmallNet)  # its twin for the reference (SyncBatchNorm needs CUDA to run)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain)).train()
        result = recal.torch.recalibrate(model, data, num_batches=3, **self.options)
        self.assertEqual(result.export, "export")
        self.assertIsInstance(model.bn, torch.nn.SyncBatchNorm)
        self.assertEqual(len(result.buffers), 4)
        self.assertMatchesReference(model, _reference(plain, [(x,) for x, _ in data]))

        # A ScriptModule is sent as it is.
        eager = _seeded(SmallNet).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
            scripted = torch.jit.script(copy.deepcopy(eager))
        result = recal.torch.recalibrate(scripted, data, num_batches=3, **self.options)
        self.assertEqual((result.export, result.report.model_format), ("given", "torchscript"))
        got = {k: v for k, v in scripted.state_dict().items() if "running_" in k}
        self.assertLessEqual(reference.worst_error(got, _reference(eager, [(x,) for x, _ in data])), 1.0)

        # So is an ExportedProgram (exported with a dynamic batch dimension: the last batch
        # is smaller); its buffers are updated in place, as module() runs with them.
        program = torch.export.export(copy.deepcopy(eager), (data[0][0],),
                                      dynamic_shapes=({0: torch.export.Dim("batch")},))
        result = recal.torch.recalibrate(program, data, num_batches=3, **self.options)
        self.assertEqual((result.export, result.report.model_format), ("given", "exported_program"))
        got = {k: v for k, v in program.state_dict.items() if "running_" in k}
        self.assertEqual(len(got), 4)
        self.assertLessEqual(reference.worst_error(got, _reference(eager, [(x,) for x, _ in data])), 1.0)

        # A forward neither torch.export nor TorchScript takes is traced on the first batch
        # (and says why each failed).
        model = _seeded(ExportAndScriptFail)
        original = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the model's own bool()
            result = recal.torch.recalibrate(model, data, num_batches=3, **self.options)
        self.assertEqual((result.export, result.report.model_format), ("trace", "torchscript"))
        self.assertEqual([line.split(":")[0] for line in result.export_error.splitlines()
                          if line.startswith(("export:", "script:"))], ["export", "script"])
        self.assertMatchesReference(model, _reference(original, [(x,) for x, _ in data]))

    def test_export_is_the_default_and_calls_nothing_deprecated(self):
        """A model torch.export captures goes as a PT2 archive, exported in its own (train)
        mode with the old statistics and without the first batch in it: torch.jit is never
        called, and recalibrate() raises no DeprecationWarning or FutureWarning."""
        model = _seeded(SmallNet).train()
        data = _small_batches(14, (8, 8, 3))
        original = copy.deepcopy(model)
        kept = os.path.join(tempfile.mkdtemp(dir=self.tmp), "uploaded.pt2")
        upload = recal.Client.upload_model

        def keep_upload(client, path, *args, **kwargs):
            shutil.copyfile(path, kept)
            return upload(client, path, *args, **kwargs)

        jit = {name: mock.Mock(side_effect=AssertionError("torch.jit.%s called" % name))
               for name in ("script", "trace", "save", "load")}
        with mock.patch.multiple(torch.jit, **jit), \
                mock.patch.object(recal.Client, "upload_model", keep_upload), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = recal.torch.recalibrate(model, data, num_batches=3, **self.options)
        deprecated = [(w.category.__name__, str(w.message), w.filename) for w in caught
                      if issubclass(w.category, (DeprecationWarning, FutureWarning))]
        self.assertEqual(deprecated, [])
        self.assertEqual((result.export, result.export_error, result.report.model_format),
                         ("export", "", "exported_program"))
        self.assertMatchesReference(model, _reference(original, [(x,) for x, _ in data]))
        self.assertTrue(model.training)

        program = torch.export.load(kept)
        self.assertIsNone(program.example_inputs)  # the first batch is not in the archive
        for key, value in original.state_dict().items():  # exporting changed no buffer
            self.assertTrue(torch.equal(program.state_dict[key], value), key)
        modes = [node.args[5] for node in program.graph.nodes if node.target == torch.ops.aten.batch_norm.default]
        self.assertEqual(modes, [True, True])  # BatchNorm in train mode, as the model
        (batch,) = program.range_constraints.values()
        self.assertEqual(batch.lower, 1)

    def test_a_model_torch_export_cannot_capture_is_scripted_and_says_why(self):
        model = _seeded(DataDependent).train()
        data = _small_batches(15, (8, 8, 3))
        original = copy.deepcopy(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = recal.torch.recalibrate(model, data, num_batches=3, **self.options)
        self.assertEqual((result.export, result.report.model_format), ("script", "torchscript"))
        self.assertRegex(result.export_error, r"^export: GuardOnDataDependentSymNode: .*data-dependent")
        self.assertNotIn("script:", result.export_error)
        # No deprecation warning from Recal's own torch.jit calls.
        self.assertEqual([str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))], [])
        self.assertMatchesReference(model, _reference(original, [(x,) for x, _ in data]))

        # export="export" alone: a clear error, nothing sent, the model as it was.
        before = copy.deepcopy(model.state_dict())
        with self.assertRaisesRegex(RuntimeError, r"torch\.export could not capture the model \(export='export'\)"
                                                  r": GuardOnDataDependentSymNode") as failed:
            recal.torch.recalibrate(model, data, num_batches=3, export="export", **self.options)
        self.assertIn("export='auto'", str(failed.exception))
        for key, value in model.state_dict().items():
            self.assertTrue(torch.equal(value, before[key]), key)
        with self.assertRaisesRegex(ValueError, "export must be 'auto', 'export', 'script' or 'trace'"):
            recal.torch.recalibrate(model, data, export="jit", **self.options)

    def test_one_exported_program_takes_every_batch_size_a_first_batch_of_one_included(self):
        """The batch dimension is dynamic: a first batch of one sample (export specialises a
        size of 1, so it is given twice), larger batches after it and a last partial one go
        through the one PT2 archive."""
        model = _seeded(ConvNet).train()
        g = torch.Generator().manual_seed(16)
        data = [torch.randn(n, 3, 10, 10, generator=g) * 1.5 - 0.5 for n in (1, 6, 6, 4)]
        original = copy.deepcopy(model)
        result = recal.torch.recalibrate(model, data, num_batches=4, **self.options)
        self.assertEqual((result.export, result.report.model_format), ("export", "exported_program"))
        self.assertEqual((result.report.batches, result.report.samples), (4, 17))
        self.assertMatchesReference(model, _reference(original, [(x,) for x in data]))

    def test_batches_of_another_resolution_than_the_export_fail_naming_the_input_and_dimension(self):
        """The program is exported from the first batch: its height and width are fixed there.
        A convolution would run a later batch of another size, measuring statistics at a
        resolution the model was not exported for; the job fails instead, saying what the
        batch gives, what the program takes and what to change."""
        model = _seeded(ConvNet)
        before = copy.deepcopy(model.state_dict())
        with self.assertRaises(recal.RecalError) as failed:
            recal.torch.recalibrate(model, [torch.randn(4, 3, 12, 12), torch.randn(4, 3, 16, 16)], **self.options)
        self.assertEqual(failed.exception.job.state, recal.FAILED)
        self.assertEqual(failed.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        for says in ("batch 1: input 'x' dim 2 is 16, but the program was exported for exactly 12",
                     "the data gives 4x3x16x16 float32", "dynamic_shapes"):
            self.assertIn(says, failed.exception.message)
        for key, value in model.state_dict().items():
            self.assertTrue(torch.equal(value, before[key]), key)

    def test_the_job_may_stop_before_the_data_does(self):
        """target_rel_error met after 10 batches: the server takes no more, pushing stops (the
        loader is read only as far as the job takes batches: back-pressure), no short-data
        warning, and the statistics of the batches used are loaded."""
        model = _seeded(SmallNet)
        g = torch.Generator().manual_seed(13)
        # 1.2 MiB a batch: more than gRPC's flow-control window holds a few of.
        data = [(torch.randn(8, 3, 112, 112, generator=g) + 0.5, None) for _ in range(60)]
        drawn = []

        def loader():
            for batch in data:
                drawn.append(batch)
                yield batch

        original = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error", recal.torch.ShortDataWarning)
            result = recal.torch.recalibrate(model, loader(), num_batches=60, target_rel_error=0.9,
                                             **self.options)
        self.assertTrue(result.report.stopped_early)
        self.assertEqual(result.report.batches, 10)
        self.assertFalse(result.short_data)
        sys.stderr.write("[%d batches drawn, %d pushed] " % (len(drawn), result.batches))
        self.assertLess(len(drawn), 45)  # 21-23 here: 10 used, the rest in queues and windows
        self.assertMatchesReference(model, _reference(original, [(x,) for x, _ in data[:10]]))

    # ------------------------------------------------------------- a user's first hour

    def test_server_and_token_from_the_environment_and_progress_logged_without_tqdm(self):
        """No server= nor token=: RECAL_SERVER and RECAL_TOKEN (auth is on, so the token was
        sent). No tqdm: the progress goes to the "recal" loggers (batches, samples/s)."""
        model = _seeded(SmallNet)
        env = {"RECAL_SERVER": self.server.address, "RECAL_TOKEN": self.server.token}
        with mock.patch.dict(os.environ, env), _tqdm_as(None), \
                self.assertLogs("recal", "INFO") as logs:
            result = recal.torch.recalibrate(model, _small_batches(3, (4, 4, 4)), num_batches=3)
        self.assertEqual(result.job.state, recal.SUCCEEDED)
        lines = [r.getMessage() for r in logs.records if r.getMessage().startswith("recal: batch")]
        self.assertTrue(lines, [r.getMessage() for r in logs.records])
        self.assertRegex(lines[-1], r"^recal: batch 3/3, 12 samples, \d+\.\d samples/s$")
        self.assertEqual({r.name for r in logs.records if r.getMessage() in lines}, {"recal.torch"})

    def test_progress_lines_follow_logging_levels_and_bar_false(self):
        """INFO: the first batch at once, the last one when the job ends (the rest at most
        every 5 s); the "recal" logger at WARNING, or bar=False: no line."""
        progress = [recal_pb2.JobProgress(batches_done=i, batches_total=3, samples_done=4 * i,
                                          samples_per_second=10.0) for i in (1, 2, 3)]
        package = logging.getLogger("recal")
        lines = []
        collect = logging.Handler()
        collect.emit = lambda record: lines.append(record.getMessage())
        package.addHandler(collect)
        self.addCleanup(package.removeHandler, collect)
        self.addCleanup(package.setLevel, package.level)
        got = {}
        with _tqdm_as(None):
            for level, bar in ((logging.INFO, None), (logging.WARNING, None), (logging.INFO, False)):
                package.setLevel(level)
                del lines[:]
                handle, close = recal.torch._progress_handler(None, bar, 3)
                for p in progress:
                    handle(p)
                close()
                got[(logging.getLevelName(level), bar)] = list(lines)
        self.assertEqual(got, {("INFO", None): ["recal: batch 1/3, 4 samples, 10.0 samples/s",
                                                "recal: batch 3/3, 12 samples, 10.0 samples/s"],
                               ("WARNING", None): [], ("INFO", False): []})

    def test_progress_lines_show_on_stderr_when_logging_is_not_configured(self):
        code = ("import sys\n"
                "sys.modules['tqdm'] = None  # not installed\n"
                "import recal.torch\n"
                "handle, close = recal.torch._progress_handler(None, None, 2)\n"
                "handle(recal.recal_pb2.JobProgress(batches_done=2, batches_total=2, samples_done=8,\n"
                "                                   samples_per_second=4.0))\n"
                "close()\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "recal: batch 2/2, 8 samples, 4.0 samples/s\n")

    def test_a_job_queued_behind_a_busy_worker_logs_why_it_waits_once(self):
        """The class's one worker held by a client_stream job nobody feeds: the SDK's job
        waits, and says why once (Job.wait.reason), then runs once the worker is free."""
        client = recal.Client(self.server.address, token=self.server.token)
        self.addCleanup(client.close)
        path = os.path.join(self.tmp, "busy.pt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
            torch.jit.script(SmallNet().eval()).save(path)
        busy = client.submit(client.upload_model(path), recal_pb2.ClientStreamSource(), batch_size=4)
        deadline = time.monotonic() + 60
        while client.get(busy).state != recal.RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)
        # The worker is freed once the SDK has said its job waits (not after a fixed time, which
        # a slow server, e.g. a sanitizer build, may pass before the job is even submitted),
        # or after 120 s whatever happens.
        freed = threading.Event()

        def free_worker():
            if not freed.is_set():
                freed.set()
                client.cancel(busy)

        class FreeOnWait(logging.Handler):
            def emit(self, record):
                if "waits" in record.getMessage():
                    threading.Thread(target=free_worker).start()

        backstop = threading.Timer(120.0, free_worker)
        backstop.start()
        self.addCleanup(backstop.cancel)
        with _tqdm_as(None), self.assertLogs("recal.torch", "INFO") as logs:
            logging.getLogger("recal.torch").addHandler(FreeOnWait())
            result = recal.torch.recalibrate(_seeded(SmallNet), _small_batches(3, (4, 4)), num_batches=2,
                                             **self.options)
        self.assertEqual(result.job.state, recal.SUCCEEDED)
        waits = [r.getMessage() for r in logs.records if "waits" in r.getMessage()]
        self.assertEqual(waits, ["recal: the job waits: it is next in line (1 job runs now): the next worker "
                                 "that is free takes it"])

    def test_the_wait_is_logged_once_and_not_for_the_moment_before_a_claim(self):
        log_wait = recal.torch._wait_logger()
        with self.assertLogs("recal.torch", "INFO") as logs:
            log_wait(recal_pb2.JobWait(cause=recal_pb2.JobWait.STARTING, reason="starting"))
            log_wait(recal_pb2.JobWait(cause=recal_pb2.JobWait.NO_WORKER, reason="no worker"))
            log_wait(recal_pb2.JobWait(cause=recal_pb2.JobWait.JOBS_AHEAD, reason="2 ahead"))
        self.assertEqual([r.getMessage() for r in logs.records], ["recal: the job waits: no worker"])

    def test_failures_leave_the_model_untouched(self):
        class FailsOnSmallBatches(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 4, 1)
                self.bn = torch.nn.BatchNorm2d(4)

            def forward(self, x):
                if x.shape[0] < 4:
                    raise RuntimeError("batch too small")
                return self.bn(self.conv(x))

        model = _seeded(FailsOnSmallBatches)
        before = copy.deepcopy(model.state_dict())
        with self.assertRaises(recal.RecalError) as failed:
            recal.torch.recalibrate(model, _small_batches(5, (4, 2)), **self.options)
        self.assertIsNotNone(failed.exception.job)
        self.assertEqual(failed.exception.job.state, recal.FAILED)
        self.assertIn("forward failed on batch 1", failed.exception.message)  # the second, of 2
        for key, value in model.state_dict().items():
            self.assertTrue(torch.equal(value, before[key]), key)
        # (torch.export found that guard, x.shape[0] >= 4, against any batch size: scripted.)

        # The same from a PT2 archive: the second batch's width does not fit the Linear
        # before the last BatchNorm, which the program's input contract says first.
        class FixedWidth(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3 * 4 * 4, 6)
                self.bn = torch.nn.BatchNorm1d(6)

            def forward(self, x):
                return self.bn(self.fc(x.flatten(1)))

        model = _seeded(FixedWidth)
        before = copy.deepcopy(model.state_dict())
        with self.assertRaises(recal.RecalError) as failed:
            recal.torch.recalibrate(model, [torch.randn(4, 3, 4, 4), torch.randn(4, 3, 5, 5)], **self.options)
        self.assertEqual(failed.exception.job.state, recal.FAILED)
        self.assertIn("batch 1: input 'x' dim 2 is 5, but the program was exported for exactly 4", failed.exception.message)
        for key, value in model.state_dict().items():
            self.assertTrue(torch.equal(value, before[key]), key)
        # Inputs the API cannot carry are refused before anything is sent.
        with self.assertRaisesRegex(TypeError, "int64"):
            recal.torch.recalibrate(model, [torch.zeros(2, 3, 4, 4, dtype=torch.long)], **self.options)
        with self.assertRaisesRegex(ValueError, "no batches"):
            recal.torch.recalibrate(model, [], **self.options)
        with self.assertRaisesRegex(TypeError, "max_batches"):
            recal.torch.recalibrate(model, [torch.zeros(2, 3, 4, 4)], max_batches=3, **self.options)

    # ------------------------------------------------------------------------ drop-ins

    def test_precise_bn_hook_in_a_trainer_loop(self):
        model = _seeded(SmallNet).train()
        loader = _small_batches(6, (8, 8, 8))
        hook = recal.torch.PreciseBN(4, model, loader, 2, **self.options)
        trainer = types.SimpleNamespace(iter=0, max_iter=6)
        hook.trainer = trainer  # what detectron2's register_hooks does
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train = _small_batches(7, (8,) * 6)
        runs = []
        # The hook keeps one iterator: batches 0, 1, then 2 and (restarted) 0.
        expected = [[loader[0], loader[1]], [loader[2], loader[0]]]
        for trainer.iter in range(trainer.max_iter):
            x, _ = train[trainer.iter]
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            snapshot, previous = copy.deepcopy(model), hook.last_result
            hook.after_step()
            if hook.last_result is not previous:
                ref = _reference(snapshot, [(b[0],) for b in expected[len(runs)]])
                self.assertMatchesReference(model, ref)
                self.assertTrue(model.training)
                runs.append(trainer.iter)
        self.assertEqual(runs, [3, 5])  # at the period (iteration 4) and after the last one

        frozen = _seeded(SmallNet).eval()  # no BatchNorm in train mode: disabled, as detectron2's
        self.assertIsNone(recal.torch.PreciseBN(1, frozen, loader, 2, **self.options).update_stats())

    def test_do_precise_bn_reproduces_paddlevideos_batch_average(self):
        model = _seeded(SmallNet).train()
        data = _small_batches(8, (8, 6, 4))
        original = copy.deepcopy(model)
        result = recal.torch.do_precise_bn(model, data, 3, **self.options)
        self.assertEqual(result.report.estimator, recal.report_pb2.BATCH_AVERAGE)
        ref = _reference(original, [(x,) for x, _ in data], estimator="batch_average")
        self.assertMatchesReference(model, ref)
        population = _reference(original, [(x,) for x, _ in data])
        self.assertGreater(reference.worst_error(_bn_state(model), population, RTOL), 1.0)  # control
        self.assertIsNone(recal.torch.do_precise_bn(_seeded(SmallNet).eval(), data, 3, **self.options))

    # ----------------------------------------------------------------------- distributed

    def run_ranks(self, mode):
        """Two processes under torch.distributed (gloo on loopback, file:// init) running
        _rank_main; what each saved."""
        tmp = tempfile.mkdtemp(dir=self.tmp)
        init = os.path.join(tmp, "init")
        procs = []
        for rank in range(2):
            out = os.path.join(tmp, "rank%d.pt" % rank)
            procs.append((out, subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "rank", str(rank), "2", init,
                 self.server.address, out, mode],
                env=dict(os.environ, RECAL_TOKEN=self.server.token, GLOO_SOCKET_IFNAME="lo"),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        outputs = []
        for out, proc in procs:
            try:
                text, _ = proc.communicate(timeout=120)
            finally:
                proc.kill()
            self.assertEqual(proc.returncode, 0, text)
            outputs.append(torch.load(out))
        return outputs

    def test_two_ranks_under_torch_distributed_equal_one_process_over_the_union(self):
        outputs = self.run_ranks("ok")
        # One process over the union of the two halves.
        model = _seeded(SmallNet).train()
        union = _distributed_data()
        with self.assertWarns(recal.torch.ShortDataWarning):
            single = recal.torch.recalibrate(model, union, **self.options)
        self.assertEqual(single.batches, 5)
        self.assertMatchesReference(model, _reference(_seeded(SmallNet), [(x,) for x, _ in union]))
        for rank, got in enumerate(outputs):
            self.assertEqual((got["batches"], got["ranks"], got["short"]), (5, 2, True), rank)
            self.assertEqual(got["job"], outputs[0]["job"])  # one job for both
            for key, value in got["state"].items():
                self.assertTrue(torch.equal(value, outputs[0]["state"][key]), key)  # identical on every rank
            # equal to one process over the union, to 1e-6 relative
            worst = reference.worst_error(got["state"], _bn_state(model), 1e-6)
            self.assertLessEqual(worst, 1.0)
            sys.stderr.write("[rank %d against one process: %.3f x 1e-06] " % (rank, worst))
            for key, value in _other_state(model).items():
                self.assertTrue(torch.equal(value, got["state"][key]), key)

    def test_a_rank_whose_data_fails_stops_every_rank_and_the_job(self):
        outputs = self.run_ranks("fail")
        self.assertEqual(outputs[0]["error"], "RuntimeError: recal.torch: rank 1: ValueError: broken loader")
        self.assertEqual(outputs[1]["error"],
                         "RuntimeError: recal.torch: stopped by rank 0: rank 1: ValueError: broken loader")
        with recal.Client(self.server.address, token=self.server.token) as client:
            self.assertEqual(client.list()[0].state, recal.CANCELLED)  # the newest job

    # ------------------------------------------------------------- normalisation, client

    def test_uint8_inputs_normalised_on_the_server(self):
        model = _seeded(SmallNet)
        g = torch.Generator().manual_seed(11)
        data = [torch.randint(0, 256, (n, 3, 12, 12), dtype=torch.uint8, generator=g) for n in (6, 6, 5)]
        mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
        original = copy.deepcopy(model)
        result = recal.torch.recalibrate(model, data, num_batches=3, scale=255, mean=mean, std=std,
                                         **self.options)
        self.assertEqual(result.report.samples, 17)
        view = (1, 3, 1, 1)
        normalised = [((x.double() / 255 - torch.tensor(mean, dtype=torch.float64).view(view))
                       / torch.tensor(std, dtype=torch.float64).view(view),) for x in data]
        self.assertMatchesReference(model, _reference(original, normalised))

    def test_client_push_of_numpy_batches(self):
        import numpy as np

        eager = _seeded(SmallNet)
        path = os.path.join(tempfile.mkdtemp(dir=self.tmp), "small.pt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated
            torch.jit.save(torch.jit.script(copy.deepcopy(eager)), path)
        data = [x for x, _ in _small_batches(12, (5, 5, 2))]
        with recal.Client(self.server.address, token=self.server.token) as client:
            job = client.submit(client.upload_model(path), recal_pb2.ClientStreamSource(), batch_size=5)
            # A batch: one array, a tuple of them, or Tensor messages.
            batches = [data[0].numpy(), (data[1].numpy(),), [recal.tensor_message(data[2].numpy())]]
            self.assertEqual(client.push(job, batches), 3)
            final = client.wait(job)
            self.assertEqual(final.state, recal.SUCCEEDED, final.error.message)
            bn_path = os.path.join(os.path.dirname(path), "bn.safetensors")
            client.download(job, bn_path, "bn")
        got = recal.read_safetensors(bn_path)  # torch tensors: torch imports here
        self.assertLessEqual(reference.worst_error(got, _reference(eager, [(x,) for x in data])), 1.0)
        with self.assertRaisesRegex(TypeError, "float64"):
            recal.tensor_message(np.zeros((2, 3), dtype=np.float64))

    def test_imagenet_sized_batches_of_64_travel_in_parts_from_the_sdk_and_recalctl(self):
        # 64 x 3 x 224 x 224 float32 is 38.5 MB, the server's default message limit 8 MiB:
        # each batch goes in parts that the server joins into the same batch.
        model = _seeded(ImageNetSized)
        g = torch.Generator().manual_seed(21)
        images = torch.randn(140, 3, 224, 224, generator=g) * 1.5 + 0.25
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=64)
        batches = [(x,) for (x,) in loader]
        self.assertEqual([b[0].shape[0] for b in batches], [64, 64, 12])
        ref = _reference(model, batches)
        original = copy.deepcopy(model)

        spy = None
        real_open_push = recal.Client.open_push

        def open_push(client, *args, **kwargs):  # counts the messages of the push
            nonlocal spy
            spy = _PushSpy(client.stub.PushBatches)
            with mock.patch.object(client.stub, "PushBatches", spy):
                return real_open_push(client, *args, **kwargs)

        with mock.patch.object(recal.Client, "open_push", open_push), \
                self.assertWarns(recal.torch.ShortDataWarning):
            result = recal.torch.recalibrate(model, loader, **self.options)
        self.assertEqual((result.report.batches, result.report.samples, result.report.batch_size), (3, 140, 64))
        self.assertMatchesReference(model, ref)
        # The first two batches went in parts (a dtype and shape, then data only).
        heads = [shape for dtype, shape, _ in spy.inputs if shape]
        self.assertEqual(heads, [[64, 3, 224, 224], [64, 3, 224, 224], [12, 3, 224, 224]])
        self.assertEqual(len(spy.inputs), 2 * 5 + 1)  # in parts of 8 MiB less room for the fields; 12 fit one
        self.assertLess(max(size for _, _, size in spy.inputs), 8 << 20)

        # The same data and model through `recalctl run --stream`.
        work = tempfile.mkdtemp(dir=self.tmp)
        model_path, data_path = os.path.join(work, "model.pt2"), os.path.join(work, "images.npy")
        batch = torch.export.Dim("batch", min=2)
        torch.export.save(torch.export.export(copy.deepcopy(original).eval(), (images[:4],), dynamic_shapes=({0: batch},)),
                          model_path)
        import numpy as np
        np.save(data_path, images.numpy())
        bn_path = os.path.join(work, "bn.safetensors")
        run = subprocess.run(
            [RECALCTL_BIN, "run", model_path, "--data", "npy:" + data_path, "--stream", "--batch_size", "64",
             "-o", os.path.join(work, "out.pt2"), "--bn_out", bn_path, "--server", self.server.address,
             "--token", self.server.token],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("3/3 batches", run.stderr)
        got = recal.read_safetensors(bn_path)
        self.assertLessEqual(reference.worst_error(got, ref, RTOL), 1.0)

        # One batch of 256 (154 MB: under the default --max_batch_bytes of 256 MiB).
        big = torch.cat([images, images[:116].flip(0)])
        model = copy.deepcopy(original)
        result = recal.torch.recalibrate(model, [big], num_batches=1, **self.options)
        self.assertEqual((result.report.batches, result.report.samples), (1, 256))
        self.assertMatchesReference(model, _reference(original, [(big,)]))

    # -------------------------------------------------------------------- the package

    def test_import_recal_needs_no_torch_and_recal_torch_says_which_extra_brings_it(self):
        code = ("import sys\n"
                "class NoTorch:  # as Python finds nothing: ModuleNotFoundError naming torch\n"
                "    def find_spec(self, name, path=None, target=None):\n"
                "        if name == 'torch' or name.startswith('torch.'):\n"
                "            raise ModuleNotFoundError('No module named %r' % name, name=name)\n"
                "sys.meta_path.insert(0, NoTorch())\n"
                "import recal\n"
                "assert recal.Client and recal.tensor_message and 'torch' not in sys.modules\n"
                "for module in ('recal.torch', 'recal.lightning'):\n"
                "    try:\n"
                "        __import__(module)\n"
                "    except ImportError as e:\n"
                "        print('%s: %s' % (module, e))\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("recal.torch: recal.torch needs PyTorch, which this Python does not have: "
                      "pip install 'recal[torch]'", result.stdout)
        self.assertIn("recal.lightning: recal.torch needs PyTorch", result.stdout)
        # The extras the messages name exist, and bring what they say.
        import tomllib
        with open(os.path.join(ROOT, "client", "python", "pyproject.toml"), "rb") as f:
            extras = tomllib.load(f)["project"]["optional-dependencies"]
        self.assertTrue(any(d.startswith("torch") for d in extras["torch"]), extras)
        self.assertTrue(any(d.startswith("lightning") for d in extras["lightning"]), extras)

    def test_a_misspelt_option_is_refused_before_the_export(self):
        model = _seeded(SmallNet)
        with mock.patch.object(recal.torch, "_export", side_effect=AssertionError("exported")), \
                self.assertRaisesRegex(TypeError, "unknown recal.torch option 'estimater'; did you mean 'estimator'"):
            recal.torch.recalibrate(model, _small_batches(3, (4,)), estimater="population", **self.options)
        with self.assertRaisesRegex(TypeError, "'num_batch'; did you mean 'num_batches'"):
            recal.torch.recalibrate(model, _small_batches(3, (4,)), num_batch=2, **self.options)
        with self.assertRaisesRegex(TypeError, "'estimater'; did you mean 'estimator'"):
            recal.torch.PreciseBN(10, model, [], 2, server=self.server.address, estimater="population")

    def test_no_server_fails_before_the_export_and_shows_no_bar(self):
        """A server that is not there: UNAVAILABLE within connect_seconds, no export spent on
        it, and no progress bar sitting at 0/N meanwhile (it appears with the job's progress)."""
        bars = []

        class FakeTqdm:
            def __init__(self, total, **kwargs):
                bars.append(total)

        address = "127.0.0.1:%d" % _unused_port()
        with _tqdm_as(types.SimpleNamespace(tqdm=FakeTqdm)), \
                mock.patch.object(recal.torch, "_export", side_effect=AssertionError("exported")), \
                self.assertRaises(recal.RecalError) as caught:
            recal.torch.recalibrate(_seeded(SmallNet), _small_batches(3, (4, 4)), server=address, token="")
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("Is recal-server running there?", caught.exception.message)
        self.assertEqual(bars, [])

    def test_pip_install_into_a_fresh_virtualenv(self):
        """scripts/python-wheel.sh builds an sdist (carrying proto/, not the stubs) and from it a
        wheel (the stubs generated by grpcio-tools from PyPI), with no CMake build involved;
        the wheel installs into a fresh venv and recal.torch runs from there."""
        tmp = tempfile.mkdtemp(dir=self.tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        dist = os.path.join(tmp, "dist")
        built = subprocess.run(["bash", os.path.join(ROOT, "scripts", "python-wheel.sh"), dist],
                               capture_output=True, text=True, timeout=300,
                               env=dict(env, RECAL_PYTHON=sys.executable))
        self.assertEqual(built.returncode, 0, built.stdout + built.stderr)
        sdist, wheel = built.stdout.split()
        import tarfile
        import zipfile
        with tarfile.open(sdist) as archive:
            in_sdist = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
        for name in ("proto/recal/v1/recal.proto", "proto/recal/v1/report.proto",
                     "proto/grpc/health/v1/health.proto", "recal/torch.py", "setup.py", "pyproject.toml"):
            self.assertIn(name, in_sdist)
        self.assertFalse([n for n in in_sdist if n.startswith("recal/_proto")])  # generated at build time
        with zipfile.ZipFile(wheel) as archive:
            in_wheel = set(archive.namelist())
        for stub in ("recal/_proto/recal/v1/recal_pb2.py", "recal/_proto/recal/v1/recal_pb2_grpc.py",
                     "recal/_proto/recal/v1/report_pb2.py", "recal/_proto/grpc/health/v1/health_pb2.py",
                     "recal/_proto/grpc/health/v1/health_pb2_grpc.py", "recal/_proto/__init__.py"):
            self.assertIn(stub, in_wheel)
        self.assertFalse([n for n in in_wheel if n.startswith("proto/")])
        # A user's environment that already has torch, grpcio and protobuf, offline: a new venv
        # that sees this venv's packages (a .pth file; --system-site-packages would show the
        # base interpreter's, not this venv's), installed into by this venv's pip (--python).
        venv = os.path.join(tmp, "venv")
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(made.returncode, 0, made.stderr)
        python = os.path.join(venv, "bin", "python")
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(site, "project_venv.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")
        installed = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index",
                                    wheel], capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(installed.returncode, 0, installed.stdout + installed.stderr)
        code = ("import os, sys\n"
                "import recal\n"
                "assert 'torch' not in sys.modules\n"
                "import recal.torch, torch\n"
                "import recal.lightning\n"
                "assert recal.lightning.__file__.startswith(sys.prefix), recal.lightning.__file__\n"
                "model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))\n"
                "data = [torch.randn(4, 3, 8, 8) for _ in range(2)]\n"
                "result = recal.torch.recalibrate(model, data, server=sys.argv[1], num_batches=2,\n"
                "                                 token=os.environ['RECAL_TOKEN'], bar=False)\n"
                "print(recal.__file__)\n"
                "print(recal.recal_pb2.__file__)\n"
                "print(recal.JobState.Name(result.job.state), result.report.samples)\n")
        ran = subprocess.run([python, "-c", code, self.server.address], capture_output=True, text=True,
                             timeout=120, cwd=tmp, env=dict(env, RECAL_TOKEN=self.server.token))
        self.assertEqual(ran.returncode, 0, ran.stdout + ran.stderr)
        where, stubs, outcome = ran.stdout.split("\n")[:3]
        self.assertTrue(where.startswith(venv), where)  # the installed package, not the checkout
        self.assertTrue(stubs.startswith(venv), stubs)  # and the stubs the build generated
        self.assertEqual(outcome, "SUCCEEDED 8")

    def test_readme_training_loop_example_runs(self):
        """The training-loop example of client/python/README.md (its third Python block, also
        README.md's first, on its first screen), as written, against this server: named by
        RECAL_SERVER and RECAL_TOKEN, as the example says."""
        with open(os.path.join(ROOT, "client", "python", "README.md")) as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        with open(os.path.join(ROOT, "README.md")) as f:
            top = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        self.assertEqual(len(blocks), 3)
        example = blocks[2]
        self.assertEqual(top[0], example)
        self.assertNotIn("server=", example)  # the address comes from the environment
        self.assertLessEqual(len(example.strip().splitlines()), 4)
        result = subprocess.run([sys.executable, "-c", example],
                                cwd=self.tmp, capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, RECAL_SERVER=self.server.address, RECAL_TOKEN=self.server.token))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "export 4 batches 64 samples\n")


def _distributed_data():
    return _small_batches(10, (6, 6, 6, 6, 3))


def _rank_main(rank, world, init, address, out, mode):
    """One rank of the distributed tests: its part of the data (rank 0 the first two
    batches, rank 1 the other three), recalibrated under torch.distributed (gloo, file://
    init). mode "fail": rank 1's data raises after its first batch."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=100))
    try:
        model = _seeded(SmallNet).train()
        data = _distributed_data()
        mine = data[:2] if rank == 0 else data[2:]
        if mode == "fail" and rank == 1:
            def broken(batches):
                yield batches[0]
                raise ValueError("broken loader")

            mine = broken(mine)
        try:
            # Rank 1 names its shard; rank 0 lets torch.distributed say it.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", recal.torch.ShortDataWarning)
                result = recal.torch.recalibrate(model, mine, server=address, token=os.environ["RECAL_TOKEN"],
                                                 shard=(rank, world) if rank == 1 else None)
        except Exception as error:  # noqa: BLE001 (saved for the test to check)
            torch.save({"error": "%s: %s" % (type(error).__name__, error)}, out)
            return
        torch.save({"state": {k: v.clone() for k, v in model.state_dict().items()},
                    "batches": result.batches, "ranks": result.ranks, "short": result.short_data,
                    "job": result.job.id}, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        _rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7])
    else:
        unittest.main(verbosity=2)
