"""Whisper's audio front end as a program: waveform -> log-mel features on the MPS delegate, the
``preprocessor.pte`` executorch's Whisper example loads beside the model.

executorch's runner (``examples/models/whisper/main.cpp`` at v1.4.0, 64-100) loads it with ``Module`` and
calls ``forward`` on the audio as one float32 tensor ``[n]`` (16 kHz, mono), then hands the first output,
float32, to ``Seq2SeqRunner::transcribe`` as the features. executorch's own preprocessor
(``extension/audio/mel_spectrogram.py``, ``WhisperAudioProcessor``) is exported for XNNPACK with a
dynamic ``n``; this one computes transformers' ``WhisperFeatureExtractor`` (its torch path) for one
30-second window:

    forward(waveform: float32 [n], 1 <= n <= n_samples) -> features float32 [1, n_mels, 3000]

- CPU: the zero padding of ``n`` samples to ``n_samples`` (480000; the length is dynamic, the delegate's
  shapes static), as the extractor pads (``padding="max_length"``);
- the MPS delegate, float32: the reflection padding of ``n_fft // 2`` on both sides (``torch.stft``'s
  ``center=True``); the short-time Fourier transform as one strided convolution against a DFT basis
  (``2 x (n_fft // 2 + 1)`` kernels of ``n_fft`` taps: the periodic Hann window times the cosines and
  sines, hop 160), the power ``re^2 + im^2`` of every frame but the last; the mel filterbank as a matmul
  (the extractor's own ``mel_filters``); ``log10`` of the power clamped at 1e-10; the floor at the
  window's maximum less 8; ``(x + 4) / 4``.

Float32 throughout, as the extractor computes (a float16 power spectrum spans more than float16's range).
"""

from __future__ import annotations

import math
import pathlib

import torch

from mps_backend.export_scope import export_scope
from mps_backend.files import write_atomically
from mps_backend.partitioner import MPSPartitioner, backend_config, edge_compile_config

#: the method executorch's Whisper example calls (main.cpp: ``processor->execute("forward", audio)``)
PREPROCESSOR_METHOD = "forward"


class WhisperPreprocessor(torch.nn.Module):
    """``forward(waveform [n]) -> [1, n_mels, frames]`` (the module doc), from a ``WhisperFeatureExtractor``."""

    def __init__(self, fe):
        super().__init__()
        n_fft, hop = int(fe.n_fft), int(fe.hop_length)
        if fe.dither:
            raise ValueError(f"the feature extractor dithers ({fe.dither}): its features are random, no program computes them")
        self.n_fft, self.hop, self.n_samples, self.frames = n_fft, hop, int(fe.n_samples), int(fe.nb_max_frames)
        bins = n_fft // 2 + 1
        t = torch.arange(n_fft, dtype=torch.float64)
        window = 0.5 - 0.5 * torch.cos(2 * math.pi * t / n_fft)  # torch.hann_window(n_fft): periodic
        k = torch.arange(bins, dtype=torch.float64)[:, None]
        angle = 2 * math.pi * ((k * t) % n_fft) / n_fft  # the index product reduced first: exact angles
        basis = torch.cat([torch.cos(angle) * window, -torch.sin(angle) * window])  # [2 * bins, n_fft]
        self.register_buffer("basis", basis.to(torch.float32)[:, None, :])  # conv1d weights [2 * bins, 1, n_fft]
        self.register_buffer("mel", torch.from_numpy(fe.mel_filters).to(torch.float32).T.contiguous())  # [n_mels, bins]
        self.bins = bins

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(waveform, (0, self.n_samples - waveform.shape[0]))  # CPU: dynamic -> static
        x = torch.nn.functional.pad(x.view(1, 1, -1), (self.n_fft // 2, self.n_fft // 2), mode="reflect")
        spec = torch.nn.functional.conv1d(x, self.basis, stride=self.hop)[:, :, : self.frames]  # [1, 2 * bins, frames]
        re, im = spec[:, : self.bins], spec[:, self.bins :]
        mel = torch.matmul(self.mel, re * re + im * im)  # [1, n_mels, frames]
        log = torch.log10(torch.clamp(mel, min=1e-10))
        log = torch.maximum(log, log.amax() - 8.0)
        return (log + 4.0) / 4.0


def preprocessor_metadata(fe) -> dict:
    """The program's constant methods: what the caller must know of its input and output."""
    return {
        "sampling_rate": int(fe.sampling_rate),
        "n_samples": int(fe.n_samples),
        "feature_size": int(fe.feature_size),
        "nb_max_frames": int(fe.nb_max_frames),
    }


def export_preprocessor(fe, output: str | pathlib.Path) -> dict:
    """Write :class:`WhisperPreprocessor` of ``fe`` to ``output`` (a ``.pte``, float32 on the MPS delegate);
    returns the partitioner's counts: ``{"delegates": n, "cpu": [ops left on CPU]}``."""
    from executorch.exir import to_edge_transform_and_lower  # noqa: PLC0415

    module = WhisperPreprocessor(fe).eval()
    example = (torch.zeros(fe.n_samples // 2, dtype=torch.float32),)
    n = torch.export.Dim("samples", min=1, max=int(fe.n_samples))
    with torch.no_grad(), export_scope():
        ep = torch.export.export(module, example, dynamic_shapes=({0: n},), strict=False)
        partitioner = MPSPartitioner(use_fp16=False, dynamic_ok=True)
        edge = to_edge_transform_and_lower(
            ep, partitioner=[partitioner], constant_methods=preprocessor_metadata(fe), compile_config=edge_compile_config()
        )
        nodes = [n for n in edge.exported_program().graph.nodes if n.op == "call_function"]
        names = [getattr(n.target, "__name__", str(n.target)) for n in nodes]
        delegates = sum(name == "executorch_call_delegate" for name in names)
        # the operators left on CPU (not the delegate call, its outputs, sizes and their arithmetic)
        cpu = sorted(name for name in names if name.startswith("aten.") and "sym_size" not in name)
        program = edge.to_executorch(backend_config(edge))
    out = pathlib.Path(output)
    write_atomically(out, lambda f: program.write_to_file(f))
    return {"delegates": delegates, "cpu": cpu}
